//! The shared library's soname: `libxccl.so.0` (the C API's major version), so that programs
//! linked against one 0.x release run with a later one.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libxccl.so.0");
}
