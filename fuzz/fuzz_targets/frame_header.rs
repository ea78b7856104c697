//! Fuzz target `frame_header`: see `xccl::fuzzing::frame_header`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    xccl::fuzzing::frame_header(data);
});
