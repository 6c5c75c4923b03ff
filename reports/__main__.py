"""`python -m selgate.reports {gate,release}`: merge the lanes' JUnit, write the Markdown
report and exit with the verdict (0 passed, 1 blocked, 2 bad policy or arguments)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import yaml

from .gate import POLICY_FILE, evaluate, known_lanes, load_policy, profile_of, required_lanes, utc_today
from .markdown import render, write_report
from .release import render_release
from .results import load_results, merge
from .sanitizer import load_sanitizer
from selgate.tree import tree_stamp

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "reports" / "out"
MAX_LISTED = 20  # blocking lines on the terminal; the report has them all


COMMANDS = {
    "gate": "gate the lanes' results under a gate.yaml profile (default: its default_profile) and write report.md",
    "release": "the gate under the release profile, plus each GPU's benchmarks against its baseline and the "
    "host-cost bars; writes release.md",
}


def parser() -> argparse.ArgumentParser:
    from selgate.cli import prog
    from selgate.cli_args import Parser, command

    p = Parser(prog=prog("python -m selgate.reports"), description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    for name, what in COMMANDS.items():
        c = command(sub, name, what)
        c.add_argument(
            "--lanes",
            help="comma-separated lanes to read and require: they replace the default profile's lanes "
            "(bin/gate gates the lane it ran) and add to any other profile's (a release keeps its GPU lanes)",
        )
        c.add_argument("--profile", help="gate.yaml profile (default: its default_profile; release: release)")
        c.add_argument(
            "--results",
            action="append",
            type=Path,
            help=f"folder of <lane>/junit.xml, repeatable, first wins per lane (default {OUT})",
        )
        c.add_argument("--policy", type=Path, default=POLICY_FILE, help="gate policy YAML")
        c.add_argument("--out", type=Path, default=OUT, help="folder where merged.xml and the report go")
        c.add_argument(
            "--tree",
            type=Path,
            default=ROOT,
            help=f"the checkout being gated, whose commit and files the lanes must have run (default {ROOT})",
        )
    return p


def main(argv=None) -> int:
    p = parser()
    args = p.parse_args(argv)
    lanes = [x for x in (args.lanes or "").split(",") if x] or None
    usage_errors(p, args, lanes)
    if not args.tree.is_dir():
        print(f"error: --tree: {args.tree} is not a directory", file=sys.stderr)
        return 2
    try:
        today = utc_today()
        policy = load_policy(args.policy, today)
        profile = args.profile or ("release" if args.command == "release" else None)
        required = required_lanes(policy, profile, lanes)
        results = load_results(args.results or [OUT], required if lanes else None)
        chosen = profile_of(policy, profile)
        sanitizer = load_sanitizer(args.results or [OUT]) if chosen.get("sanitizer") else None
        verdict = evaluate(
            policy,
            results,
            required,
            today,
            tree=tree_stamp(args.tree),
            same_commit=chosen.get("same_commit", False),
            sanitizer=sanitizer,
            require_sanitizer=chosen.get("sanitizer", False),
        )
    except (ValueError, OSError, yaml.YAMLError) as e:  # a bad policy or lane file, not a verdict
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.command == "release":
        text, name = render_release(results, verdict), "release.md"
    else:
        text, name = render(results, verdict), "report.md"
    try:
        if results:
            merge(results, args.out / "merged.xml")
        write_report(text, args.out / name)
    except OSError as e:
        print(f"error: --out {args.out}: cannot write the report there ({e.strerror or e})", file=sys.stderr)
        return 2
    print(verdict.headline, flush=True)
    for line in verdict.blocking[1:MAX_LISTED]:
        print(f"  also blocking: {line}", file=sys.stderr)
    if len(verdict.blocking) > MAX_LISTED:
        print(f"  ... {len(verdict.blocking) - MAX_LISTED} more in the report", file=sys.stderr)
    print(f"report: {args.out / name}")
    annotate(verdict.blocking[:ANNOTATED])
    return 0 if verdict.passed else 1


def usage_errors(p: argparse.ArgumentParser, args, lanes: list | None) -> None:
    """Exit 2 naming the option for a --results that is no folder and a --lanes entry that is
    neither a lane nor a folder of the results (an ad-hoc lane's)."""
    for path in args.results or []:
        if not path.is_dir():
            p.error(f"--results: {path} is not a folder")
    known = known_lanes()
    held = {d.name for r in (args.results or [OUT]) if r.is_dir() for d in r.iterdir() if d.is_dir()}
    unknown = [x for x in lanes or [] if x not in known and x not in held]
    if unknown:
        p.error(f"--lanes: {', '.join(unknown)}: neither a lane ({', '.join(known)}) nor a folder of the results")


ANNOTATED = 10  # GitHub shows at most 10 error annotations a step


def annotate(blocking: list) -> None:
    """On GitHub Actions, each blocking line as an error annotation on the run's summary page
    (workflow commands: `%`, CR and LF escaped)."""
    if os.environ.get("GITHUB_ACTIONS") != "true":
        return
    for line in blocking:
        text = line.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
        print(f"::error title=selgate gate blocked::{text}")


if __name__ == "__main__":
    sys.exit(main())
