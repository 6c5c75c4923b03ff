"""`selgate check pkg.mod:fn`: the conformance matrix alone on one outside implementation,
on isolated workers (run by `selgate.lanes.check_run`), with its own JUnit, Markdown report
and verdict.

This process decides the verdict and never imports or calls the kernel:
- the implementation is imported first in a probe process of its own (`probe.py`), under a
  timeout, which hands back its declarations (read there once: the workers build the
  implementation from them, `--check-declared`, so the report declares what ran); an import
  that raises, exits (with any code), dies of a signal or hangs is an error naming that, and
  the verdict is BLOCKED;
- the matrix runs in a child pytest over the installed `selgate.conformance` package (never
  the caller's pytest configuration or plugins), on xdist workers sized as the lanes size
  them, with a per-case timeout; the workers judge, and the kernel runs in executor processes
  they start (`remote.py`), confined (`sandbox.py`) as the probe is: a case that aborts,
  segfaults or leaves a sticky CUDA error fails with how its executor ended, one that hangs
  takes its worker down and becomes that case's error;
- every process the run starts lives in one process group, killed when the run ends;
- the first SIGINT or SIGTERM cuts the run: pytest writes the results it has, and the report
  names the cut and the cases that never ran (exit 1);
- a setting that would change tolerances or the selection (`VERDICT_ENV`) is refused (exit 2).

The families required for a pass follow the declarations. Exit 0 passed, 1 blocked, 2 usage.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from selgate.conformance.check_plugin import verdict_environ
from selgate.conformance.reaper import become_subreaper
from selgate.lanes.check_run import MANIFEST, UsageError, default_workers, prepare_out, run_matrix, writable
from selgate.lanes.cut import mark_signal

from .check_report import CheckVerdict, judge, render, write_stub_junit


def run(args) -> CheckVerdict:
    _no_symlink_to(args.out)
    out = Path(args.out).resolve()
    created = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"--out {out}: cannot make the folder ({e.strerror or e})") from None
    try:
        writable(out)
        return _run(args, out)
    except UsageError:
        if created and out.is_dir() and not any(out.iterdir()):
            out.rmdir()  # a usage error leaves nothing behind
        raise


def _no_symlink_to(out: str) -> None:
    """UsageError where --out, or a folder on the way to it from the current one, is a symlink: a
    pull request can commit `selgate-check -> /elsewhere` beside its kernel, and the check's
    writes, and its removal of an earlier run's reproducers, followed it out of the folder."""
    path, here = Path(os.path.abspath(out)), Path.cwd()
    try:  # below the current folder (the kernel's, a pull request's), every folder on the way
        parts = path.relative_to(here).parts
    except ValueError:  # elsewhere the caller named the folder: the folder itself
        here, parts = path.parent, (path.name,)
    for part in parts:
        here = here / part
        if here.is_symlink():
            raise UsageError(f"--out {out}: {here} is a symlink; name the folder the check may write itself")


def _run(args, out: Path) -> CheckVerdict:
    prepare_out(out)
    before = {p for p in out.rglob("*") if p.is_file()}
    ran = run_matrix(args, out)
    if ran.status is None:  # nothing ran: the import failed or was cut
        write_stub_junit(out, args.impl, ran.load_error or f"cut by {ran.cut} while importing the implementation")
    mark_signal(out, ran.cut)
    verdict = judge(
        ran.impl,
        out,
        ran.status,
        narrowed=bool(args.k),
        load_error=ran.load_error,
        cut=ran.cut,
        size=args.size,
        left_behind=ran.left_behind,
    )
    verdict.isolation = ran.isolation
    verdict.write_repros(out, args)
    (out / "report.md").write_text(render(ran.impl, verdict, args))
    written = [p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file() and p not in before and p.name != MANIFEST]
    (out / MANIFEST).write_text(json.dumps(sorted(written), indent=0) + "\n")
    return verdict


def main(args) -> int:
    """The check of parsed, validated `args` (check_cli.main): exit 0 passed, 1 blocked, 2 usage."""
    refused = verdict_environ()
    if refused:
        names = ", ".join(refused)
        print(
            f"error: {names}: set in the environment; it changes tolerances or what runs, so the check refuses it: unset it",
            file=sys.stderr,
        )
        return 2
    if args.workers is None:
        args.workers = default_workers()
    become_subreaper()
    try:
        verdict = run(args)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(verdict.headline)
    for line in verdict.summary():
        print(f"  {line}", file=sys.stderr)
    print(f"report: {Path(args.out) / 'report.md'}")
    return 0 if verdict.passed else 1


if __name__ == "__main__":
    from .check_cli import main as cli

    sys.exit(cli())
