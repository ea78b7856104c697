//! Fuzz target `handshake_client`: see `xccl::fuzzing::handshake_client`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    xccl::fuzzing::handshake_client(data);
});
