//! Fuzz target `ll`: see `xccl::fuzzing::ll`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    xccl::fuzzing::ll(data);
});
