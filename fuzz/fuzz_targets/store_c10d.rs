//! Fuzz target `store_c10d`: see `xccl::fuzzing::store_c10d`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    xccl::fuzzing::store_c10d(data);
});
