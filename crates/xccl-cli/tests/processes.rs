//! Ranks as real processes: the launcher, TCP between processes, a static torchrun-style
//! rendezvous without launcher, and failures (a rank killed mid-collective, a failing rank,
//! Ctrl-C, a wrong secret).
//!
//! This binary is its own rank program: run with `XCCL_TEST_SCENARIO` set, it acts as one
//! rank of that scenario; run plainly (as `cargo test` does), it runs every test below and
//! exits non-zero if one fails.

use std::io::Read;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use xccl::{Communicator, ReduceOp};

mod common;

use common::text;

const XCCL: &str = env!("CARGO_BIN_EXE_xccl");

/// A named test: Ok, or what went wrong.
type Test = (&'static str, fn() -> Result<(), String>);

fn main() {
    if let Ok(scenario) = std::env::var("XCCL_TEST_SCENARIO") {
        std::process::exit(rank_main(&scenario));
    }
    let tests: &[Test] = &[
        ("collectives between processes under xccl run", collectives_under_launcher),
        ("static rendezvous without a launcher (torchrun variables)", static_rendezvous),
        ("a killed rank fails the others promptly, naming it", killed_rank),
        ("a stopped rank is named by every survivor, however far it waits", stopped_rank),
        ("the launcher stops the job when a rank fails", launcher_failure),
        ("a failed job prints what every rank was doing (flight records)", flight_records),
        ("the launcher prefixes output with ranks", launcher_prefix),
        ("ranks allocate large buffers on huge pages unless told otherwise", launcher_huge_pages),
        ("Ctrl-C stops every rank", launcher_interrupt),
        ("Ctrl-C and a failed rank stop a job still starting its ranks", launcher_stops_starting),
        ("a wrong secret is refused between processes", wrong_secret),
        ("the launcher removes the segment files a failed job left", launcher_sweeps_segments),
    ];
    // `cargo test --test processes -- WORDS` runs the tests whose names contain WORDS.
    let filter: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let tests: Vec<&Test> =
        tests.iter().filter(|(name, _)| filter.iter().all(|f| name.contains(f.as_str()))).collect();
    let mut failed = 0;
    for (name, test) in &tests {
        let t0 = Instant::now();
        match test() {
            Ok(()) => println!("test {name} ... ok ({:.1} s)", t0.elapsed().as_secs_f64()),
            Err(e) => {
                failed += 1;
                println!("test {name} ... FAILED ({:.1} s)\n{e}", t0.elapsed().as_secs_f64());
            }
        }
    }
    println!("\n{} passed; {failed} failed", tests.len() - failed);
    std::process::exit(i32::from(failed > 0));
}

// ---- rank side ----

fn rank_main(scenario: &str) -> i32 {
    let result = match scenario {
        "collectives" => collectives(),
        "killed" => survive_a_kill(),
        "stopped" => survive_a_stop(),
        "hello" => Communicator::from_env().and_then(|c| c.barrier()),
        "orphan" => leave_a_segment(),
        other => Err(xccl::Error::Config(format!("unknown scenario {other}"))),
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("RANK ERROR: {e}");
            3
        }
    }
}

fn check(ok: bool, what: &str) -> xccl::Result<()> {
    if ok { Ok(()) } else { Err(xccl::Error::Internal(format!("wrong result: {what}"))) }
}

/// A representative subset of collectives, checked exactly.
fn collectives() -> xccl::Result<()> {
    let c = Communicator::from_env()?;
    let (n, r) = (c.size(), c.rank());
    for len in [0usize, 1, 7, 1 << 16, (1 << 20) + 3] {
        let mut v: Vec<f32> = (0..len).map(|i| ((r + i) % 5) as f32).collect();
        c.all_reduce(&mut v, ReduceOp::Sum)?;
        check(
            v.iter().enumerate().all(|(i, x)| *x == (0..n).map(|q| ((q + i) % 5) as f32).sum::<f32>()),
            "all_reduce",
        )?;
        let mut b = vec![r as i32; len];
        c.broadcast(&mut b, n - 1)?;
        check(b.iter().all(|x| *x == (n - 1) as i32), "broadcast")?;
        let mut red = vec![0u64; len];
        c.reduce(&vec![r as u64 + 1; len], &mut red, ReduceOp::Prod, 0)?;
        check(r != 0 || red.iter().all(|x| *x == (1..=n as u64).product::<u64>()), "reduce")?;
        let mut g = vec![xccl::bf16::ZERO; len * n];
        c.all_gather(&vec![xccl::bf16::from_f32(r as f32); len], &mut g)?;
        check(g.iter().enumerate().all(|(k, x)| x.to_f32() == (k / len.max(1)) as f32), "all_gather")?;
        let mut rs = vec![0i64; len];
        c.reduce_scatter(&vec![1i64; len * n], &mut rs, ReduceOp::Sum)?;
        check(rs.iter().all(|x| *x == n as i64), "reduce_scatter")?;
        let inp: Vec<u32> = (0..len * n).map(|k| (r * 100 + k / len.max(1)) as u32).collect();
        let mut out = vec![0u32; len * n];
        c.all_to_all(&inp, &mut out)?;
        check(out.iter().enumerate().all(|(k, x)| *x == ((k / len.max(1)) * 100 + r) as u32), "all_to_all")?;
    }
    large_all_reduces::<f32>(&c)?;
    large_all_reduces::<f64>(&c)?;
    let counts: Vec<usize> = (0..n).map(|k| k * 3 + 1).collect();
    let mut out = vec![0f64; counts.iter().sum()];
    c.all_gather_v(&vec![r as f64; counts[r]], &mut out, &counts)?;
    let want: Vec<f64> =
        counts.iter().enumerate().flat_map(|(k, &m)| std::iter::repeat_n(k as f64, m)).collect();
    check(out == want, "all_gather_v")?;
    // Uneven reduce-scatter, an empty block among them: block k holds rank q's value q + k.
    let counts: Vec<usize> = (0..n).map(|k| (k * 7 + 3) % 5 * 1000).collect();
    let input: Vec<i64> =
        counts.iter().enumerate().flat_map(|(k, &m)| std::iter::repeat_n((r + k) as i64, m)).collect();
    let mut out = vec![0i64; counts[r]];
    c.reduce_scatter_v(&input, &mut out, &counts, ReduceOp::Sum)?;
    let want = (0..n).map(|q| (q + r) as i64).sum::<i64>();
    check(out.iter().all(|x| *x == want), "reduce_scatter_v")?;
    let pair = c.split(Some((r % 2) as u32), -(r as i32))?.expect("every rank has a color");
    let mut v = [r as i32];
    pair.all_reduce(&mut v, ReduceOp::Max)?;
    check(v[0] == (0..n).filter(|q| q % 2 == r % 2).max().unwrap_or(0) as i32, "split all_reduce")?;
    check(
        pair.rank() == (0..n).filter(|q| q % 2 == r % 2).rev().position(|q| q == r).unwrap_or(usize::MAX),
        "split key order",
    )?;
    if n > 1 {
        let to = (r + 1) % n;
        let from = (r + n - 1) % n;
        let s = c.isend(vec![r as u8; 3000], to, 9);
        let mut got = vec![0u8; 3000];
        c.recv(&mut got, from, 9)?;
        s.wait()?;
        check(got.iter().all(|x| *x == from as u8), "send/recv")?;
    }
    c.barrier()
}

/// All-reduces whose halves are pulled and folded between processes, so that each rank
/// writes its folded half into its peer's output ahead (`process_vm_writev`, protocol
/// `fused`): in place and out of place (the result between guards that must stay untouched,
/// the input unchanged), summed and maximised, against the naive reference; counts of whole
/// 256 KiB pieces and not, and halves either side of the 64 KiB pull threshold (set here: the
/// built-in one is larger on AMD processors).
fn large_all_reduces<T: xccl::Element>(c: &Communicator) -> xccl::Result<()> {
    let pull = xccl::protocol::PullSetting::exactly(xccl::protocol::PullMin::default());
    let c = &c.dup_with(xccl::Config { pull, ..c.config().clone() })?;
    let (n, r) = (c.size(), c.rank());
    let val = |q: usize, i: usize, salt: usize| T::from_f64(((q * 7 + i * 13 + salt * 3) % 8) as f64);
    const GUARD: usize = 4099;
    for len in [1usize << 19, 600_001, 32_767, 1_048_579] {
        for (k, op) in [ReduceOp::Sum, ReduceOp::Max].into_iter().enumerate() {
            let salt = len + k;
            let want: Vec<T> = (0..len)
                .map(|i| {
                    let vals: Vec<T> = (0..n).map(|q| val(q, i, salt)).collect();
                    xccl::reference_reduce(op, &vals).unwrap_or(vals[0])
                })
                .collect();
            let what =
                |form: &str| format!("large all_reduce {form} of {len} {}, {op}", std::any::type_name::<T>());
            let mut buf: Vec<T> = (0..len).map(|i| val(r, i, salt)).collect();
            c.all_reduce(&mut buf, op)?;
            check(buf == want, &what("in place"))?;
            let input: Vec<T> = (0..len).map(|i| val(r, i, salt)).collect();
            let mut out = vec![T::from_f64(99.0); len + 2 * GUARD];
            c.all_reduce_into(&input, &mut out[GUARD..GUARD + len], op)?;
            check(out[GUARD..GUARD + len] == want[..], &what("out of place"))?;
            let untouched = |x: &T| *x == T::from_f64(99.0);
            check(out[..GUARD].iter().chain(&out[GUARD + len..]).all(untouched), &what("guards"))?;
            check(input.iter().enumerate().all(|(i, x)| *x == val(r, i, salt)), &what("input"))?;
        }
    }
    Ok(())
}

/// Large all-reduces in a loop; rank 2 kills itself (SIGKILL) in the middle of one.
fn survive_a_kill() -> xccl::Result<()> {
    survive_a_signal(2, rustix::process::Signal::KILL, 8 << 20, 1000)
}

/// Ring all-reduces in a loop; rank `XCCL_TEST_VICTIM` stops itself (SIGSTOP) in the middle
/// of one, so that most survivors wait for a rank that waits in turn.
fn survive_a_stop() -> xccl::Result<()> {
    let victim: usize = std::env::var("XCCL_TEST_VICTIM").ok().and_then(|v| v.parse().ok()).unwrap_or(2);
    survive_a_signal(victim, rustix::process::Signal::STOP, 1 << 16, 100_000)
}

/// All-reduces of `len` elements, `iters` of them; rank `victim` sends itself `signal` during
/// the fourth.
fn survive_a_signal(
    victim: usize,
    signal: rustix::process::Signal,
    len: usize,
    iters: usize,
) -> xccl::Result<()> {
    let c = Communicator::from_env()?;
    let mut v = vec![1f32; len];
    for i in 0..iters {
        if c.rank() == victim && i == 3 {
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                let _ = rustix::process::kill_process(rustix::process::getpid(), signal);
            });
        }
        c.all_reduce(&mut v, ReduceOp::Max)?;
    }
    Ok(())
}

// ---- orchestration side ----

/// Leaves a file named like a segment of this job in /dev/shm, as a rank killed while its
/// host's segment was being joined does, then fails.
fn leave_a_segment() -> xccl::Result<()> {
    let job = std::env::var("XCCL_JOB_ID").map_err(|_| xccl::Error::Config("no XCCL_JOB_ID".into()))?;
    let path = format!("/dev/shm/{}orphan-{}", xccl::bootstrap::segment_prefix(&job), std::process::id());
    std::fs::write(&path, b"").map_err(|e| xccl::Error::Config(format!("writing {path}: {e}")))?;
    Err(xccl::Error::Config("left a segment behind".into()))
}

fn me() -> String {
    std::env::current_exe().expect("test binary path").to_string_lossy().into_owned()
}

/// Runs `cmd` with a deadline; kills it and fails past the deadline.
fn run_with_deadline(mut cmd: Command, limit: Duration) -> Result<Output, String> {
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().map_err(|e| e.to_string())?;
    let (mut out, mut err) = (child.stdout.take().expect("piped"), child.stderr.take().expect("piped"));
    let o = std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = out.read_to_end(&mut b);
        b
    });
    let e = std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = err.read_to_end(&mut b);
        b
    });
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().map_err(|e| e.to_string())? {
            break s;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("did not finish within {limit:?}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Ok(Output { status, stdout: o.join().unwrap_or_default(), stderr: e.join().unwrap_or_default() })
}

fn launch(n: usize, scenario: &str, extra_env: &[(&str, &str)]) -> Result<Output, String> {
    let mut cmd = Command::new(XCCL);
    cmd.args(["run", "-n", &n.to_string(), "--", &me()])
        .env("XCCL_TEST_SCENARIO", scenario)
        .env("XCCL_TIMEOUT", "60");
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    run_with_deadline(cmd, Duration::from_secs(120))
}

fn collectives_under_launcher() -> Result<(), String> {
    for n in [1, 2, 3, 4] {
        let out = launch(n, "collectives", &[])?;
        if !out.status.success() {
            return Err(format!("n={n}: {}", text(&out)));
        }
    }
    let out = launch(3, "collectives", &[("XCCL_ALGO", "allreduce:reduce_broadcast")])?;
    if !out.status.success() {
        return Err(format!("reduce_broadcast: {}", text(&out)));
    }
    // Three ranks fold onto two: recursive halving with uneven blocks in the folded rounds.
    let out = launch(3, "collectives", &[("XCCL_ALGO", "reduce_scatter:recursive_halving")])?;
    if !out.status.success() {
        return Err(format!("recursive_halving: {}", text(&out)));
    }
    Ok(())
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).unwrap_or(29555)
}

/// Starts `n` ranks by hand, as torchrun's static rendezvous would: only RANK, WORLD_SIZE,
/// LOCAL_RANK, MASTER_ADDR and MASTER_PORT (rank 0 serves the store).
fn spawn_static(
    n: usize,
    scenario: &str,
    timeout: &str,
    secret_of: impl Fn(usize) -> String,
    extra_env: &[(&str, String)],
) -> Result<Vec<Child>, String> {
    let port = free_port().to_string();
    (0..n)
        .map(|r| {
            Command::new(me())
                .env("XCCL_TEST_SCENARIO", scenario)
                .env("RANK", r.to_string())
                .env("WORLD_SIZE", n.to_string())
                .env("LOCAL_RANK", r.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", &port)
                .env("XCCL_SECRET", secret_of(r))
                .env("XCCL_TIMEOUT", timeout)
                .env_remove("XCCL_STORE_ADDR")
                .envs(extra_env.iter().map(|(k, v)| (k, v)))
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .map_err(|e| e.to_string())
        })
        .collect()
}

fn static_rendezvous() -> Result<(), String> {
    let children = spawn_static(3, "collectives", "60", |_| "same".into(), &[])?;
    for (r, c) in children.into_iter().enumerate() {
        let out = c.wait_with_output().map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!("rank {r}: {}", text(&out)));
        }
    }
    Ok(())
}

fn killed_rank() -> Result<(), String> {
    let start = Instant::now();
    let children = spawn_static(4, "killed", "60", |_| "s".into(), &[])?;
    let mut report = String::new();
    for (r, c) in children.into_iter().enumerate() {
        let out = c.wait_with_output().map_err(|e| e.to_string())?;
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        if r == 2 {
            continue;
        }
        if out.status.code() != Some(3) || !err.contains("RANK ERROR") || !err.contains("rank 2") {
            report += &format!("rank {r} did not fail naming rank 2: {}\n", text(&out));
        }
    }
    // XCCL_TIMEOUT is 60 s: failing well before it proves the loss was detected, not timed out.
    let took = start.elapsed();
    if took > Duration::from_secs(20) {
        report += &format!("the survivors took {took:?} to fail\n");
    }
    if report.is_empty() { Ok(()) } else { Err(report) }
}

/// Every survivor must blame the stopped rank, not the neighbour it waited for: under a
/// static rendezvous (rank 0 serves the store; also when rank 0 is the one stopped) and
/// under `xccl run` (the launcher serves it), over shared memory and over TCP.
fn stopped_rank() -> Result<(), String> {
    let mut report = String::new();
    for (victim, launcher, shm) in [(2, false, "1"), (0, false, "0"), (3, true, "0")] {
        let env = [
            ("XCCL_TEST_VICTIM", victim.to_string()),
            ("XCCL_ALGO", "allreduce:ring".to_string()),
            ("XCCL_SHM", shm.to_string()),
        ];
        let start = Instant::now();
        let outs: Vec<(usize, Output)> = if launcher {
            let mut cmd = Command::new(XCCL);
            cmd.args(["run", "-n", "5", "--", &me()])
                .env("XCCL_TEST_SCENARIO", "stopped")
                .env("XCCL_TIMEOUT", "2");
            cmd.envs(env.iter().map(|(k, v)| (k, v)));
            // The launcher stops the stopped rank once the others have failed.
            let out = run_with_deadline(cmd, Duration::from_secs(60))?;
            let all = text(&out);
            (0..5)
                .filter(|&r| r != victim)
                .map(|r| {
                    let mine: String = all
                        .lines()
                        .filter(|l| l.starts_with(&format!("[{r}]")))
                        .collect::<Vec<_>>()
                        .join("\n");
                    (r, Output { status: out.status, stdout: Vec::new(), stderr: mine.into_bytes() })
                })
                .collect()
        } else {
            let mut children = spawn_static(5, "stopped", "2", |_| "s".into(), &env)?;
            let stopped = children.remove(victim);
            let outs = children
                .into_iter()
                .enumerate()
                .map(|(i, c)| {
                    let r = if i >= victim { i + 1 } else { i };
                    c.wait_with_output().map(|o| (r, o)).map_err(|e| e.to_string())
                })
                .collect::<Result<Vec<_>, String>>();
            let mut stopped = stopped;
            let _ = stopped.kill();
            let _ = stopped.wait();
            outs?
        };
        let took = start.elapsed();
        for (r, out) in outs {
            let err = String::from_utf8_lossy(&out.stderr).into_owned();
            let blames = err.contains(&format!("rank {victim} is silent"))
                || err.contains(&format!("rank {victim} failed"));
            if !err.contains("RANK ERROR") || !blames {
                report += &format!("victim {victim}: rank {r} did not blame it: {}\n", text(&out));
            }
        }
        // XCCL_TIMEOUT is 2 s, the patience 1 s: the survivors end soon after.
        if took > Duration::from_secs(25) {
            report += &format!("victim {victim}: the survivors took {took:?} to fail\n");
        }
    }
    if report.is_empty() { Ok(()) } else { Err(report) }
}

fn launcher_failure() -> Result<(), String> {
    let mut cmd = Command::new(XCCL);
    cmd.args([
        "run",
        "-n",
        "3",
        "--grace",
        "2",
        "--",
        "sh",
        "-c",
        "if [ $RANK = 1 ]; then exit 7; fi; exec sleep 60",
    ]);
    let start = Instant::now();
    let out = run_with_deadline(cmd, Duration::from_secs(30))?;
    let err = String::from_utf8_lossy(&out.stderr);
    if out.status.code() != Some(7) || !err.contains("rank 1") || !err.contains("status 7") {
        return Err(text(&out));
    }
    if start.elapsed() > Duration::from_secs(10) {
        return Err(format!("took {:?} to stop the job", start.elapsed()));
    }
    Ok(())
}

/// Rank 2 is killed in the middle of an all-reduce under `xccl run`: the survivors write
/// their flight records, the launcher prints them, and `xccl flight` reads them back.
fn flight_records() -> Result<(), String> {
    let dir = std::env::temp_dir().join(format!("xccl-flight-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let out = launch(3, "killed", &[("XCCL_FLIGHT_DIR", dir.to_str().unwrap_or_default())])?;
    let err = String::from_utf8_lossy(&out.stderr);
    let table =
        err.split("flight records").nth(1).ok_or_else(|| format!("no flight table:\n{}", text(&out)))?;
    for rank in [0, 1] {
        let section = table.split(&format!("rank {rank} (pid")).nth(1).unwrap_or_default();
        let first = section.split("\n  rank ").next().unwrap_or_default();
        if !first.contains("failed   all_reduce #") || !first.contains("done     all_reduce #") {
            return Err(format!(
                "rank {rank}'s record lacks the failed all-reduce after done ones:\n{table}"
            ));
        }
    }
    if table.contains("rank 2 (pid") {
        return Err(format!("the killed rank wrote a record:\n{table}"));
    }
    let files: Vec<_> = std::fs::read_dir(&dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .flatten()
        .flat_map(|attempt| std::fs::read_dir(attempt.path()).into_iter().flatten().flatten())
        .map(|f| f.path())
        .collect();
    if files.len() != 2 {
        return Err(format!("expected the two survivors' records, found {files:?}"));
    }
    let shown = Command::new(XCCL).arg("flight").args(&files).output().map_err(|e| e.to_string())?;
    let shown_text = String::from_utf8_lossy(&shown.stdout);
    if !shown.status.success() || !shown_text.contains("2 of 3 ranks wrote a record") {
        return Err(format!("xccl flight: {}\n{}", shown_text, String::from_utf8_lossy(&shown.stderr)));
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

fn launcher_prefix() -> Result<(), String> {
    let mut cmd = Command::new(XCCL);
    cmd.args(["run", "-n", "2", "--", "sh", "-c", "echo hello from $RANK of $WORLD_SIZE; echo oops >&2"]);
    let out = run_with_deadline(cmd, Duration::from_secs(30))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let ok = out.status.success()
        && stdout.contains("[0] hello from 0 of 2")
        && stdout.contains("[1] hello from 1 of 2")
        && stderr.contains("[1] oops");
    if ok { Ok(()) } else { Err(text(&out)) }
}

/// `xccl run -n 1 -- ARGS` with `XCCL_MALLOC_HUGE_PAGES` as given (unset: `None`) and no
/// `GLIBC_TUNABLES` of the caller's.
fn run_one(setting: Option<&str>, args: &[&str]) -> Result<Output, String> {
    let mut cmd = Command::new(XCCL);
    cmd.args(["run", "-n", "1", "--"]).args(args).env_remove("GLIBC_TUNABLES");
    match setting {
        Some(v) => cmd.env("XCCL_MALLOC_HUGE_PAGES", v),
        None => cmd.env_remove("XCCL_MALLOC_HUGE_PAGES"),
    };
    run_with_deadline(cmd, Duration::from_secs(30))
}

fn launcher_huge_pages() -> Result<(), String> {
    let show = ["sh", "-c", "echo \"T=$GLIBC_TUNABLES\""];
    let on = run_one(None, &show)?;
    let off = run_one(Some("0"), &show)?;
    let said =
        |o: &Output, want: &str| o.status.success() && String::from_utf8_lossy(&o.stdout).contains(want);
    if !said(&on, "[0] T=glibc.malloc.hugetlb=1") || !said(&off, "[0] T=\n") {
        return Err(format!("the ranks' GLIBC_TUNABLES: default {}, off {}", text(&on), text(&off)));
    }
    let bad = run_one(Some("yes"), &show)?;
    if bad.status.success() || !String::from_utf8_lossy(&bad.stderr).contains("XCCL_MALLOC_HUGE_PAGES=yes") {
        return Err(format!("XCCL_MALLOC_HUGE_PAGES=yes was not refused: {}", text(&bad)));
    }
    // The setting takes effect: a rank's 64 MiB buffer lies on 2 MiB pages (where the kernel
    // offers transparent huge pages at all).
    let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    if thp.is_empty() || thp.contains("[never]") {
        eprintln!(
            "  note: transparent huge pages are off on this machine ({}); effect not checked",
            thp.trim()
        );
        return Ok(());
    }
    let probe = "b = bytearray(b'\\x01') * (64 << 20)\n\
                 print('AHP', next(l.split()[1] for l in open('/proc/self/smaps_rollup') if l.startswith('AnonHugePages')))";
    let huge_kib = |o: &Output| -> Option<u64> {
        let out = String::from_utf8_lossy(&o.stdout);
        out.lines().find_map(|l| l.split("AHP ").nth(1)).and_then(|v| v.trim().parse().ok())
    };
    let (on, off) =
        (run_one(None, &["python3", "-c", probe])?, run_one(Some("0"), &["python3", "-c", probe])?);
    match (huge_kib(&on), huge_kib(&off)) {
        (Some(a), Some(b)) if a >= 32 << 10 && a > b => Ok(()),
        _ => Err(format!("AnonHugePages of a 64 MiB buffer: default {}, off {}", text(&on), text(&off))),
    }
}

fn launcher_interrupt() -> Result<(), String> {
    let marker = format!("xccl-interrupt-test-{}", std::process::id());
    let mut child = Command::new(XCCL)
        .args(["run", "-n", "2", "--grace", "2", "--", "sh", "-c", &format!("exec sleep 60 # {marker}")])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    std::thread::sleep(Duration::from_millis(500));
    interrupt(&child)?;
    let status = ends_alone(&mut child, Duration::from_secs(10), &marker)?;
    if status.code() != Some(130) {
        return Err(format!("exit status {status:?}, expected 130"));
    }
    Ok(())
}

/// A job of 20 000 ranks, far more than this machine starts in the seconds the test allows:
/// Ctrl-C while its ranks start ends it with 130 and no rank left, and a first rank that
/// fails ends it with that rank's status, both promptly.
fn launcher_stops_starting() -> Result<(), String> {
    for (interrupt, program) in [(true, "exec sleep 60"), (false, "exit 3")] {
        let marker = format!("xccl-starting-test-{}-{interrupt}", std::process::id());
        let mut child = Command::new(XCCL)
            .args(["run", "-n", "20000", "--grace", "2", "--", "sh", "-c", &format!("{program} # {marker}")])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| e.to_string())?;
        if interrupt {
            std::thread::sleep(Duration::from_millis(500));
            self::interrupt(&child)?;
        }
        let status = ends_alone(&mut child, Duration::from_secs(20), &marker)
            .map_err(|e| format!("{program}: {e}"))?;
        let expected = if interrupt { 130 } else { 3 };
        if status.code() != Some(expected) {
            let mut err = String::new();
            child.stderr.take().map(|mut e| e.read_to_string(&mut err));
            return Err(format!("{program}: exit status {status:?}, expected {expected}: {err}"));
        }
    }
    Ok(())
}

/// Sends Ctrl-C (SIGINT) to the launcher `child`.
fn interrupt(child: &Child) -> Result<(), String> {
    let pid = rustix::process::Pid::from_raw(child.id() as i32).ok_or("bad pid")?;
    rustix::process::kill_process(pid, rustix::process::Signal::INT).map_err(|e| e.to_string())
}

/// Waits up to `limit` for the launcher `child` to exit, then checks that no rank of its job
/// (a process whose command line holds `marker`) is left; on either failure kills what is
/// left and says so.
fn ends_alone(child: &mut Child, limit: Duration, marker: &str) -> Result<std::process::ExitStatus, String> {
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().map_err(|e| e.to_string())? {
            break Some(s);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let survivors = processes_mentioning(marker);
    for pid in &survivors {
        if let Some(p) = rustix::process::Pid::from_raw(*pid as i32) {
            let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
        }
    }
    match status {
        None => {
            Err(format!("the launcher did not stop within {limit:?} ({} ranks running)", survivors.len()))
        }
        Some(_) if !survivors.is_empty() => Err(format!("ranks survived the launcher: pids {survivors:?}")),
        Some(s) => Ok(s),
    }
}

fn wrong_secret() -> Result<(), String> {
    // Rank 1 is refused by rank 0's store at once; rank 0 waits for it until its deadline
    // and then says why it never came.
    let children = spawn_static(2, "hello", "3", |r| format!("secret-{r}"), &[])?;
    let mut report = String::new();
    for (r, c) in children.into_iter().enumerate() {
        let out = c.wait_with_output().map_err(|e| e.to_string())?;
        let err = String::from_utf8_lossy(&out.stderr);
        if out.status.success() || !err.contains("XCCL_SECRET") {
            report += &format!("rank {r}: {}\n", text(&out));
        }
    }
    if report.is_empty() { Ok(()) } else { Err(report) }
}

/// Pids of processes whose command line contains `needle` (from /proc).
fn processes_mentioning(needle: &str) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(needle))
        })
        .collect()
}

fn launcher_sweeps_segments() -> Result<(), String> {
    let job = format!("sweep-test-{}", std::process::id());
    let prefix = xccl::bootstrap::segment_prefix(&job);
    let out = launch(2, "orphan", &[("XCCL_JOB_ID", job.as_str())])?;
    if out.status.success() {
        return Err(format!("the failing ranks did not fail the job: {}", text(&out)));
    }
    let left: Vec<String> = std::fs::read_dir("/dev/shm")
        .map_err(|e| e.to_string())?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&prefix))
        .collect();
    if left.is_empty() { Ok(()) } else { Err(format!("left in /dev/shm: {left:?}")) }
}
