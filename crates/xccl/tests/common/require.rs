//! Skipping a check whose tool is missing, visibly, and failing instead where the tool is
//! required.
//!
//! A test that needs something outside Rust (Python with PyTorch, an MPI, network
//! namespaces, a C compiler) says so through [`skip`] when it is missing. Where
//! `XCCL_REQUIRE` names that tool (`.ci/run` sets it to everything it installs), the skip is
//! a failure: a CI run cannot pass with the check silently gone.

/// The tools a test may need, as `XCCL_REQUIRE` names them (comma-separated).
pub const TOOLS: [&str; 5] = ["python", "torch", "mpi", "netns", "cc"];

/// Reports that the calling test skips a check because `tool` (one of [`TOOLS`]) is
/// missing, and why; panics instead when `XCCL_REQUIRE` names it (or says `all`).
pub fn skip(tool: &str, why: impl std::fmt::Display) {
    assert!(TOOLS.contains(&tool), "unknown tool {tool:?} (known: {TOOLS:?})");
    if required(tool) {
        panic!("{tool} is required here (XCCL_REQUIRE) but the check cannot run: {why}");
    }
    eprintln!("skipping ({tool} missing): {why}");
}

/// Whether `XCCL_REQUIRE` names `tool`; an unknown name in it fails the test that asks.
pub fn required(tool: &str) -> bool {
    let list = std::env::var("XCCL_REQUIRE").unwrap_or_default();
    list.split(',').map(str::trim).filter(|t| !t.is_empty()).any(|t| {
        assert!(
            t == "all" || TOOLS.contains(&t),
            "XCCL_REQUIRE names {t:?}, which no test knows (known: all, {})",
            TOOLS.join(", ")
        );
        t == "all" || t == tool
    })
}
