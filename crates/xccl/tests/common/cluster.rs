//! The emulated cluster of `bench/cluster.sh` from a test: network namespaces as hosts,
//! rate-limited veth links, ranks launched into them. A [`Cluster`] is removed when dropped
//! (also when the test panics); clusters of test processes that were killed are removed by
//! the next [`Cluster::up`] (the script's `gc`, which checks each cluster's owner).

use std::path::PathBuf;
use std::process::{Command, Output};

/// The repository's cluster script.
pub fn script() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../bench/cluster.sh"))
}

/// Namespaces of cluster `name` that exist now.
pub fn namespaces(name: &str) -> Vec<String> {
    let out = Command::new("ip").args(["netns", "list"]).output().map(|o| o.stdout).unwrap_or_default();
    String::from_utf8_lossy(&out)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|ns| ns.starts_with(&format!("xc-{name}-")))
        .map(str::to_string)
        .collect()
}

/// An emulated cluster, removed on drop.
pub struct Cluster {
    /// Its name (namespaces `xc-NAME-h<h>`).
    pub name: String,
}

impl Cluster {
    /// Builds cluster `name` with `args` (`--hosts 3 --rate 1gbit ...`), owned by this
    /// process. `Err` says why namespaces cannot be made here (the caller skips, saying so).
    pub fn up(name: &str, args: &[&str]) -> Result<Cluster, String> {
        if !rustix::process::geteuid().is_root() {
            return Err("not root: network namespaces need root".into());
        }
        let _ = Command::new("bash").arg(script()).arg("gc").status();
        let _ = Command::new("bash").arg(script()).args(["down", name]).status();
        let out = Command::new("bash")
            .arg(script())
            .args(["up", name, "--owner", &std::process::id().to_string()])
            .args(args)
            .output()
            .map_err(|e| format!("cannot run bash: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "bench/cluster.sh up failed (namespaces, veth or tc unavailable?): {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(Cluster { name: name.to_string() })
    }

    /// Runs `cmd` as `ranks_per_host` ranks on every host (`bench/cluster.sh launch`), with
    /// `env` added, and waits for all of them.
    pub fn launch(&self, ranks_per_host: usize, env: &[(&str, &str)], cmd: &[&str]) -> Output {
        let mut c = Command::new("bash");
        c.arg(script()).args(["launch", &self.name, "--ranks-per-host", &ranks_per_host.to_string(), "--"]);
        c.args(cmd);
        for (k, v) in env {
            c.env(k, v);
        }
        c.output().expect("bash runs")
    }

    /// Runs `args` of the script on this cluster (`link NAME H down`, ...).
    pub fn script(&self, args: &[&str]) -> Output {
        Command::new("bash").arg(script()).args(args).output().expect("bash runs")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new("bash").arg(script()).args(["down", &self.name]).status();
    }
}
