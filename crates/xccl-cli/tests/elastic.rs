//! Elastic jobs, with real processes: `xccl run --max-restarts` starts a failed job again
//! (and never after Ctrl-C), `xccl train` killed mid-run resumes from its checkpoint and
//! ends bit-identical to an uninterrupted run, under its own launcher, under `xccl run` and
//! under torchrun, and `xccl train` runs as one rank of any launcher (`xccl run`, mpirun,
//! torchrun) with the parameters of its own launch, refusing a mesh that does not match the
//! launcher's world on every rank.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

mod common;

use common::{mpirun_env, param_bits as params, run_ok as ok, text, torch_python};

const XCCL: &str = env!("CARGO_BIN_EXE_xccl");

/// A tiny model and task, so each run takes about a second.
const TINY: &[&str] =
    &["--digits", "2", "--width", "16", "--layers", "1", "--heads", "2", "--batch", "7", "--lr", "1e-3"];

/// Ten steps of data parallelism over two ranks, a checkpoint every second step.
const RUN: &[&str] = &["--steps", "10", "--checkpoint-every", "2"];

fn out_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("xccl-elastic-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// `xccl ARGS` with one compute thread per rank and a generous communication timeout.
fn xccl(args: &[&str]) -> Command {
    let mut cmd = Command::new(XCCL);
    cmd.args(args).env("XCCL_TIMEOUT", "60").env("RAYON_NUM_THREADS", "1");
    for k in ["XCCL_FAULT_KILL_AT_STEP", "XCCL_JOB_ID", "XCCL_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT"] {
        cmd.env_remove(k);
    }
    cmd
}

/// `xccl train` with the tiny model, then `args`, writing into `out`.
fn train(out: &Path, args: &[&str]) -> Command {
    let mut cmd = xccl(&["train"]);
    cmd.args(TINY).args(args).arg("--out").arg(out);
    cmd
}

/// The processes still running whose command line mentions `needle`.
fn processes_mentioning(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").expect("/proc").flatten() {
        if let Ok(cmdline) = std::fs::read(e.path().join("cmdline")) {
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if cmdline.contains(needle) && e.file_name() != std::process::id().to_string().as_str() {
                found.push(format!("{}: {cmdline}", e.file_name().to_string_lossy()));
            }
        }
    }
    found
}

/// The shared-memory segments of job `job` left in `/dev/shm`.
fn segments_of(job: &str) -> Vec<String> {
    let prefix = xccl::bootstrap::segment_prefix(job);
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&prefix))
                .collect()
        })
        .unwrap_or_default()
}

/// The reference: an uninterrupted run of [`RUN`] on two ranks.
fn uninterrupted(name: &str) -> (PathBuf, BTreeMap<String, Vec<u32>>) {
    let dir = out_dir(name);
    let mut cmd = train(&dir, &["--dp", "2"]);
    cmd.args(RUN);
    ok(&mut cmd);
    let p = params(&dir);
    (dir, p)
}

#[test]
fn a_killed_rank_restarts_the_job_which_resumes_and_ends_bit_identical() {
    let (whole, reference) = uninterrupted("whole");
    let dir = out_dir("killed");
    let job = format!("xccl-elastic-test-{}", std::process::id());
    let mut cmd = train(&dir, &["--dp", "2", "--max-restarts", "1"]);
    // Rank 1 dies by SIGKILL after step 6: the checkpoint of step 2 is committed by then
    // (the save of step 4 waited for it), maybe that of step 4.
    cmd.args(RUN).env("XCCL_FAULT_KILL_AT_STEP", "1:6").env("XCCL_JOB_ID", &job);
    let out = ok(&mut cmd);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(
        stderr.contains("rank 1 was killed by signal 9; restarting the job (attempt 2 of 2)"),
        "{}",
        text(&out)
    );
    // The survivor's communicator saw the loss and said so, naming the rank.
    assert!(stderr.contains("[0] xccl train: rank 0: ") && stderr.contains("lost rank 1"), "{}", text(&out));
    assert!(stdout.contains("[0] xccl train: attempt 2: resuming from the checkpoint"), "{}", text(&out));
    assert!(stdout.contains("final loss"), "{}", text(&out));
    assert_eq!(params(&dir), reference, "the restarted run's parameters differ from an uninterrupted run's");
    // Nothing of the job is left: no process, no shared memory.
    assert_eq!(processes_mentioning(dir.to_str().unwrap()), Vec::<String>::new());
    assert_eq!(segments_of(&job), Vec::<String>::new());

    // A restarted attempt does not take another job's checkpoint for its own: a run of 12
    // steps left one at step 12 in the directory; a new run of 10 steps dies before its
    // first checkpoint and its second attempt starts from scratch (resuming would fail:
    // step 12 is beyond --steps 10).
    let mut longer = train(&dir, &["--dp", "2", "--steps", "12", "--checkpoint-every", "4"]);
    longer.env("XCCL_JOB_ID", format!("{job}-longer"));
    ok(&mut longer);
    let mut cmd = train(&dir, &["--dp", "2", "--max-restarts", "1"]);
    cmd.args(RUN).env("XCCL_FAULT_KILL_AT_STEP", "0:1");
    let out = ok(&mut cmd);
    assert!(String::from_utf8_lossy(&out.stdout).contains("no checkpoint of this job"), "{}", text(&out));
    assert_eq!(params(&dir), reference, "started from scratch, the parameters differ");
    for d in [whole, dir] {
        std::fs::remove_dir_all(d).unwrap();
    }
}

#[test]
fn xccl_run_restarts_a_failed_job_until_restarts_run_out() {
    // Rank 1 fails in the first attempt only; rank 0 exits 0, which does not make the
    // attempt a success.
    let script = r#"echo "attempt $TORCHELASTIC_RESTART_COUNT $XCCL_RESTART_COUNT of $TORCHELASTIC_MAX_RESTARTS"
        if [ "$RANK" = 1 ] && [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then exit 3; fi"#;
    let out = ok(&mut xccl(&["run", "--max-restarts", "1", "-n", "2", "--", "sh", "-c", script]));
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(
        stderr.contains("rank 1 exited with status 3; restarting the job (attempt 2 of 2)"),
        "{}",
        text(&out)
    );
    for rank in [0, 1] {
        assert!(stdout.contains(&format!("[{rank}] attempt 1 1 of 1")), "{}", text(&out));
    }
    assert!(stdout.contains("[1] attempt 0 0 of 1"), "{}", text(&out));

    // Without restarts the job fails with the rank's status.
    let out = xccl(&["run", "--max-restarts", "0", "-n", "2", "--", "sh", "-c", script]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert!(stderr.contains("job failed: rank 1 exited with status 3") && !stderr.contains("restarting"));

    // A rank that always dies: every restart is used, then the job ends with the last
    // failure's status (128 + 9), naming the rank.
    let always = r#"if [ "$RANK" = 1 ]; then kill -9 $$; fi"#;
    let out = xccl(&["run", "--max-restarts", "2", "-n", "2", "--", "sh", "-c", always]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(137), "{}", text(&out));
    assert_eq!(stderr.matches("restarting the job").count(), 2, "{}", text(&out));
    assert!(stderr.contains("(attempt 3 of 3)"), "{}", text(&out));
    assert!(stderr.contains("job failed: rank 1 was killed by signal 9 in attempt 3 of 3"), "{}", text(&out));

    // Several nodes would have to agree on a restart: refused, pointing to torchrun.
    let out = xccl(&[
        "run",
        "--nnodes",
        "2",
        "--master-port",
        "29999",
        "--max-restarts",
        "1",
        "-n",
        "1",
        "--",
        "true",
    ])
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("use torchrun"), "{}", text(&out));
}

#[test]
fn ctrl_c_never_restarts() {
    let mut cmd =
        xccl(&["run", "--max-restarts", "3", "-n", "2", "--", "sh", "-c", "echo ready; exec sleep 60"]);
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    // Both ranks are running once both said so.
    for _ in 0..2 {
        assert!(lines.next().unwrap().unwrap().ends_with("ready"));
    }
    let pid = rustix::process::Pid::from_raw(child.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::INT).unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    assert!(stderr.contains("interrupted") && !stderr.contains("restarting"), "{stderr}");
}

#[test]
fn xccl_train_as_ranks_of_xccl_run_equals_xccl_train_launching_itself() {
    let (whole, reference) = uninterrupted("self");
    // Plain ranks of `xccl run`.
    let dir = out_dir("under-run");
    let mut cmd = xccl(&["run", "-n", "2", "--", XCCL, "train"]);
    cmd.args(TINY).args(["--dp", "2"]).args(RUN).arg("--out").arg(&dir);
    let out = ok(&mut cmd);
    let stdout = String::from_utf8_lossy(&out.stdout);
    // Rank 0 reports in plain lines: the opening line, steps, the summary, the files.
    assert!(stdout.contains("[0] xccl train: gpt") && stdout.contains("[0] step 10/10"), "{stdout}");
    assert!(stdout.contains("[0] final loss") && stdout.contains("[0] loss curve"), "{stdout}");
    assert!(!stdout.contains("@xccl-train") && !stdout.contains("[1] final loss"), "{stdout}");
    assert!(dir.join("loss.svg").exists() && dir.join("trace.json").exists());
    assert_eq!(params(&dir), reference, "under xccl run, the parameters differ");

    // Killed and restarted by `xccl run`, resuming from the checkpoint.
    let mut cmd = xccl(&["run", "--max-restarts", "1", "-n", "2", "--", XCCL, "train"]);
    cmd.args(TINY).args(["--dp", "2"]).args(RUN).arg("--out").arg(&dir);
    let out = ok(cmd.env("XCCL_FAULT_KILL_AT_STEP", "0:6"));
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(stderr.contains("rank 0 was killed by signal 9; restarting the job"), "{}", text(&out));
    assert!(stdout.contains("attempt 2: resuming from the checkpoint"), "{}", text(&out));
    assert_eq!(params(&dir), reference, "restarted under xccl run, the parameters differ");
    for d in [whole, dir] {
        std::fs::remove_dir_all(d).unwrap();
    }
}

#[test]
fn a_mesh_that_does_not_match_the_launchers_world_is_refused_on_every_rank() {
    let dir = out_dir("mismatch");
    // Each launcher's variables for rank `r` of a world of `n`, the flags, what to expect.
    type Vars = fn(usize, usize) -> Vec<(&'static str, String)>;
    let torchrun: Vars = |r, n| vec![("RANK", r.to_string()), ("WORLD_SIZE", n.to_string())];
    let mpirun: Vars =
        |r, n| vec![("OMPI_COMM_WORLD_RANK", r.to_string()), ("OMPI_COMM_WORLD_SIZE", n.to_string())];
    let srun: Vars = |r, n| {
        vec![("SLURM_STEP_ID", "0".into()), ("SLURM_PROCID", r.to_string()), ("SLURM_NTASKS", n.to_string())]
    };
    let cases: [(Vars, usize, &[&str], &str); 4] = [
        (
            torchrun,
            3,
            &["--dp", "2"],
            "torchrun started 3 ranks, but the mesh --dp 2 x --pp 1 x --tp 1 has 2 ranks: pass --dp 3",
        ),
        (
            mpirun,
            4,
            &["--dp", "3"],
            "mpirun started 4 ranks, but the mesh --dp 3 x --pp 1 x --tp 1 has 3 ranks: pass --dp 4",
        ),
        (
            srun,
            3,
            &["--dp", "1", "--tp", "2"],
            "start 2 ranks, or choose --dp, --pp and --tp with a product of 3",
        ),
        (torchrun, 2, &["--dp", "2", "--max-restarts", "1"], "torchrun, which does the restarts"),
    ];
    for (vars, n, args, want) in cases {
        // Every rank, on its own, before any communication (no store is there to meet at).
        for r in 0..n {
            let mut cmd = train(&dir, args);
            cmd.envs(vars(r, n)).env("MASTER_ADDR", "127.0.0.1").env("MASTER_PORT", "1");
            let out = cmd.output().unwrap();
            assert_eq!(out.status.code(), Some(2), "rank {r} of {args:?}: {}", text(&out));
            assert!(
                String::from_utf8_lossy(&out.stderr).contains(want),
                "rank {r}: want '{want}': {}",
                text(&out)
            );
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn xccl_train_as_ranks_of_mpirun_equals_xccl_train_launching_itself() {
    if Command::new("mpirun").arg("--version").output().is_err() {
        common::require::skip("mpi", "no mpirun on the PATH");
        return;
    }
    let (whole, reference) = uninterrupted("mpirun-whole");
    let dir = out_dir("mpirun");
    let mut cmd = Command::new("mpirun");
    cmd.args(["-np", "2", "-x", "RAYON_NUM_THREADS", "-x", "XCCL_TIMEOUT", XCCL, "train"])
        .args(TINY)
        .args(["--dp", "2"])
        .args(RUN)
        .arg("--out")
        .arg(&dir)
        .env("XCCL_TIMEOUT", "60")
        .env("RAYON_NUM_THREADS", "1");
    mpirun_env(&mut cmd);
    let out = ok(&mut cmd);
    assert!(String::from_utf8_lossy(&out.stdout).contains("final loss"), "{}", text(&out));
    assert_eq!(params(&dir), reference, "under mpirun, the parameters differ");
    for d in [whole, dir] {
        std::fs::remove_dir_all(d).unwrap();
    }
}

#[test]
fn under_torchrun_a_killed_rank_restarts_resumes_and_ends_bit_identical() {
    let Some(python) = torch_python() else { return };
    let (whole, reference) = uninterrupted("torchrun-whole");
    let dir = out_dir("torchrun");
    let mut cmd = Command::new(python);
    cmd.args([
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "--max-restarts",
        "1",
        "--no-python",
        XCCL,
        "train",
    ])
    .args(TINY)
    .args(["--dp", "2"])
    .args(RUN)
    .arg("--out")
    .arg(&dir)
    .env("XCCL_TIMEOUT", "60")
    .env("RAYON_NUM_THREADS", "1")
    .env("XCCL_FAULT_KILL_AT_STEP", "1:6")
    .env_remove("XCCL_JOB_ID");
    let out = ok(&mut cmd);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("attempt 2: resuming from the checkpoint"), "{}", text(&out));
    assert_eq!(params(&dir), reference, "restarted by torchrun, the parameters differ");
    for d in [whole, dir] {
        std::fs::remove_dir_all(d).unwrap();
    }
}
