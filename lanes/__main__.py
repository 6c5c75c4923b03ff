"""`python -m selgate.lanes {list,detect,run,durations,sanitize}`: what lanes exist, which one
this machine runs, running it, recording its costly tests, and the compute-sanitizer pass."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from selgate.cli import prog
from selgate.cli_args import Parser, command, positive_number, worker_number
from selgate import env_vars

from .config import lane_names, load_lane
from .detect import detect_lane
from .ordering import COSTLY_S, DURATIONS_DIR, write_durations
from .runner import OUT_ROOT, clear_out, plan_lane, record_refusal, resolve_lane, run_plan
from .sanitize import TIMEOUT_S, TOOLS, run_pass


def _list(_args) -> int:
    detected = None
    try:
        detected = detect_lane().lane
    except ValueError as e:
        print(f"# {e}", file=sys.stderr)
    for name in lane_names():
        lane = load_lane(name)
        mark = "*" if name == detected else " "
        caps = ",".join(map(str, lane["capabilities"])) or "-"
        print(
            f"{mark} {name:<6} capability {caps:<12} size {lane['size']:<6} workers {lane['workers']!s:<7} {lane['description']}"
        )
    return 0


def _detect(args) -> int:
    d = detect_lane()
    if args.name:
        print(d.lane)
        return 0
    print(f"lane {d.lane}: GPU {d.gpu}, compute capability {d.capability or 'none'}")
    plan = plan_lane(load_lane(d.lane), capability=d.capability)
    print("would run: " + shlex.join([f"{k}={v}" for k, v in plan.env.items()] + ["python", "-m", "pytest", *plan.pytest_args]))
    override = env_vars.get("SELGATE_CAPABILITY")
    if override:
        print(
            f"SELGATE_CAPABILITY={override} is set: the dispatcher's policy uses it, "
            "the lane is still chosen by the hardware (see `run --emulate`)"
        )
    return 0


def _run(args) -> int:
    """The lane's output is emptied first; a run refused after that (a bad argument, the wrong
    device) leaves a note naming why, so the gate blocks on it rather than on stale results.
    An output that cannot be emptied stops the run (exit 1), naming it. With --check the run is
    only planned: 0, or 2 naming what is wrong, and reports/out/ is left as it is."""
    if args.lane != "auto" and args.lane not in lane_names():
        raise ValueError(f"lane: expected one of {lane_names()} or 'auto', got {args.lane!r}")
    name, capability = resolve_lane(args.lane)
    out_name = f"{name}-emulated" if args.emulate else name
    if not args.check:
        try:
            clear_out(out_name)
        except OSError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
    try:
        plan = plan_lane(
            load_lane(name),
            capability=capability,
            workers=args.workers,
            k=args.k,
            emulate=args.emulate,
            policy_only=args.policy_only,
            extra=args.pytest_args,
        )
    except ValueError as e:
        if not args.check:
            record_refusal(out_name, str(e))
        raise
    return 0 if args.check else run_plan(plan, docker=args.docker)


def _durations(args) -> int:
    base = args.lane.removesuffix("-emulated")
    if base not in lane_names():
        raise ValueError(f"lane: expected one of {lane_names()}, got {args.lane!r}")
    junit = args.junit or OUT_ROOT / args.lane / "junit.xml"
    if not junit.exists():
        raise ValueError(f"--junit: {junit} does not exist (run `python -m selgate.lanes run {args.lane}` first)")
    dest = DURATIONS_DIR / f"{base}.json"
    data = write_durations(junit, base, dest, args.min_s, add=args.add)
    total = sum(data["tests"].values())
    print(f"{dest}: {len(data['tests'])} tests of >= {args.min_s} s ({total:.0f} s in all), slowest first")
    return 0


def _sanitize(args) -> int:
    """0 when every tool ran clean, 1 when something blocks (the report names it)."""
    result = run_pass(
        [t for t in args.tools.split(",") if t],
        [c for c in (args.cases or "").split(",") if c],
        sanitizer=args.sanitizer,
        timeout_s=args.timeout_s,
    )
    for line in result["blocking"]:
        print(f"blocking: {line}")
    print(f"report: {OUT_ROOT / 'sanitizer' / 'report.md'}")
    return 1 if result["blocking"] else 0


def parser() -> Parser:
    p = Parser(prog=prog("python -m selgate.lanes"), description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    command(sub, "list", "lanes and what each runs (* = detected here)").set_defaults(fn=_list)
    d = command(sub, "detect", "the lane for this machine's GPU class")
    d.add_argument("--name", action="store_true", help="print only the lane name")
    d.set_defaults(fn=_detect)
    r = command(sub, "run", "run a lane's pytest selection into reports/out/<lane>/")
    r.add_argument("lane", help=f"one of {lane_names()} or 'auto'")
    r.add_argument(
        "--workers",
        type=worker_number,
        help="xdist workers (default: the lane's; sm90: as many per GPU as its memory and the CPUs allow)",
    )
    r.add_argument("-k", help="pytest -k expression narrowing the lane")
    r.add_argument("--docker", action="store_true", help="run inside the lane's image")
    r.add_argument(
        "--emulate",
        action="store_true",
        help="run a GPU lane on another GPU under SELGATE_CAPABILITY=<lane's capability>; "
        "results go to reports/out/<lane>-emulated/",
    )
    r.add_argument("--policy-only", action="store_true", help="run only the lane's policy checks")
    r.add_argument(
        "--check",
        action="store_true",
        help="check the arguments and plan the run, then exit (0, or 2 naming what is wrong) "
        "without running or clearing anything; bin/gate checks its arguments so",
    )
    r.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    r.set_defaults(fn=_run)
    du = command(
        sub,
        "durations",
        "record a lane's costly tests (from its last JUnit) as lanes/durations/<lane>.json, which its runs then start first",
    )
    du.add_argument("lane", help=f"one of {lane_names()} (or <lane>-emulated)")
    du.add_argument("--junit", type=Path, help="the lane's JUnit (default reports/out/<lane>/junit.xml)")
    du.add_argument("--min-s", type=positive_number, default=COSTLY_S, help="record tests of at least this many seconds")
    du.add_argument(
        "--add",
        action="store_true",
        help="merge into the lane's file instead of replacing it (a run of tests the lane skips, e.g. `run cpu -- -m slow`)",
    )
    du.set_defaults(fn=_durations)
    sa = command(
        sub,
        "sanitize",
        "the release's compute-sanitizer pass over every GPU kernel, into reports/out/sanitizer/ (needs an SM 9.x GPU)",
    )
    sa.add_argument("--tools", default=",".join(TOOLS), help="comma-separated compute-sanitizer tools")
    sa.add_argument("--cases", help="comma-separated cases of selgate.lanes.sanitize_cases (default all)")
    sa.add_argument("--timeout-s", "--timeout_s", type=positive_number, default=TIMEOUT_S, help="seconds per tool")
    sa.add_argument("--sanitizer", help="path of compute-sanitizer (default: PATH, then $CUDA_HOME/bin)")
    sa.set_defaults(fn=_sanitize)
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.fn(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
