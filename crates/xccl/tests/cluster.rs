//! Jobs on the emulated cluster of `bench/cluster.sh`: three "hosts" (network namespaces
//! behind one rate-limited switch) with two ranks each, shared memory inside a host and TCP
//! between hosts. The test launches this test binary itself as the ranks. Skipped, saying
//! why, where network namespaces cannot be made (not root, no `ip`/`tc`), unless
//! `XCCL_REQUIRE` names `netns`.

mod common;

use std::collections::BTreeSet;
use std::os::unix::process::CommandExt;
use std::sync::Mutex;

use common::cluster::{Cluster, namespaces};
use common::forms::*;
use common::*;
use xccl::algo::Algorithm;
use xccl::{CollKind, Communicator, DType, ReduceOp};

/// Set in the environment of the ranks the test launches: which test they run.
const CHILD: &str = "XCCL_CLUSTER_TEST";

/// One cluster at a time: each runs six ranks on this machine's cores.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn shm_files() -> BTreeSet<String> {
    std::fs::read_dir("/dev/shm")
        .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default()
}

/// Runs test `name` as 3 hosts × 2 ranks and checks that every rank passed, and that no
/// process, shared-memory segment or namespace is left behind.
fn on_cluster(name: &str, tag: &str) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let before = shm_files();
    let cname = format!("{tag}{}", std::process::id() % 100_000);
    let cluster = match Cluster::up(&cname, &["--hosts", "3", "--rate", "1gbit"]) {
        Ok(c) => c,
        Err(why) => {
            common::require::skip("netns", format!("{name}: {why}"));
            return;
        }
    };
    let exe = std::env::current_exe().unwrap();
    let out = cluster.launch(
        2,
        &[(CHILD, name), ("XCCL_TIMEOUT", "60")],
        &[exe.to_str().unwrap(), "--exact", name, "--nocapture", "--test-threads", "1"],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "the job failed ({}):\n{stdout}", out.status);
    assert_eq!(stdout.matches("rank done").count(), 6, "ranks that finished:\n{stdout}");
    // Every rank has exited (launch waited for them); nothing of theirs is left.
    let exe_name = exe.file_name().unwrap().to_string_lossy().into_owned();
    let ps = std::process::Command::new("pgrep").args(["-f", &format!("{exe_name}.*{CHILD}")]).output();
    if let Ok(ps) = ps {
        assert!(ps.stdout.is_empty(), "ranks left behind: {}", String::from_utf8_lossy(&ps.stdout));
    }
    let left: Vec<String> =
        shm_files().difference(&before).filter(|f| f.starts_with("xccl-")).cloned().collect();
    assert!(left.is_empty(), "shared-memory segments left behind: {left:?}");
    drop(cluster);
    assert!(namespaces(&cname).is_empty(), "namespaces left behind: {:?}", namespaces(&cname));
}

fn child(name: &str) -> Option<Communicator> {
    (std::env::var(CHILD).ok()? == name).then(|| Communicator::from_env().expect("join the cluster job"))
}

#[test]
fn collectives_across_three_emulated_hosts() {
    if std::env::var_os(CHILD).is_none() {
        return on_cluster("collectives_across_three_emulated_hosts", "m");
    }
    let Some(c) = child("collectives_across_three_emulated_hosts") else { return };
    assert_eq!(c.size(), 6);
    let topo = c.placement();
    let h = &topo.hosts;
    let distinct: BTreeSet<usize> = h.iter().copied().collect();
    assert!(
        distinct.len() == 3 && h[0] == h[1] && h[2] == h[3] && h[4] == h[5],
        "XCCL_HOST_KEY per namespace makes three hosts of two ranks: {h:?}"
    );
    all_reduce_forms::<f32>(&c);
    all_reduce_forms::<i64>(&c);
    reduce_forms::<f64>(&c);
    broadcast_forms::<u8>(&c);
    gather_forms::<i32>(&c);
    scatter_forms::<f32>(&c);
    reduce_scatter_forms::<xccl::bf16>(&c);
    all_to_all_forms::<u32>(&c);
    c.barrier().unwrap();
    println!("rank done");
}

#[test]
fn hierarchical_all_reduce_is_chosen_on_slow_links_and_correct() {
    if std::env::var_os(CHILD).is_none() {
        return on_cluster("hierarchical_all_reduce_is_chosen_on_slow_links_and_correct", "h");
    }
    let Some(c) = child("hierarchical_all_reduce_is_chosen_on_slow_links_and_correct") else { return };
    // The links were measured when the job started: about 1 Gbit/s, far below loopback.
    let tcp = c.config().costs.tcp;
    let gbps = 1e-9 / tcp.beta;
    assert!((0.05..0.2).contains(&gbps), "measured {gbps:.3} GB/s on 1 Gbit/s links");
    let len = 1 << 20;
    let choice = c.algorithm_for(CollKind::AllReduce, len, DType::F32, 0).unwrap();
    assert_eq!(choice.algo, Algorithm::Hierarchical, "{choice}");
    let mut v = input::<f32>(ReduceOp::Sum, c.rank(), len, 5);
    c.all_reduce(&mut v, ReduceOp::Sum).unwrap();
    assert_each(&v, |i| expected::<f32>(ReduceOp::Sum, c.size(), i, 5), "hierarchical all_reduce");
    println!("rank done");
}

/// The script removes its cluster however the command ends: on Ctrl-C or `kill`, by its
/// trap; killed with `-9`, by the next `gc`, which finds the owner gone.
#[test]
fn clusters_are_removed_when_interrupted_or_killed() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    if let Err(why) = Cluster::up(&format!("p{}", std::process::id() % 100_000), &["--hosts", "1"]) {
        common::require::skip("netns", why);
        return;
    }
    for signal in ["INT", "TERM", "KILL"] {
        // In a process group of its own: what it started in the hosts (the `sleep`s, which
        // outlive a script killed with -9) goes with the group.
        let mut run = std::process::Command::new("bash")
            .arg(common::cluster::script())
            .args(["run", "--hosts", "2", "--", "sleep", "60"])
            .process_group(0)
            .spawn()
            .unwrap();
        let name = format!("r{}", run.id());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while namespaces(&name).len() < 3 {
            assert!(std::time::Instant::now() < deadline, "the cluster never came up");
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        std::process::Command::new("kill")
            .args([&format!("-{signal}"), &run.id().to_string()])
            .status()
            .unwrap();
        run.wait().unwrap();
        if signal == "KILL" {
            assert_eq!(namespaces(&name).len(), 3, "kill -9 leaves the cluster to gc");
            std::process::Command::new("bash").arg(common::cluster::script()).arg("gc").status().unwrap();
        }
        let _ = std::process::Command::new("kill").args(["-KILL", "--", &format!("-{}", run.id())]).status();
        assert!(namespaces(&name).is_empty(), "after SIG{signal}: {:?} left", namespaces(&name));
    }
}
