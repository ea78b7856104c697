//! Which ranks share a host: each rank publishes a host key, equal exactly for processes that
//! can share memory through the same `/dev/shm` (same boot of the same machine, same tmpfs).

use std::os::unix::fs::MetadataExt;

/// This process's host key.
pub(crate) fn host_key() -> String {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let shm = std::fs::metadata("/dev/shm").map(|m| format!("{}:{}", m.dev(), m.ino())).unwrap_or_default();
    let name = rustix::system::uname().nodename().to_string_lossy().into_owned();
    format!("{}/{}/{}", name, boot.trim(), shm)
}

/// A host key given by the user (`XCCL_HOST_KEY`), made safe to store.
pub(crate) fn clean_key(k: &str) -> String {
    k.split_whitespace().collect::<Vec<_>>().join("_")
}

/// Cores this process may run on.
pub(crate) fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |c| c.get())
}

/// Numbers hosts by first appearance: `hosts[r]` is the same for ranks with equal keys.
pub(crate) fn host_indices(keys: &[String]) -> Vec<usize> {
    keys.iter().map(|k| keys.iter().position(|o| o == k).unwrap_or(0)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_keys_share_an_index() {
        let keys: Vec<String> = ["a", "b", "a", "c", "b"].iter().map(|s| s.to_string()).collect();
        assert_eq!(host_indices(&keys), vec![0, 1, 0, 3, 1]);
        assert!(!host_key().is_empty());
    }
}
