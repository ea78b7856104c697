//! Fuzz target `frame_stream`: see `xccl::fuzzing::frame_stream`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    xccl::fuzzing::frame_stream(data);
});
