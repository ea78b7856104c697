//! Fuzz target `handshake_server`: see `xccl::fuzzing::handshake_server`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    xccl::fuzzing::handshake_server(data);
});
