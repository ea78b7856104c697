//! xccl as a C library: `libxccl.so` and `libxccl.a`, whose functions (declared in
//! `include/xccl.h`) are those of `xccl::capi`. See `crates/xccl-c/README.md`.

pub use xccl_core::capi::*;
