#!/usr/bin/env python3
"""A fault campaign on the emulated cluster (bench/cluster.sh).

Each trial starts a job on the cluster (3 hosts x 2 ranks by default): a random collective,
size and algorithm run in a loop with every result checked (`xccl bench --check-every`), or
`xccl train`. At a random moment it injects one fault:

  kill      SIGKILL one rank
  stop      SIGSTOP one rank (it stays alive but silent)
  cut       take one host's link down
  throttle  limit one host's link to a trickle (16 kbit/s)

and records what the ranks do: every survivor must exit with an error naming a rank on the
other side of the fault, within 5 s for kill and cut and XCCL_TIMEOUT + 5 s for stop and
throttle; none may hang, none may report a wrong result; afterwards no process of the job
and no new /dev/shm segment may be left. Outcomes go to OUT/trials.jsonl, the table to
OUT/summary.md (and stdout).

  sudo python3 bench/faults.py --trials 200 --out target/faults
  python3 bench/faults.py --trials 20 --seed 7        (what the test suite runs)

Needs root (namespaces), the release build of xccl (built if missing). The cluster is
removed however the campaign ends.
"""

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
CLUSTER = os.path.join(HERE, "cluster.sh")
KINDS = ["kill", "stop", "cut", "throttle"]
# Collectives the campaign draws from, with the algorithms each may run.
COLLS = {
    "all_reduce": ["ring", "recursive_doubling", "rabenseifner", "dbtree", "hierarchical", "direct", "reduce_broadcast"],
    "broadcast": ["binomial", "linear", "chain", "scatter_allgather"],
    "all_gather": ["ring", "bruck", "direct"],
    "reduce_scatter": ["ring", "recursive_halving", "direct"],
    "all_to_all": ["pairwise", "bruck"],
    "reduce": ["binomial"],
}
SIZES = ["4K", "64K", "1M", "8M"]


def sh(*args, check=True, **kw):
    return subprocess.run(list(args), check=check, capture_output=True, text=True, **kw)


def job_pids(job, exe="xccl"):
    """Pids of the processes of program `exe` whose environment has XCCL_JOB_ID=job, by
    XCCL_RANK."""
    found = {}
    want = ("XCCL_JOB_ID=" + job).encode()
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{p}/comm", "rb") as f:
                comm = f.read().strip()
        except OSError:
            continue
        if want in env and comm == os.path.basename(exe)[:15].encode():
            rank = next((int(e.split(b"=")[1]) for e in env if e.startswith(b"XCCL_RANK=")), None)
            if rank is not None:
                found[rank] = int(p)
    return found


def stop_job(job, exe):
    """Continues and kills every process of `job` (a stopped one too)."""
    for p in job_pids(job, exe).values():
        for s in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.kill(p, s)
            except OSError:
                pass


def running(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] not in "ZX"
    except OSError:
        return False


def shm_files():
    try:
        return {f for f in os.listdir("/dev/shm") if f.startswith("xccl-")}
    except OSError:
        return set()


class Campaign:
    def __init__(self, args):
        self.a = args
        self.rng = random.Random(args.seed)
        self.name = "f%d" % (os.getpid() % 100000)
        self.world = args.hosts * args.ranks_per_host
        self.xccl = args.xccl
        # The job of the trial in progress: in a session of its own, a Ctrl-C at the
        # terminal does not reach it, so `down` stops it.
        self.job = None
        os.makedirs(args.out, exist_ok=True)

    def up(self):
        sh("bash", CLUSTER, "gc", check=False)
        sh("bash", CLUSTER, "down", self.name, check=False)
        sh("bash", CLUSTER, "up", self.name, "--hosts", str(self.a.hosts), "--rate", self.a.rate,
           "--owner", str(os.getpid()))

    def down(self):
        if self.job is not None:
            stop_job(self.job, self.xccl)
        sh("bash", CLUSTER, "down", self.name, check=False)

    def workload(self, trial_dir):
        if self.rng.random() < self.a.train_share:
            return "train", [self.xccl, "train", "--worker", "--dp", str(self.world), "--steps", "100000",
                             "--layers", "1", "--width", "32", "--heads", "2", "--batch", "12",
                             "--out", os.path.join(trial_dir, "train")]
        coll = self.rng.choice(sorted(COLLS))
        algo = self.rng.choice(COLLS[coll])
        size = self.rng.choice(SIZES)
        return f"{coll} {algo} {size}", [self.xccl, "bench", coll, "--sizes", size, "-n", "100000000",
                                         "-w", "1", "--check-every", "--algo", algo]

    def trial(self, i, kind):
        trial_dir = os.path.join(self.a.out, f"trial{i:04d}")
        os.makedirs(trial_dir, exist_ok=True)
        what, cmd = self.workload(trial_dir)
        port = 30000 + i
        job = f"cluster-{self.name}-{port}"
        env = dict(os.environ, LOGDIR=trial_dir, XCCL_TIMEOUT=str(self.a.timeout),
                   XCCL_FLIGHT_DIR=os.path.join(trial_dir, "flight"))
        shm_before = shm_files()
        # A session of its own: were the job in the campaign's process group, the exit of
        # whatever started the campaign (a shell that left it running in the background)
        # would orphan that group, and the kernel would then send SIGCONT to a stopped rank.
        launch = subprocess.Popen(["bash", CLUSTER, "launch", self.name, "--ranks-per-host",
                                   str(self.a.ranks_per_host), "--port", str(port), "--"] + cmd,
                                  env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  start_new_session=True)
        self.job = job
        # Wait for every rank, then a random moment into its work.
        t0 = time.monotonic()
        pids = {}
        while len(pids) < self.world and time.monotonic() - t0 < 30 and launch.poll() is None:
            pids = job_pids(job, self.xccl)
            time.sleep(0.05)
        rec = {"trial": i, "kind": kind, "workload": what, "seed": self.a.seed}
        if len(pids) < self.world:
            launch.kill()
            rec.update(outcome="not-started", detail=f"{len(pids)} of {self.world} ranks started")
            return self.finish(rec, launch, job, shm_before, None)
        time.sleep(self.rng.uniform(0.5, 2.5))
        victim = self.rng.randrange(self.world)
        host = victim // self.a.ranks_per_host
        rec.update(victim=victim, host=host)
        if kind == "kill":
            os.kill(pids[victim], signal.SIGKILL)
        elif kind == "stop":
            os.kill(pids[victim], signal.SIGSTOP)
        elif kind == "cut":
            sh("bash", CLUSTER, "link", self.name, str(host), "down")
        else:
            sh("bash", CLUSTER, "link", self.name, str(host), "16kbit")
        t_fault = time.monotonic()
        early = [r for r, p in pids.items() if not running(p) and r != victim]
        if kind in ("kill", "stop"):
            survivors = [r for r in range(self.world) if r != victim]
            limit = 5.0 if kind == "kill" else self.a.timeout + 5.0
        else:
            survivors = list(range(self.world))
            limit = 5.0 if kind == "cut" else self.a.timeout + 5.0
        exits = {}
        deadline = t_fault + limit + self.a.grace
        while time.monotonic() < deadline and len(exits) < len(survivors):
            for r in survivors:
                if r not in exits and not running(pids[r]):
                    exits[r] = time.monotonic() - t_fault
            time.sleep(0.02)
        hung = [r for r in survivors if r not in exits]
        rec.update(limit_s=limit, detect_s={str(r): round(t, 3) for r, t in sorted(exits.items())},
                   worst_s=round(max(exits.values()), 3) if exits else None, hung=hung, early=early)
        return self.finish(rec, launch, job, shm_before, trial_dir)

    def finish(self, rec, launch, job, shm_before, trial_dir):
        # Stop whatever is left, put the link back, then look for leftovers.
        stop_job(job, self.xccl)
        self.job = None
        try:
            launch.wait(timeout=20)
        except subprocess.TimeoutExpired:
            launch.kill()
        if "host" in rec:
            sh("bash", CLUSTER, "link", self.name, str(rec["host"]), "up", check=False)
            sh("bash", CLUSTER, "link", self.name, str(rec["host"]), self.a.rate, check=False)
        time.sleep(0.1)
        left_procs = sorted(job_pids(job, self.xccl).values())
        left_shm = sorted(shm_files() - shm_before)
        for f in left_shm:
            try:
                os.unlink(os.path.join("/dev/shm", f))
            except OSError:
                pass
        rec.update(left_procs=left_procs, left_shm=left_shm)
        if trial_dir is not None:
            judge(rec, trial_dir, self.a.ranks_per_host, self.world)
        with open(os.path.join(self.a.out, "trials.jsonl"), "a") as f:
            f.write(json.dumps(rec) + "\n")
        return rec


def named(line):
    """The ranks an error line names: "rank 3", "ranks 2, 3"."""
    got = set()
    for m in re.finditer(r"\branks? (\d+(?:, \d+)*)", line):
        got.update(int(x) for x in m.group(1).split(", "))
    return got


def judge(rec, trial_dir, rph, world):
    """Sets a finished trial's outcome from its record and the survivors' logs."""
    victim, host, kind = rec["victim"], rec["host"], rec["kind"]
    survivors = [r for r in range(world) if r != victim] if kind in ("kill", "stop") else list(range(world))
    exits = {int(r): t for r, t in rec["detect_s"].items()}
    wrong, unnamed = [], []
    for r in survivors:
        try:
            with open(os.path.join(trial_dir, f"rank{r}.log"), errors="replace") as f:
                log = f.read()
        except OSError:
            log = ""
        if "wrong values" in log:
            wrong.append(r)
        if kind in ("kill", "stop"):
            blamed = {victim}
        else:
            mine = r // rph == host
            blamed = {q for q in range(world) if (q // rph == host) != mine}
        last = [ln for ln in log.splitlines() if ln.startswith("xccl ")][-1:] or [""]
        if not named(last[0]) & blamed:
            unnamed.append(r)
    slow = [r for r, t in exits.items() if t > rec["limit_s"]]
    rec.update(wrong=wrong, unnamed=unnamed, slow=slow)
    if wrong:
        outcome = "wrong-result"
    elif rec["hung"]:
        outcome = "hang"
    elif rec["left_procs"] or rec["left_shm"]:
        outcome = "leftover"
    elif slow:
        outcome = "slow"
    elif unnamed:
        outcome = "unnamed"
    else:
        outcome = "ok"
    rec["outcome"] = outcome


def rescore(a):
    """Judges the trials of an earlier campaign in --out again (after a change of the checks)."""
    path = os.path.join(a.out, "trials.jsonl")
    records = [json.loads(ln) for ln in open(path)]
    for rec in records:
        if "detect_s" in rec:
            judge(rec, os.path.join(a.out, f"trial{rec['trial']:04d}"), a.ranks_per_host, a.hosts * a.ranks_per_host)
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    print(summarize(records, a.out))


def summarize(records, out):
    lines = ["| fault | trials | ok | slow | unnamed | hang | wrong result | leftover | not started | worst detection (s) | median (s) | limit (s) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for kind in KINDS + ["all"]:
        rs = [r for r in records if kind in ("all", r["kind"])]
        if not rs:
            continue
        count = lambda o: sum(1 for r in rs if r.get("outcome") == o)
        worst = [r["worst_s"] for r in rs if r.get("worst_s") is not None]
        med = sorted(worst)[len(worst) // 2] if worst else None
        limit = sorted({r["limit_s"] for r in rs if "limit_s" in r})
        lines.append(f"| {kind} | {len(rs)} | {count('ok')} | {count('slow')} | {count('unnamed')} | {count('hang')} | "
                     f"{count('wrong-result')} | {count('leftover')} | {count('not-started')} | "
                     f"{max(worst) if worst else '-'} | {med if med is not None else '-'} | "
                     f"{'/'.join(str(x) for x in limit) or '-'} |")
    text = "\n".join(lines) + "\n"
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write(text)
    return text


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=200)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--hosts", type=int, default=3)
    p.add_argument("--ranks-per-host", type=int, default=2)
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--timeout", type=float, default=5.0, help="XCCL_TIMEOUT of the jobs (s)")
    p.add_argument("--grace", type=float, default=10.0, help="how long past its limit a rank may take before it counts as hung")
    p.add_argument("--train-share", type=float, default=0.15, help="share of trials that run xccl train")
    p.add_argument("--out", default=os.path.join(REPO, "target", "faults"))
    p.add_argument("--xccl", default=os.path.join(REPO, "target", "release", "xccl"), help="the xccl binary to run")
    p.add_argument("--rescore", action="store_true", help="judge the trials in --out again instead of running any")
    a = p.parse_args()
    if a.rescore:
        return rescore(a)
    if os.geteuid() != 0:
        sys.exit("faults.py: needs root for network namespaces")
    if not os.path.exists(a.xccl):
        subprocess.run(["cargo", "build", "--release", "-p", "xccl-cli"], cwd=REPO, check=True)
    try:
        os.remove(os.path.join(a.out, "trials.jsonl"))
    except OSError:
        pass
    c = Campaign(a)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(130))
    records = []
    try:
        c.up()
        for i in range(a.trials):
            kind = KINDS[i % len(KINDS)]
            r = c.trial(i, kind)
            records.append(r)
            print(f"trial {i:4d} {kind:8s} {r.get('workload', ''):40s} {r['outcome']:12s} worst {r.get('worst_s')}",
                  flush=True)
    finally:
        c.down()
    print(summarize(records, a.out))
    bad = [r for r in records if r["outcome"] != "ok"]
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
