#!/usr/bin/env python3
"""PyTorch's own distributed test suite against a process-group backend, the way PyTorch
runs it for Gloo (test/distributed/test_distributed_spawn.py): the class
``torch.testing._internal.distributed.distributed_test.DistributedTest._DistTestBase``
combined with ``TestDistBackend``, every test spawning its ``WORLD_SIZE`` ranks.

Usage (with the Python that has torch, pytest and xccl installed)::

    python bench/torch_suite.py --backend gloo,xccl_cpu --world-size 2,3   # full runs + comparison
    python bench/torch_suite.py --subset bench/torch_suite_ci.txt           # CI: exit 1 unless all pass
    python bench/torch_suite.py --compare out/torch_suite/gloo_ws2.json out/torch_suite/xccl_cpu_ws2.json
    python bench/torch_suite.py --unskip gloo          # probe: run the tests kept for gloo alone on xccl
    python bench/torch_suite.py ... --resume           # finish a run that was killed, keeping its results

Each (backend, world size) run writes ``<out-dir>/<backend>_ws<N>.json`` (per test: outcome
``pass``/``fail``/``skip``, the skip reason or the failure's first line, seconds), the
pytest JUnit XML of every pytest invocation, a log, and prints a table. With both gloo and
another backend run, it also writes ``compare_ws<N>.md/.json``: the tests that pass on gloo
and not on the other backend, grouped by reason; the tests kept for gloo alone; counts.

How it runs: this file is at once the driver (``__main__``) and, imported as the module
``torch_suite`` (a pytest plugin, ``-p torch_suite``, and the test module), the suite: it
reads ``BACKEND`` like PyTorch's spawn test, defines ``TestDistBackendWithSpawn``, and, in
the pytest process and in every spawned rank (they import this module to find the class):

* registers the xccl backend under the name ``$XCCL_SUITE_BACKEND`` (default ``xccl_cpu``)
  unless that name is registered already (a package that registers it itself wins); the
  creator is the one registered for ``"xccl"`` by ``import xccl.torch``. The name
  ``"xccl"`` itself is PyTorch's Intel-GPU backend in the suite (skips on it), hence
  the alias;
* declares the alias's features to the suite as PyTorch's own plugin test does for UCC
  (``DistTestCases.backend_feature["plugin"|"gpu"|"ddp"|"subgroup"]``, which Gloo has
  too; not ``"cuda"``): without it the suite skips every DDP and sub-group test and every
  test guarded by ``require_backend_is_available``. ``XCCL_SUITE_FEATURES`` (comma list,
  ``none`` for none) overrides the set.

Per-test timeout (``--timeout``, default 120 s): the suite's own (``DISTRIBUTED_TESTS_DEFAULT_TIMEOUT``
and its per-test overrides, all set to it) terminates the ranks and fails the test; a
watchdog in the driver kills the whole pytest process group if a test runs ``--timeout`` +
60 s, records it as failed ("killed by watchdog") and goes on with the tests after it.
Results come from a pytest hook writing one JSON line per test report as it happens (so a
killed run keeps what it did), cross-checked against pytest's ``--junitxml``.
"""

from __future__ import annotations

import os
import sys

DEFAULT_ALIAS = "xccl_cpu"
DEFAULT_FEATURES = "plugin,gpu,ddp,subgroup"
SUITE_CLASS = "TestDistBackendWithSpawn"
BUILTIN = {"gloo", "nccl", "mpi", "ucc"}


# -------------------------------------------------------------------------------------------
# The suite (module `torch_suite`, imported by pytest and by every spawned rank)
# -------------------------------------------------------------------------------------------


def _ensure_registered(name: str) -> str:
    """Registers the xccl backend under `name` unless it is registered; says what it did."""
    import torch.distributed as dist

    try:
        import xccl.torch  # noqa: F401  (registers "xccl"; a newer package may register `name` too)
    except ImportError as e:
        return f"xccl.torch not importable ({e})"
    if name.lower() in dist.Backend.backend_list:
        return "already registered"
    plugin = getattr(dist.Backend, "_plugins", {}).get("XCCL")
    creator = getattr(plugin, "creator_fn", None) or getattr(xccl.torch, "_create")
    extended = bool(getattr(plugin, "extended_api", False))
    dist.Backend.register_backend(name, creator, extended_api=extended, devices=["cpu"])
    return "registered by torch_suite.py"


def _define_suite() -> None:
    backend = os.environ["BACKEND"]
    timeout = int(os.environ.get("TORCH_SUITE_TIMEOUT", "120"))
    os.environ.setdefault("DISTRIBUTED_TESTS_DEFAULT_TIMEOUT", str(timeout))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")

    import torch
    import torch.testing._internal.common_distributed as cd

    cd.TIMEOUT_DEFAULT = timeout
    for k in list(cd.TIMEOUT_OVERRIDE):
        cd.TIMEOUT_OVERRIDE[k] = timeout

    global REGISTRATION
    REGISTRATION = "built in"
    if backend.lower() not in BUILTIN:
        REGISTRATION = _ensure_registered(backend)
        features = os.environ.get("XCCL_SUITE_FEATURES", DEFAULT_FEATURES)
        for f in features.split(","):
            f = f.strip()
            if f and f != "none":
                cd.DistTestCases.backend_feature.setdefault(f, set()).add(backend)

    # distributed_test reads BACKEND and the feature sets above when it is imported.
    from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend

    class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
        def setUp(self):
            super().setUp()
            self._spawn_processes()
            torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()

    unskip = os.environ.get("TORCH_SUITE_UNSKIP")
    if unskip:
        # Probe mode: run tests the suite keeps for other backends (e.g. "gloo") anyway.
        import re

        pattern = re.compile(unskip, re.IGNORECASE)
        for name in dir(DistributedTest._DistTestBase):
            fn = getattr(DistributedTest._DistTestBase, name)
            why = getattr(fn, "__unittest_skip_why__", None)
            if name.startswith("test_") and getattr(fn, "__unittest_skip__", False) and why and pattern.search(why):
                fn.__unittest_skip__ = False
                UNSKIPPED[name] = why

    TestDistBackendWithSpawn.__module__ = __name__
    TestDistBackendWithSpawn.__qualname__ = SUITE_CLASS  # spawned ranks find it by this name
    globals()[SUITE_CLASS] = TestDistBackendWithSpawn


REGISTRATION = None
UNSKIPPED: dict = {}
if __name__ != "__main__" and os.environ.get("BACKEND") and os.environ.get("TORCH_SUITE_DEFINE") == "1":
    _define_suite()


# -- pytest hooks (active with `-p torch_suite`) ---------------------------------------------


def _progress(record: dict) -> None:
    path = os.environ.get("TORCH_SUITE_PROGRESS")
    if not path:
        return
    import json

    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()


def pytest_runtest_logstart(nodeid, location):
    import time

    _progress({"event": "start", "nodeid": nodeid, "t": time.time()})


def pytest_runtest_logreport(report):
    import time

    if report.when != "call" and report.outcome == "passed":
        return
    if report.when == "call" or report.outcome != "passed":
        if report.outcome == "skipped":
            lr = report.longrepr
            text = lr[2] if isinstance(lr, tuple) and len(lr) == 3 else str(lr)
        else:
            text = getattr(report, "longreprtext", "") or str(report.longrepr)
        captured = "\n".join(c for _, c in report.sections)
        _progress(
            {
                "event": "report",
                "nodeid": report.nodeid,
                "when": report.when,
                "outcome": report.outcome,
                "text": text[-20000:],
                "captured": captured[-20000:],
                "duration": report.duration,
                "t": time.time(),
            }
        )


# -------------------------------------------------------------------------------------------
# Message digests
# -------------------------------------------------------------------------------------------

_EXC_LINE = None


def _exception_lines(text: str) -> list[str]:
    """The 'SomeError: message' lines of tracebacks in `text`, in order."""
    import re

    global _EXC_LINE
    if _EXC_LINE is None:
        _EXC_LINE = re.compile(
            r"^(?:E\s+)?([A-Za-z_][\w.]*(?:Error|Exception|Exit|Failure|Interrupt|SkipTest|Timeout))(?::\s?(.*))?$"
        )
    out = []
    for line in text.splitlines():
        m = _EXC_LINE.match(line.rstrip())
        if m:
            out.append(f"{m.group(1)}: {m.group(2)}" if m.group(2) else m.group(1))
    return out


def failure_reason(text: str, captured: str) -> str:
    """One line saying why a test failed: the exception a rank raised (the last exception
    line of the first rank's traceback), else the parent's exception, else the captured
    output's last exception."""
    import re

    blocks = re.split(r"Process \d+ exited with error code \d+ and exception:", text)
    if len(blocks) > 1:
        first = blocks[1]
        lines = _exception_lines(first)
        if lines:
            return lines[-1]
    lines = _exception_lines(text)
    parent = lines[-1] if lines else (text.strip().splitlines() or [""])[0]
    if re.search(r"Expected exit code|terminated or timed out", parent):
        # The ranks died without reporting through the pipe (crash, init failure, hang):
        # look at what they wrote.
        child = [l for l in _exception_lines(captured) if "SkipTest" not in l]
        if child:
            return f"{parent} [rank said: {child[-1]}]"
    return parent


def skip_reason(text: str, captured: str) -> str:
    import re

    text = text.strip()
    if text.startswith("Skipped: "):
        text = text[len("Skipped: ") :]
    if "Test skipped at subprocess level" in text:
        m = re.findall(r"skipping test \S+ for following reason: (.*)", captured)
        if m:
            return f"{m[-1].strip()} (in the ranks)"
    return text.splitlines()[0] if text else ""


# -------------------------------------------------------------------------------------------
# The driver
# -------------------------------------------------------------------------------------------


def _log(msg: str, logf=None) -> None:
    print(msg, flush=True)
    if logf is not None:
        logf.write(msg + "\n")
        logf.flush()


def _suite_env(backend: str, world_size: int, timeout: int, temp_dir: str) -> dict:
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ)
    env.update(
        BACKEND=backend,
        WORLD_SIZE=str(world_size),
        TEMP_DIR=temp_dir,
        INIT_METHOD=os.environ.get("INIT_METHOD", "env://"),
        TORCH_SUITE_DEFINE="1",
        TORCH_SUITE_TIMEOUT=str(timeout),
        DISTRIBUTED_TESTS_DEFAULT_TIMEOUT=str(timeout),
        PYTHONDONTWRITEBYTECODE="1",
        PYTHONPATH=os.pathsep.join([here] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
    )
    env.setdefault("XCCL_SUITE_BACKEND", DEFAULT_ALIAS)
    # No GPUs for these runs even where torch sees one: the suite compares CPU backends.
    env.setdefault("CUDA_VISIBLE_DEVICES", "")
    return env


def _pytest_cmd(extra: list[str]) -> list[str]:
    here = os.path.dirname(os.path.abspath(__file__))
    return [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "torch_suite",
        "-p",
        "no:cacheprovider",
        "--rootdir",
        here,
        "-o",
        "junit_logging=no",
        *extra,
    ]


def static_skips(env: dict) -> dict:
    """{test: reason} of the tests the suite skips by decorator for this backend (no ranks run)."""
    import json
    import subprocess

    here = os.path.dirname(os.path.abspath(__file__))
    code = (
        "import json, torch_suite as t; from torch.testing._internal.distributed.distributed_test import DistributedTest as D; "
        "B = D._DistTestBase; print(json.dumps({n: getattr(B, n).__unittest_skip_why__ for n in dir(B) "
        "if n.startswith('test_') and getattr(getattr(B, n), '__unittest_skip__', False)}))"
    )
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=here)
    if p.returncode:
        raise SystemExit(f"static skip listing failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def collect(env: dict) -> list[str]:
    import subprocess

    here = os.path.dirname(os.path.abspath(__file__))
    cmd = _pytest_cmd(["--collect-only", "-q", os.path.join(here, "torch_suite.py")])
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=here)
    ids = [l.strip() for l in p.stdout.splitlines() if "::" in l and l.strip().startswith("torch_suite.py::")]
    if not ids:
        raise SystemExit(f"collection found no tests (rc {p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return ids


def _name(nodeid: str) -> str:
    return nodeid.split("::")[-1]


def _parse_junit(path: str) -> dict:
    import xml.etree.ElementTree as ET

    out = {}
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return out
    for case in root.iter("testcase"):
        name = case.get("name")
        outcome = "pass"
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = "fail"
            elif child.tag == "skipped" and outcome == "pass":
                outcome = "skip"
        # A case can carry a failure and an error (teardown); failure wins over skip.
        out[name] = outcome
    return out


def run_suite(backend: str, world_size: int, args, selected: list[str] | None) -> dict:
    """Runs the suite (or `selected` test names) for one backend and world size."""
    import json
    import shutil
    import signal
    import subprocess
    import tempfile
    import time

    here = os.path.dirname(os.path.abspath(__file__))
    args.out_dir = os.path.abspath(args.out_dir)
    os.makedirs(args.out_dir, exist_ok=True)
    tag = f"{backend}_ws{world_size}" + ("_unskip" if args.unskip else "")
    progress = os.path.join(args.out_dir, f"{tag}.progress.jsonl")
    logpath = os.path.join(args.out_dir, f"{tag}.log")
    previous: list[dict] = []
    if os.path.exists(progress):
        if args.resume:
            with open(progress) as f:
                for line in f:
                    try:
                        previous.append(json.loads(line))
                    except ValueError:
                        pass  # a line cut by a kill
        else:
            os.unlink(progress)
    temp_dir = tempfile.mkdtemp(prefix=f"torch_suite_{tag}_")
    os.makedirs(os.path.join(temp_dir, "barrier"), exist_ok=True)
    env = _suite_env(backend, world_size, args.timeout, temp_dir)
    env["TORCH_SUITE_PROGRESS"] = progress
    if args.unskip:
        env["TORCH_SUITE_UNSKIP"] = args.unskip

    started = time.time()
    xccl_before = _xccl_identity()
    logf = open(logpath, "a" if args.resume else "w")
    _log(f"== {tag}: collecting", logf)
    all_ids = collect(env)
    if selected is not None:
        by_name = {_name(i): i for i in all_ids}
        missing = [n for n in selected if n not in by_name]
        if missing:
            raise SystemExit(f"not in the suite: {', '.join(missing)}")
        ids = [by_name[n] for n in selected]
    else:
        ids = all_ids
    if args.k:
        ids = [i for i in ids if args.k in _name(i)]
    if args.unskip and selected is None:
        # Probe only the tests the unskip pattern frees.
        import re

        probe_env = dict(env)
        probe_env.pop("TORCH_SUITE_UNSKIP", None)
        freed = {n for n, why in static_skips(probe_env).items() if re.search(args.unskip, why, re.IGNORECASE)}
        ids = [i for i in ids if _name(i) in freed]
    _log(f"== {tag}: {len(ids)} tests, timeout {args.timeout} s per test", logf)

    results: dict[str, dict] = {}
    junit_outcomes: dict[str, str] = {}
    earlier_wall = 0.0
    if previous:
        # --resume: keep what an interrupted run recorded; a test it started and did not
        # finish runs again. Its wall time: from its first to its last record, per session.
        for rec in previous:
            if rec.get("event") == "report":
                _record(results, rec)
        stamps = [r["t"] for r in previous if "t" in r]
        earlier_wall = max(stamps) - min(stamps) if stamps else 0.0
        results = {n: r for n, r in results.items() if n in {_name(i) for i in ids}}
        _log(f"== {tag}: resuming: {len(results)} tests already recorded", logf)
    remaining = [i for i in ids if _name(i) not in results]
    chunk = 0
    watchdog = args.timeout + 60
    while remaining:
        chunk += 1
        while os.path.exists(os.path.join(args.out_dir, f"{tag}.junit{chunk}.xml")) and previous:
            chunk += 1  # keep an interrupted run's files
        junit = os.path.join(args.out_dir, f"{tag}.junit{chunk}.xml")
        cmd = _pytest_cmd(["-q", "-rN", f"--junitxml={junit}", *remaining])
        offset = os.path.getsize(progress) if os.path.exists(progress) else 0
        out_path = os.path.join(args.out_dir, f"{tag}.pytest{chunk}.out")
        with open(out_path, "w") as out:
            proc = subprocess.Popen(cmd, env=env, cwd=here, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            current, current_t, killed = None, None, None
            seen = set()
            while True:
                rc = proc.poll()
                # Read new progress lines.
                if os.path.exists(progress):
                    with open(progress) as f:
                        f.seek(offset)
                        data = f.read()
                    # Only whole lines.
                    cut = data.rfind("\n") + 1
                    offset += len(data[:cut].encode())
                    for line in data[:cut].splitlines():
                        try:
                            rec = json.loads(line)
                        except ValueError:
                            continue
                        if rec["event"] == "start":
                            current, current_t = rec["nodeid"], time.time()
                        else:
                            _record(results, rec)
                            name = _name(rec["nodeid"])
                            if name not in seen:
                                seen.add(name)
                                r = results[name]
                                _log(f"{len(results):4d}/{len(ids)} {r['outcome']:4s} {r['seconds']:6.1f}s {name}"
                                     + (f"  -- {r['reason'][:160]}" if r["reason"] else ""), logf)
                if rc is not None:
                    break
                if current is not None and current_t is not None and time.time() - current_t > watchdog:
                    if _name(current) not in results:
                        killed = current
                        os.killpg(proc.pid, signal.SIGKILL)
                        proc.wait()
                        break
                    current = None
                time.sleep(0.5)
        junit_outcomes.update(_parse_junit(junit))
        if killed is not None:
            results[_name(killed)] = {
                "outcome": "fail",
                "reason": f"killed by watchdog after {watchdog} s (hang outside the suite's own timeout)",
                "seconds": float(watchdog),
            }
            _log(f"{len(results):4d}/{len(ids)} fail  {_name(killed)}  -- killed by watchdog after {watchdog} s", logf)
        done = {i for i in remaining if _name(i) in results}
        left = [i for i in remaining if i not in done]
        if left and killed is None and not (done or proc.returncode in (0, 1)):
            raise SystemExit(f"pytest failed (rc {proc.returncode}) without running a test; see {out_path}")
        if left and killed is None:
            # pytest ended without running them: record the first as the culprit and go on.
            first = left[0]
            results[_name(first)] = {
                "outcome": "fail",
                "reason": f"pytest exited (rc {proc.returncode}) before reporting it; see {os.path.basename(out_path)}",
                "seconds": 0.0,
            }
            _log(f"pytest exited rc {proc.returncode} with {len(left)} tests not run; marking {_name(first)} failed", logf)
            left = left[1:]
        remaining = left
    wall = time.time() - started + earlier_wall
    shutil.rmtree(temp_dir, ignore_errors=True)

    # Cross-check against JUnit XML.
    mismatches = [n for n, o in junit_outcomes.items() if n in results and results[n]["outcome"] != o]
    for n in mismatches:
        _log(f"warning: {n}: hook says {results[n]['outcome']}, junit says {junit_outcomes[n]}", logf)

    import torch

    ordered = {_name(i): results[_name(i)] for i in ids if _name(i) in results}
    counts = {o: sum(1 for r in ordered.values() if r["outcome"] == o) for o in ("pass", "fail", "skip")}
    doc = {
        "backend": backend,
        "world_size": world_size,
        "alias": env["XCCL_SUITE_BACKEND"],
        "features": env.get("XCCL_SUITE_FEATURES", DEFAULT_FEATURES) if backend not in BUILTIN else None,
        "torch": torch.__version__,
        "xccl": xccl_before,
        "xccl_changed_during_run": _xccl_identity() != xccl_before,
        "timeout_s": args.timeout,
        "unskip": args.unskip,
        "wall_s": round(wall, 1),
        "counts": counts,
        "junit_mismatches": mismatches,
        "tests": ordered,
    }
    path = os.path.join(args.out_dir, f"{tag}.json")
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    _log(f"== {tag}: {counts['pass']} pass, {counts['fail']} fail, {counts['skip']} skip in {wall:.0f} s -> {path}", logf)
    logf.close()
    return doc


def _xccl_identity() -> dict | None:
    """Where the xccl package is and its native module's size and mtime (to tell whether
    another install replaced it during a run)."""
    import glob
    import importlib.util

    spec = importlib.util.find_spec("xccl")
    if spec is None or not spec.origin:
        return None
    pkg = os.path.dirname(spec.origin)
    out = {"path": pkg}
    for so in sorted(glob.glob(os.path.join(pkg, "_xccl*.so"))):
        st = os.stat(so)
        out[os.path.basename(so)] = {"size": st.st_size, "mtime": int(st.st_mtime)}
    return out


def _record(results: dict, rec: dict) -> None:
    name = _name(rec["nodeid"])
    outcome = {"passed": "pass", "failed": "fail", "skipped": "skip"}[rec["outcome"]]
    if outcome == "pass":
        if name not in results:
            results[name] = {"outcome": "pass", "reason": "", "seconds": round(rec["duration"], 2)}
        return
    if outcome == "skip":
        reason = skip_reason(rec["text"], rec.get("captured", ""))
    else:
        reason = failure_reason(rec["text"], rec.get("captured", ""))
        if rec["when"] != "call":
            reason = f"[{rec['when']}] {reason}"
    prev = results.get(name)
    if prev is not None and prev["outcome"] == "fail":
        return  # keep the first failure (call before teardown)
    results[name] = {"outcome": outcome, "reason": reason, "seconds": round(rec["duration"], 2)}


def print_table(doc: dict) -> None:
    tests = doc["tests"]
    width = max((len(n) for n in tests), default=10)
    print(f"\n{'test':{width}s}  {doc['backend']} ws={doc['world_size']}")
    for name, r in tests.items():
        print(f"{name:{width}s}  {r['outcome']:4s} {r['seconds']:6.1f}s  {r['reason'][:200]}")
    c = doc["counts"]
    print(f"{'total':{width}s}  {c['pass']} pass, {c['fail']} fail, {c['skip']} skip; {doc['wall_s']:.0f} s")


# -- comparison -------------------------------------------------------------------------------


def _group_key(reason: str) -> str:
    import re

    key = re.sub(r"0x[0-9a-f]+", "0x…", reason)
    key = re.sub(r"\d+(\.\d+)?", "N", key)
    return key[:240]


def compare(gloo: dict, other: dict) -> tuple[str, dict]:
    """Markdown and JSON: what passes on gloo and not on `other`, grouped by reason."""
    a, b = gloo["tests"], other["tests"]
    name_a, name_b = gloo["backend"], other["backend"]
    ws = other["world_size"]
    lost = {n: b.get(n, {"outcome": "missing", "reason": "not run"}) for n, r in a.items() if r["outcome"] == "pass" and b.get(n, {}).get("outcome") != "pass"}
    gained = [n for n, r in b.items() if r["outcome"] == "pass" and a.get(n, {}).get("outcome") != "pass"]
    gloo_only = {n: r for n, r in b.items() if r["outcome"] == "skip" and "gloo" in r["reason"].lower()}
    groups: dict[tuple, list] = {}
    for n, r in lost.items():
        groups.setdefault((r["outcome"], _group_key(r["reason"])), []).append(n)
    order = sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))

    lines = [f"# torch distributed suite: {name_a} vs {name_b}, WORLD_SIZE={ws}", ""]
    lines.append(f"torch {other.get('torch')}; per-test timeout {other.get('timeout_s')} s; "
                 f"{name_b} features declared: {other.get('features')}")
    lines.append("")
    lines.append(f"| | {name_a} | {name_b} |")
    lines.append("|---|---|---|")
    for o in ("pass", "fail", "skip"):
        lines.append(f"| {o} | {gloo['counts'][o]} | {other['counts'][o]} |")
    lines.append(f"| wall time | {gloo['wall_s']:.0f} s | {other['wall_s']:.0f} s |")
    lines.append("")
    lines.append(f"## Pass on {name_a}, not on {name_b}: {len(lost)} tests, {len(order)} reasons")
    lines.append("")
    for (outcome, _), names in order:
        reason = lost[names[0]]["reason"]
        lines.append(f"### {len(names)} x {outcome}: {reason}")
        for n in sorted(names):
            extra = "" if _group_key(lost[n]["reason"]) == _group_key(reason) else f" ({lost[n]['reason']})"
            lines.append(f"- {n}{extra}")
        lines.append("")
    lines.append(f"## Kept for gloo alone (skipped on {name_b} with a reason naming gloo): {len(gloo_only)}")
    lines.append("")
    lines.append(f"| test | {name_a} | {name_b} skip reason |")
    lines.append("|---|---|---|")
    for n, r in sorted(gloo_only.items()):
        lines.append(f"| {n} | {a.get(n, {}).get('outcome', '-')} | {r['reason']} |")
    lines.append("")
    if gained:
        lines.append(f"## Pass on {name_b}, not on {name_a}: {len(gained)}")
        lines.append("")
        for n in sorted(gained):
            lines.append(f"- {n} ({name_a}: {a.get(n, {}).get('outcome', '-')} {a.get(n, {}).get('reason', '')})")
        lines.append("")
    doc = {
        "world_size": ws,
        "backends": [name_a, name_b],
        "counts": {name_a: gloo["counts"], name_b: other["counts"]},
        "wall_s": {name_a: gloo["wall_s"], name_b: other["wall_s"]},
        "pass_on_gloo_not_other": {
            f"{outcome}: {lost[names[0]]['reason']}": sorted(names) for (outcome, _), names in order
        },
        "gloo_only": {n: r["reason"] for n, r in sorted(gloo_only.items())},
        "pass_on_other_not_gloo": sorted(gained),
    }
    return "\n".join(lines) + "\n", doc


def _write_compare(gloo: dict, other: dict, out_dir: str) -> str:
    import json

    md, doc = compare(gloo, other)
    base = os.path.join(out_dir, f"compare_{other['backend']}_ws{other['world_size']}")
    with open(base + ".md", "w") as f:
        f.write(md)
    with open(base + ".json", "w") as f:
        json.dump(doc, f, indent=1)
    print(md)
    print(f"-> {base}.md, {base}.json")
    return md


def read_subset(path: str) -> list[str]:
    names = []
    with open(path) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if line:
                names.append(line.replace("::", ".").split(".")[-1])
    return names


def main() -> int:
    import argparse
    import json

    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default=os.environ.get("XCCL_SUITE_BACKEND", DEFAULT_ALIAS),
                    help="comma list of backends (default $XCCL_SUITE_BACKEND or xccl_cpu); e.g. gloo,xccl_cpu")
    ap.add_argument("--world-size", default="2", help="comma list, e.g. 2,3 (default 2)")
    ap.add_argument("--timeout", type=int, default=120, help="seconds per test (default 120)")
    ap.add_argument("--subset", help="file of test names (one a line, # comments): run those; exit 1 unless all pass")
    ap.add_argument("--tests", help="comma list of test names (like --subset)")
    ap.add_argument("-k", help="only tests whose name contains this")
    ap.add_argument("--out-dir", default=os.path.join(os.path.dirname(here), "out", "torch_suite"))
    ap.add_argument("--compare", nargs=2, metavar=("GLOO_JSON", "OTHER_JSON"), help="only compare two result files")
    ap.add_argument("--unskip", metavar="REGEX",
                    help="probe: also run tests skipped by decorator with a reason matching REGEX (e.g. gloo), "
                         "only those unless --tests/--subset; results in <backend>_ws<N>_unskip.json")
    ap.add_argument("--resume", action="store_true",
                    help="keep the results an interrupted run recorded (<out-dir>/<tag>.progress.jsonl) and run the rest")
    ap.add_argument("--quiet-table", action="store_true", help="do not print the per-test table")
    args = ap.parse_args()

    if args.compare:
        docs = []
        for p in args.compare:
            with open(p) as f:
                docs.append(json.load(f))
        _write_compare(docs[0], docs[1], os.path.dirname(os.path.abspath(args.compare[1])))
        return 0

    selected = None
    if args.subset:
        selected = read_subset(args.subset)
    if args.tests:
        selected = (selected or []) + [t.strip() for t in args.tests.split(",") if t.strip()]
    backends = [b.strip() for b in args.backend.split(",") if b.strip()]
    sizes = [int(s) for s in args.world_size.split(",")]
    status = 0
    for ws in sizes:
        docs = {}
        for b in backends:
            doc = run_suite(b, ws, args, selected)
            docs[b] = doc
            if not args.quiet_table:
                print_table(doc)
            if selected is not None:
                bad = {n: r for n, r in doc["tests"].items() if r["outcome"] != "pass"}
                if bad:
                    status = 1
                    print(f"\nFAILED: {len(bad)} of {len(doc['tests'])} selected tests did not pass on {b} ws={ws}:")
                    for n, r in bad.items():
                        print(f"  {n}: {r['outcome']}: {r['reason'][:300]}")
                else:
                    print(f"\nOK: all {len(doc['tests'])} selected tests pass on {b} ws={ws} ({doc['wall_s']:.0f} s)")
        if "gloo" in docs and not args.unskip:
            for b, doc in docs.items():
                if b != "gloo":
                    _write_compare(docs["gloo"], doc, args.out_dir)
    return status


if __name__ == "__main__":
    sys.exit(main())
