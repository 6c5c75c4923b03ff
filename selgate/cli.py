"""`selgate <tool> ...`: one console script for the package's command-line modules. `lanes` and
`reports` run and gate a checkout's own lanes (they read its pyproject.toml and write under its
reports/out/), so the wheel offers them only inside a checkout."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

TOOLS = {
    "check": ("selgate.reports.check_cli", "run the conformance matrix on your kernel: selgate check pkg.mod:fn"),
    "bench": ("selgate.bench", "benchmarks: timing against the baselines, thresholds, tuning"),
    "lanes": ("selgate.lanes", "run this checkout's lane for the detected GPU class (checkout only)"),
    "reports": ("selgate.reports", "merge the lanes' results and gate on them (checkout only)"),
}
CHECKOUT_ONLY = ("lanes", "reports")


def checkout() -> Path | None:
    """The selgate checkout this package runs from (an editable install), or None (a wheel)."""
    root = Path(__file__).resolve().parent.parent
    return root if (root / "pyproject.toml").is_file() and (root / "lanes").is_dir() else None


def prog(module_prog: str) -> str:
    """A tool's name in its usage lines: `selgate <tool>` when run through this script (main sets
    argv[0] so), else the `python -m` form it was started with."""
    return sys.argv[0] if sys.argv[0].startswith("selgate ") else module_prog


def usage() -> str:
    here = checkout()
    lines = ["usage: selgate <tool> [arguments]   (selgate <tool> --help for each)", "", "tools:"]
    for name, (_, what) in TOOLS.items():
        if here is not None or name not in CHECKOUT_ONLY:
            lines.append(f"  {name:8} {what}")
    if here is None:
        lines += ["", f"{' and '.join(CHECKOUT_ONLY)}: from a checkout of selgate (git clone, then bash bin/gate)"]
    return "\n".join(lines)


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("-h", "--help"):
        print(usage())
        sys.exit(0)
    if not argv or argv[0] not in TOOLS:
        print(usage() + (f"\n\nselgate: unknown tool {argv[0]!r}" if argv else ""), file=sys.stderr)
        sys.exit(2)
    if argv[0] in CHECKOUT_ONLY and checkout() is None:
        print(
            f"selgate {argv[0]}: runs a checkout's own lanes and results, and this selgate is installed from a wheel; "
            "clone the repository (bash bin/gate there), or check your kernel with `selgate check pkg.mod:fn`",
            file=sys.stderr,
        )
        sys.exit(2)
    sys.argv = [f"selgate {argv[0]}", *argv[1:]]  # kept (alter_sys=False): usage lines say `selgate <tool>`
    runpy.run_module(TOOLS[argv[0]][0], run_name="__main__", alter_sys=False)
