"""`selgate check pkg.mod:fn`: the conformance matrix alone on one outside implementation,
on isolated workers, with its own JUnit, Markdown report and verdict.

The matrix runs in a child pytest over the installed `selgate.conformance` package (never
selgate's own unit tests, never the caller's pytest configuration or plugins), on xdist
workers with a per-case timeout: a case that aborts, segfaults, leaves a sticky CUDA error
or hangs takes its worker down and becomes that case's error, and the rest runs on. The
families required for a pass follow the declarations: a forward-only kernel is judged on
what it claims, and the report says what it did not claim. Exit 0 passed, 1 blocked, 2
usage.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from selgate.kernels import settings

from .cases import SIZES
from .check_report import Verdict, judge, render
from .registry import resolve

DEFAULT_OUT = "selgate-check"
MARKERS = "conformance and not policy"  # policy is selgate's own dispatcher, not the kernel's
PLUGINS = ("xdist.plugin", "pytest_timeout", "selgate.conformance.plugin", "selgate.lanes.xdist_gpu", "selgate.reports.stamp")


def default_workers() -> int:
    """Two per visible GPU (cases are small; a second worker hides a crashed one's restart),
    at least 2 and at most the CPU count; 2 on a CPU machine."""
    cpus = os.cpu_count() or 2
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return max(2, min(cpus, 2 * gpus)) if gpus else 2


def pytest_command(args, out: Path, inifile: Path) -> list:
    """The child pytest: the matrix of one implementation, isolated from the caller's
    pytest configuration (an empty ini file) and plugins (autoload off, named with -p)."""
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "--pyargs",
        "selgate.conformance",
        "-c",
        str(inifile),
        "--rootdir",
        str(inifile.parent),
        "-m",
        MARKERS,
        "--impl",
        args.impl,
        "--size",
        args.size,
        "-n",
        str(args.workers),
        "--dist",
        "load",
        "--max-worker-restart",
        "100000",
        "--timeout",
        str(args.timeout),
        "--timeout-method",
        "thread",
        "--junitxml",
        str(out / "junit.xml"),
        "-o",
        "junit_family=xunit2",
        "-p",
        "no:cacheprovider",
        "-q",
        "-rfE",
    ]
    for plugin in PLUGINS:
        cmd[3:3] = ["-p", plugin]
    if args.declare:
        cmd += ["--declare", str(Path(args.declare).resolve())]
    if args.k:
        cmd += ["-k", args.k]
    return cmd


def run(args) -> Verdict:
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("junit.xml", "environment.json", "report.md"):  # never judge an earlier run
        (out / stale).unlink(missing_ok=True)
    impl = resolve(args.impl, declare=args.declare)[0]  # a usage error surfaces here, in-process
    env = {
        **settings.current_environ(),
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
        "SELGATE_LANE": "check",
        # the caller's directory, where `pkg.mod` usually lives, for the workers too
        "PYTHONPATH": os.pathsep.join([os.getcwd(), *filter(None, [os.environ.get("PYTHONPATH")])]),
    }
    with tempfile.TemporaryDirectory(prefix="selgate-check-") as tmp:
        inifile = Path(tmp) / "pytest.ini"
        inifile.write_text("[pytest]\n")
        cmd = pytest_command(args, out, inifile)
        print(f"selgate check {args.impl}: {args.workers} worker(s), size {args.size}, reports in {out}", flush=True)
        status = subprocess.call(cmd, env=env)
    verdict = judge(impl, out, status, narrowed=bool(args.k))
    (out / "report.md").write_text(render(impl, verdict, args))
    return verdict


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="selgate check", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("impl", help="the implementation: package.module:callable, fn(q, k, v, ranges, *, scale=None)")
    p.add_argument("--declare", help="YAML file of declarations and expected failures (see `declarations.py`)")
    p.add_argument("--size", default="tiny", choices=SIZES, help="largest case size class (default tiny)")
    p.add_argument("--out", default=DEFAULT_OUT, help=f"report folder (default ./{DEFAULT_OUT})")
    p.add_argument("--workers", type=int, default=None, help="isolated worker processes (default: 2 per GPU, 2 without one)")
    p.add_argument("--timeout", type=int, default=300, help="seconds one case may take before it is an error")
    p.add_argument("-k", help="pytest -k expression (debugging: the verdict is then BLOCKED as narrowed)")
    args = p.parse_args(argv)
    if args.workers is None:
        args.workers = default_workers()
    if args.workers < 1 or args.timeout < 1:
        p.error("--workers and --timeout must be >= 1 (a crashing case needs a worker to die in)")
    if ":" not in args.impl:
        p.error(
            f"impl: expected package.module:callable, got {args.impl!r} "
            "(selgate's own kernels run through `python -m selgate.lanes run`)"
        )
    sys.path.insert(0, os.getcwd())
    try:
        verdict = run(args)
    except (ValueError, ImportError, AttributeError, TypeError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(verdict.headline)
    for line in verdict.blocking[1:20]:
        print(f"  also blocking: {line}", file=sys.stderr)
    print(f"report: {Path(args.out) / 'report.md'}")
    return 0 if verdict.passed else 1


if __name__ == "__main__":
    sys.exit(main())
