"""The Markdown report a person reads: families x lanes counts, the blocking lines, each
failure with a one-line repro and its seed, quarantined tests, then the environments.
Kept under GitHub's 1 MiB step-summary limit by dropping failure lines past the budget."""

from __future__ import annotations

import os
import re
import shlex
from collections import Counter
from pathlib import Path

from selgate.conformance.tolerances import ENV as TOL_ENV

from selgate.conformance.reported import HARNESS, OTHER, names
from .gate import GateVerdict
from .results import OUTCOMES

SUMMARY_LIMIT = 1024 * 1024
ENV_KEYS = (
    "gpu",
    "capability",
    "gpu_class",
    "profile",
    "tuned",
    "capability_override",
    "driver",
    "cuda",
    "torch",
    "triton",
    "triton_interpret",
    "python",
    "commit",
    "tolerance_overrides",
    "host",
    "finished",
    "pytest_exitstatus",
)


def _lane_cfg(lane: str) -> dict | None:
    from selgate.lanes.config import LANE_DIR, load_lane

    base = lane.removesuffix("-emulated")
    return load_lane(base) if (LANE_DIR / f"{base}.yaml").exists() else None


def repro_command(case, environment: dict | None) -> str:
    """One shell line re-running `case` alone with its lane's env, size and overrides."""
    cfg = _lane_cfg(case.lane)
    lane_env = {k: str(v) for k, v in ((cfg or {}).get("env") or {}).items()}
    env = {"SELGATE_LANE": case.lane, **lane_env}
    environment = environment or {}
    if environment.get("capability_override", "none") != "none":
        env["SELGATE_CAPABILITY"] = environment["capability_override"]
    if environment.get("tolerance_overrides", "none") != "none":
        env[TOL_ENV] = environment["tolerance_overrides"]
    prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    size = f" --size {cfg['size']}" if cfg else ""
    return f"{prefix} python -m pytest {shlex.quote(case.nodeid)}{size} -p no:xdist"


def _selection(sel: dict | None) -> str:
    """A run's recorded selection in one table cell."""
    if not sel:
        return "?"
    parts = [
        " ".join(sel.get("paths", [])),
        f"-m {sel['m']!r}" if sel.get("m") else "",
        f"-k {sel['k']!r}" if sel.get("k") else "",
        f"--impl {sel['impl']}" if sel.get("impl") else "",
        f"--size {sel.get('size')}",
        *(f"--{o} {' '.join(sel[o])}" for o in ("deselect", "ignore") if sel.get(o)),
        "--lf" if sel.get("last_failed") else "",
    ]
    return " ".join(p for p in parts if p).replace("|", "\\|")


def _cell(counts: dict) -> str:
    cell = "/".join(str(counts[o]) for o in OUTCOMES)
    return f"**{cell}**" if counts["fail"] or counts["error"] else cell


SKIP_REASONS = 6  # the most frequent skip reasons listed per lane
_SKIP_WHERE = re.compile(r"^(Skipped: )?(\S+\.py:\d+: )?")  # pytest's prefix of a skip's message


def skip_summary(results: dict, lanes: list) -> list:
    """Markdown lines: per lane, how many tests skipped and the most frequent reasons, so that a
    report with half its tests skipped says why (a declared lack of support, a GPU-only case)."""
    lines = []
    for name in lanes:
        cases = results[name].cases
        reasons = Counter(_SKIP_WHERE.sub("", c.message)[:160] or "no reason given" for c in cases if c.outcome == "skip")
        if not reasons:
            continue
        skipped = sum(reasons.values())
        lines.append(f"- {name}: {skipped} of {len(cases)} tests skipped ({100 * skipped // max(len(cases), 1)} %)")
        lines += [f"  - {n} x {reason}" for reason, n in reasons.most_common(SKIP_REASONS)]
        rest = skipped - sum(n for _, n in reasons.most_common(SKIP_REASONS))
        lines += [f"  - {rest} x {len(reasons) - SKIP_REASONS} other reason(s)"] if rest else []
    return ["", "## Skips, by reason", "", *lines] if lines else []


SLOWEST = 5  # the slowest tests named per lane


def _secs(s: float) -> str:
    return f"{s:.1f}" if s < 10 else f"{s:.0f}"


def duration_summary(results: dict, lanes: list) -> list:
    """Markdown lines: per lane, the test-seconds its JUnit records (summed over workers, so more
    than the wall time of a parallel run), by family, and its slowest tests."""
    lines = []
    for name in lanes:
        cases = results[name].cases
        total = sum(c.seconds for c in cases)
        if not total:
            continue
        by_family = Counter()
        for c in cases:
            by_family[c.family] += c.seconds
        shares = ", ".join(f"{f} {_secs(s)} s" for f, s in by_family.most_common(4))
        lines.append(f"- {name}: {_secs(total)} test-seconds in {len(cases)} tests; most in {shares}")
        slow = sorted(cases, key=lambda c: -c.seconds)[:SLOWEST]
        lines += [f"  - {c.seconds:.1f} s `{c.nodeid}`" for c in slow if c.seconds]
    return ["", "## Durations", "", *lines] if lines else []


def render(results: dict, verdict: GateVerdict, *, title: str = "selgate gate report", max_bytes: int = SUMMARY_LIMIT) -> str:
    lanes = list(dict.fromkeys([*verdict.required_lanes, *results]))
    present = [n for n in lanes if n in results]
    head = [f"# {title}", "", f"**{verdict.headline}**", ""]
    never = [f"- {lane}: never ran (every case skipped): {'; '.join(what)}" for lane, what in verdict.coverage.items() if what]
    head += ["Not covered by the required lanes' conformance cases:", "", *never, ""] if never else []
    seen = {c.family for r in results.values() for c in r.cases}
    families = [*names(), *(f for f in (HARNESS, OTHER) if f in seen)]
    table = [
        "## Results by family",
        "",
        "Cells: pass/fail/error/skip/xfail.",
        "",
        "| family | " + " | ".join(f"{n}" + ("" if n in results else " (missing)") for n in lanes) + " |",
        "| --- |" + " --- |" * len(lanes),
    ]
    for family in families:
        table.append(
            f"| {family} | " + " | ".join(_cell(results[n].counts(family)) if n in results else "-" for n in lanes) + " |"
        )
    table.append("| **all** | " + " | ".join(_cell(results[n].counts()) if n in results else "-" for n in lanes) + " |")
    blocking = ["", "## Blocking", ""] + ([f"- {b}" for b in verdict.blocking] or ["none"])
    blocking += skip_summary(results, present) + duration_summary(results, present)
    notes = ["", "## Notes", ""] + [f"- {n}" for n in verdict.notes] if verdict.notes else []
    quarantine = (
        notes
        + ["", "## Quarantined (not blocking until expiry)", ""]
        + (
            [
                f"- {c.lane}: {c.outcome} `{c.nodeid}`: owner {e['owner']}, expires {e['expires']}: {e['reason']}"
                for c, e in verdict.quarantined
            ]
            or ["none"]
        )
    )
    env = ["", "## Environment", "", "| | " + " | ".join(present) + " |", "| --- |" + " --- |" * len(present)]
    for key in ENV_KEYS:
        env.append(f"| {key} | " + " | ".join(str((results[n].environment or {}).get(key, "?")) for n in present) + " |")
    env.append("| selection | " + " | ".join(_selection((results[n].environment or {}).get("selection")) for n in present) + " |")
    fixed = "\n".join(head + table + blocking + quarantine + env) + "\n"

    failures = [c for n in present for c in results[n].cases if c.outcome in ("fail", "error")]
    lines, budget = [], max_bytes - len(fixed.encode()) - 2048
    for i, c in enumerate(failures):
        seed = c.seed if c.seed else "none recorded"
        entry = (
            f"- **{c.lane}** {c.outcome} `{c.nodeid}` (seed {seed}): {c.message}\n"
            f"  `{repro_command(c, results[c.lane].environment)}`"
        )
        budget -= len(entry.encode()) + 1
        if budget < 0:
            lines.append(
                f"- ... {len(failures) - i} more failures omitted to stay under {max_bytes} bytes; the merged JUnit has them all"
            )
            break
        lines.append(entry)
    fail_section = ["", "## Failures", ""] + (lines or ["none"])
    return "\n".join(head + table + blocking + fail_section + quarantine + env) + "\n"


def write_report(text: str, path: Path) -> None:
    """Write the report and append it to $GITHUB_STEP_SUMMARY when set, within its limit."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        used = Path(summary).stat().st_size if Path(summary).exists() else 0
        room = SUMMARY_LIMIT - used
        if len(text.encode()) > room:
            text = f"(report of {len(text.encode())} bytes does not fit the step summary; see the {path.name} artifact)\n"
        with open(summary, "a") as f:
            f.write(text)
