//! The extension module's soname, `_xccl.abi3.so`: the native PyTorch backend (xccl/csrc/)
//! links to this file for xccl's C API, and with a soname the dynamic loader finds the copy
//! Python already loaded (the package imports it first) wherever the backend was compiled.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,_xccl.abi3.so");
}
