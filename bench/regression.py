"""The performance gate: latest bench results against the committed baseline of the device.

The baseline is `bench/results/<device-slug>/baseline.csv` (promoted from a sweep with
`python -m selgate.bench baseline`); the latest results are the newest CSV under
`bench/results/<device-slug>/<date>/`. A configuration of one of our implementations
(`ours` in the CSV: sdpa, triton, cuda, auto) whose median is more than 10% above the
baseline's, or that now fails where the baseline measured it, blocks the release. Torch
baselines are shown for context (a slower torch explains a slower ratio) but never block.
Configurations the latest run did not measure are listed, not blocking.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from selgate.kernels.config import device_slug

from . import tables

MAX_SLOWDOWN = 0.10


def baseline_path(device_name: str) -> Path:
    return tables.RESULTS_DIR / device_slug(device_name) / "baseline.csv"


@dataclass
class Comparison:
    device: str
    baseline: Path | None
    latest: Path | None
    rows: list[dict] = field(default_factory=list)  # config, method, ours, base_ms, latest_ms, ratio, verdict
    blocking: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def markdown(self) -> str:
        lines = [f"### Performance vs baseline: {self.device}", "",
                 f"baseline: `{self.baseline}`; latest: `{self.latest}`; blocking when an implementation of ours is "
                 f"more than {MAX_SLOWDOWN:.0%} slower (latest / baseline > {1 + MAX_SLOWDOWN:.2f}).", ""]
        lines += [f"- {n}" for n in self.notes]
        if self.blocking:
            lines += ["", f"**{len(self.blocking)} blocking:**"] + [f"- {b}" for b in self.blocking]
        elif self.rows:
            lines += ["", f"No regression over {sum(r['ours'] for r in self.rows)} measured configurations of ours."]
        if self.rows:
            lines += ["", "| config | method | baseline ms | latest ms | ratio | verdict |",
                      "| --- | --- | --- | --- | --- | --- |"]
            for r in sorted(self.rows, key=lambda r: -(r["ratio"] or float("inf"))):
                lines.append(f"| {r['config']} | {r['method']} | {r['base_ms']:.4f} | "
                             f"{'' if r['latest_ms'] is None else format(r['latest_ms'], '.4f')} | "
                             f"{'' if r['ratio'] is None else format(r['ratio'], '.3f')} | {r['verdict']} |")
        return "\n".join(lines) + "\n"


def compare_rows(base: list[dict], latest: list[dict], *, max_slowdown: float = MAX_SLOWDOWN):
    """Rows and blocking lines of `latest` against `base` (each a list of results rows)."""
    now = {(r["config"], r["method"]): r for r in latest}
    rows, blocking = [], []
    for b in base:
        if b["status"] != "ok":
            continue
        r = now.get((b["config"], b["method"]))
        what = f"{b['config']} / {b['method']}"
        if r is None or r["status"] == "skip":
            rows.append({**_key(b), "base_ms": b["ms"], "latest_ms": None, "ratio": None, "verdict": "not measured"})
            continue
        if r["status"] != "ok":
            rows.append({**_key(b), "base_ms": b["ms"], "latest_ms": None, "ratio": None, "verdict": "error"})
            if b["ours"]:
                blocking.append(f"{what}: baseline {b['ms']:.4f} ms, latest failed ({r['note']})")
            continue
        ratio = r["ms"] / b["ms"]
        slower = ratio > 1 + max_slowdown
        verdict = ("BLOCKING" if b["ours"] else "slower (torch baseline)") if slower else "ok"
        rows.append({**_key(b), "base_ms": b["ms"], "latest_ms": r["ms"], "ratio": ratio, "verdict": verdict})
        if slower and b["ours"]:
            blocking.append(f"{what}: baseline {b['ms']:.4f} ms, latest {r['ms']:.4f} ms ({ratio:.2f}x)")
    return rows, blocking


def _key(r: dict) -> dict:
    return {"config": r["config"], "method": r["method"], "ours": r["ours"]}


def compare_to_baseline(device: str, *, latest: Path | None = None, baseline: Path | None = None,
                        max_slowdown: float = MAX_SLOWDOWN) -> Comparison:
    """Compare the newest results of `device` (a name or slug) with its committed baseline.

    Returns a `Comparison`: `.markdown()` is the table, `.blocking` the one-line reasons."""
    baseline = Path(baseline) if baseline else baseline_path(device)
    latest = Path(latest) if latest else tables.latest_csv(device)
    cmp = Comparison(device, baseline if baseline.exists() else None, latest)
    if not baseline.exists():
        cmp.notes.append(f"no committed baseline at {baseline}: nothing to compare "
                         "(`python -m selgate.bench baseline` promotes a sweep)")
        return cmp
    if latest is None:
        cmp.notes.append(f"no results under {tables.RESULTS_DIR / device_slug(device)}: run `python -m selgate.bench sel`")
        return cmp
    cmp.rows, cmp.blocking = compare_rows(tables.read_csv(baseline), tables.read_csv(latest),
                                          max_slowdown=max_slowdown)
    missing = sum(r["verdict"] == "not measured" for r in cmp.rows)
    if missing:
        cmp.notes.append(f"{missing} baseline configurations were not measured in the latest run")
    return cmp
