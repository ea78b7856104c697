//! Fuzz target `store`: see `xccl::fuzzing::store`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    xccl::fuzzing::store(data);
});
