"""The performance gate: latest bench results against the committed baseline of the device.

Baselines are `bench/results/<device-slug>/baseline-<name>.csv`, promoted from a run
with `python -m selgate.bench baseline` (`<name>` is the run's file stem, e.g. `full` for
`--sweep full`); each is compared with the newest `bench/results/<device-slug>/<date>/<name>.csv`,
so a later run of another matrix never stands in for the baselined one. A configuration of one of our implementations
(`ours` in the CSV: sdpa, triton, cuda, auto) whose median is more than 10% above the
baseline's, or that now fails where the baseline measured it, blocks the release, unless the
latest sample was host-bound: its host issue time per call (`host_ms`) reached
`HOST_BOUND` of the timed median, so the GPU waited on Python and the row measured the
host, whose speed varies between machines (on the H100 hosts of this project the pure-torch
gather-then-SDPA baseline ran 1.1-2.3x slower from one machine to the next). Such rows are
reported as host-bound, not blocking, up to `HOST_SPREAD` times the baseline: beyond that
the slowdown is more than a slower host explains and blocks (packed SDPA once took 15-24x
longer on the host, from cuDNN planning each new shape, and passed as host-bound).
A kernel regression shows in the device-bound rows.
A slowdown whose 95% interval overlaps the baseline's (latest `ms_lo` <= baseline `ms_hi`),
both medians taken over at least `MIN_SAMPLES` timed calls (`iters`), is within the
run-to-run noise and is reported as such, never blocking; fewer samples give intervals too
wide to excuse anything. Where both rows
have a CUDA-graph time (`graph_ms`, the device time without host issue gaps), a device time
more than 10% above the baseline's blocks whatever the eager times say: on the H100 a launch
change once made 43 decode rows up to 1.26x slower on the device while their host-bound eager
times hid it. Where the latest row's graph time is within 10% of the baseline's (or, when the
baseline has none, of its eager median, which bounds its device time from above), the kernel
did not get slower on the device and an eager slowdown is the host's: reported, not blocking.
Against a baseline without graph times a device slowdown under a host-bound baseline row can
still pass, and a slowdown of our own launcher's host code always does (host time varies too
much between machines to gate on); promoting a graph-timed baseline closes the first gap.
A graph time is the median of 15 replays issued back to back, a few milliseconds in all, so a
transient that outlasts them (a clock or power state) slows the whole sample: on the H100 two
full sweeps of identical kernel code put 2 and 5 tiny decode rows (3.5-8 us) 1.17-2.15x above
the baseline while the median row moved 0.1 %, and a same-machine A/B of two of them read
within 1.5 % of the baseline. So `sel` re-times a row of ours whose graph time exceeds the
baseline's by more than 10% `RECHECKS` more times, from re-allocated inputs (same seeds), and
keeps the median of all its timings (`recheck_graph`; the row's note lists them; the acceptance
floor check reads that median too): a regression that shows in most timings still blocks, and a
row whose re-timing fails keeps its first timing. The re-timing runs after the sweep, outside
its `--budget-s` (a few rows, well under a second each).
Torch baselines are shown for context (a slower torch explains a slower ratio) but never block.
Configurations the latest run did not measure are listed, not blocking; a baseline whose
matrix has no later run at all blocks (the release would be unmeasured), and the commits the
compared runs measured are shown, so a stale run is visible.

The gate is never vacuous. A device without baselines of its own (an H200, H800, H100 PCIe or
GH200 beside the baselined H100 80GB HBM3) is judged by its GPU class: `configs/classes/<class>.yaml`
names in `bench_baseline` the device whose baselines stand for the class (`--class`, or the class
of the device's compute capability: the lane's `gpu_class` / `gpu_capability`). The two devices'
absolute times differ by their memory and math, so each row is compared as ratios measured in
its own run: its time over the run's copy-bandwidth floor (its bytes at the run's measured
`copy_gbps`: 1 / `frac_copy`) and over the run's matmul floor (its flops at `matmul_tflops`:
1 / `frac_matmul`), each against the same ratio in the class baseline. A row of ours blocks only
when it is more than `MAX_SLOWDOWN` slower on both scales, a slowdown that neither faster or
slower memory nor faster or slower math explains (so it takes the more forgiving scale: with 1.6x
the memory bandwidth and the same matmul rate, a memory-bound row blocks once its time is 10%
above the class baseline's, its copy fraction 1.76x lower); the noise, graph-time and host-bound rules
above apply to the times so scaled, and SDPA's time over the row's in each run is shown beside
it (information). A device that neither its own nor its class's baselines judge blocks, naming
the missing baseline and the commands that make one.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from selgate.kernels.config import device_slug

from . import tables
from .timing import MIN_SAMPLES

MAX_SLOWDOWN = 0.10
RECHECKS = 2  # further graph timings of a row whose first one is beyond MAX_SLOWDOWN
HOST_BOUND = 0.9  # host issue time / timed median from which a sample measured the host
HOST_SPREAD = 4.0  # largest host-bound slowdown put down to the host (machines differed up to 2.3x)


def baseline_path(device_name: str, name: str) -> Path:
    return tables.RESULTS_DIR / device_slug(device_name) / f"baseline-{name}.csv"


def baselines(device_name: str) -> list[Path]:
    return sorted((tables.RESULTS_DIR / device_slug(device_name)).glob("baseline-*.csv"))


@dataclass
class Comparison:
    device: str
    pairs: list[tuple[Path, Path | None]] = field(default_factory=list)  # (baseline, latest run compared)
    rows: list[dict] = field(default_factory=list)  # config, method, ours, base_ms, latest_ms, ratio, verdict
    blocking: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    against: str | None = None  # set where a class baseline judges: "vs class sm90 baseline (...), as ratios ..."

    def markdown(self, max_rows: int = 200) -> str:
        """Blocking lines, then our implementations' rows, slowest ratio first (torch baselines only when slower)."""
        if self.against:
            lines = [
                f"### Performance {self.against}: {self.device}",
                "",
                f"Blocking when an implementation of ours is more than {MAX_SLOWDOWN:.0%} slower on both scales: "
                "its time over this run's copy-bandwidth floor and over its matmul-rate floor, each against the "
                "same ratio in the class baseline (so faster or slower memory or math alone is no regression). "
                "`x sdpa`: SDPA's time over the row's in the same run (information).",
                "",
            ]
        else:
            lines = [
                f"### Performance vs baseline: {self.device}",
                "",
                f"Blocking when an implementation of ours is more than {MAX_SLOWDOWN:.0%} slower "
                f"(latest / baseline > {1 + MAX_SLOWDOWN:.2f}).",
                "",
            ]
        lines += [f"- baseline `{b}` vs latest `{lt}`" for b, lt in self.pairs]
        lines += [f"- {n}" for n in self.notes]
        if self.blocking:
            lines += ["", f"**{len(self.blocking)} blocking:**"] + [f"- {b}" for b in self.blocking]
        elif self.rows:
            lines += [
                "",
                f"No regression over {sum(r['ours'] and r['ratio'] is not None for r in self.rows)} measured "
                "configurations of ours" + (f" {self.against}." if self.against else "."),
            ]
        shown = [r for r in self.rows if r["ours"] or r["verdict"] != "ok"]
        # blocking first (a device slowdown can hide behind an eager ratio near 1), then unmeasured and slowest
        shown.sort(key=lambda r: (not r["verdict"].startswith("BLOCKING"), -(r["ratio"] or float("inf"))))
        if shown:
            lines += [""] + (
                [
                    "| config | method | baseline ms | latest ms | ratio, copy floor | ratio, matmul rate | "
                    "x sdpa (baseline / latest) | verdict |",
                    "| --- | --- | --- | --- | --- | --- | --- | --- |",
                ]
                if self.against
                else ["| config | method | baseline ms | latest ms | ratio | verdict |", "| --- | --- | --- | --- | --- | --- |"]
            )
            for r in shown[:max_rows]:
                cells = [r["config"], r["method"], f"{r['base_ms']:.4f}", _num(r["latest_ms"], ".4f")]
                if self.against:
                    cells += [_num(r["copy"], ".3f"), _num(r["matmul"], ".3f")]
                    cells.append(f"{_num(r['base_vs_sdpa'], '.2f')} / {_num(r['vs_sdpa'], '.2f')}")
                else:
                    cells.append(_num(r["ratio"], ".3f"))
                lines.append("| " + " | ".join(cells + [r["verdict"]]) + " |")
            if len(shown) > max_rows:
                lines.append(f"\n{len(shown) - max_rows} more rows with smaller ratios (the CSVs hold them).")
        return "\n".join(lines) + "\n"


def _num(x, spec: str) -> str:
    return "" if x is None else format(x, spec)


def recheck_graph(
    rows: list[dict], base: list[dict], retime, *, max_slowdown: float = MAX_SLOWDOWN, rechecks: int = RECHECKS
) -> int:
    """Re-time, `rechecks` more times with `retime(row) -> ms`, each row of ours in `rows` whose
    graph time is more than `max_slowdown` above its `base` row's, and keep the median of all
    its timings (module docstring). Returns how many rows were re-timed."""
    by = {(b["config"], b["method"]): b for b in base if b.get("status") == "ok"}
    n = 0
    for r in rows:
        b = by.get((r["config"], r["method"]))
        if b is None or not r.get("ours") or r.get("status") != "ok" or not _graph_slower(r, b, max_slowdown):
            continue
        try:
            times = [r["graph_ms"]] + [retime(r) for _ in range(rechecks)]
        except Exception as e:  # the sweep's rows stand; this one stays as first timed
            _add_note(r, f"graph re-time failed ({type(e).__name__}: {str(e).splitlines()[0][:200]}), first timing kept")
            continue
        r["graph_ms"] = statistics.median(times)
        _add_note(r, f"graph re-timed: {', '.join(f'{t:.4g}' for t in times)} ms, median kept")
        n += 1
    return n


def _graph_slower(r: dict, b: dict, max_slowdown: float) -> bool:
    """Both rows graph-timed and the latest more than `max_slowdown` above the baseline."""
    return None not in (r.get("graph_ms"), b.get("graph_ms")) and r["graph_ms"] > (1 + max_slowdown) * b["graph_ms"]


def _add_note(r: dict, text: str) -> None:
    r["note"] = "; ".join(filter(None, [r.get("note"), text]))


def compare_rows(base: list[dict], latest: list[dict], *, max_slowdown: float = MAX_SLOWDOWN):
    """Rows and blocking lines of `latest` against `base` (each a list of results rows)."""
    rows, blocking = [], []
    for b, r, what in _pairs(base, latest):
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
        host_bound = r.get("host_ms") is not None and r["host_ms"] >= HOST_BOUND * r["ms"]
        noise = (
            None not in (r.get("ms_lo"), b.get("ms_hi"))
            and r["ms_lo"] <= b["ms_hi"]
            and min(_samples(r), _samples(b)) >= MIN_SAMPLES
        )
        if b["ours"] and _graph_slower(r, b, max_slowdown):
            verdict = f"BLOCKING on the device (graph {b['graph_ms']:.4f} -> {r['graph_ms']:.4f} ms)"
            blocking.append(
                f"{what}: device time (CUDA graph) baseline {b['graph_ms']:.4f} ms, latest "
                f"{r['graph_ms']:.4f} ms ({r['graph_ms'] / b['graph_ms']:.2f}x)"
            )
        elif not slower:
            verdict = "ok"
        elif not b["ours"]:
            verdict = "slower (torch baseline)"
        elif noise:
            verdict = f"slower, within noise (interval from {r['ms_lo']:.4f} ms overlaps the baseline's to {b['ms_hi']:.4f})"
        elif r.get("graph_ms") is not None and r["graph_ms"] <= (1 + max_slowdown) * (b.get("graph_ms") or b["ms"]):
            verdict = f"slower eagerly, device time within the baseline (graph {r['graph_ms']:.4f} ms)"
        elif host_bound and ratio <= HOST_SPREAD:
            verdict = f"slower, host-bound (host {r['host_ms']:.4f} ms/call)"
        elif host_bound:
            verdict = f"BLOCKING, host-bound beyond {HOST_SPREAD:g}x (host {r['host_ms']:.4f} ms/call)"
            blocking.append(
                f"{what}: host-bound, but baseline {b['ms']:.4f} ms, latest {r['ms']:.4f} ms "
                f"({ratio:.2f}x) is more than a slower host explains ({HOST_SPREAD:g}x)"
            )
        else:
            verdict = "BLOCKING"
        rows.append({**_key(b), "base_ms": b["ms"], "latest_ms": r["ms"], "ratio": ratio, "verdict": verdict})
        if verdict == "BLOCKING":
            blocking.append(f"{what}: baseline {b['ms']:.4f} ms, latest {r['ms']:.4f} ms ({ratio:.2f}x)")
    return rows, blocking


def _pairs(base: list[dict], latest: list[dict]):
    """(baseline row, the latest row of its configuration or None, its name) for each baseline
    row that measured something."""
    now = _by_config(latest, "latest")
    for b in _by_config(base, "baseline").values():
        if b["status"] == "ok":
            yield b, now.get((b["config"], b["method"])), f"{b['config']} / {b['method']}"


def _samples(r: dict) -> int:
    """Timed calls behind a row's median (0 when not recorded)."""
    try:
        return int(r.get("iters") or 0)
    except (TypeError, ValueError):
        return 0


def _key(r: dict) -> dict:
    return {"config": r["config"], "method": r["method"], "ours": r["ours"]}


def _by_config(rows: list[dict], which: str) -> dict:
    """Rows keyed by (config, method); a repeated key would make the comparison ambiguous."""
    out = {}
    for r in rows:
        key = (r["config"], r["method"])
        if key in out:
            raise ValueError(
                f"{which} results: configuration {key[0]!r} / {key[1]} appears twice; "
                "one row per configuration and method is expected"
            )
        out[key] = r
    return out


def class_bench_baseline(cls: str) -> str | None:
    """The device whose committed baselines stand for GPU class `cls`: the `bench_baseline` key of
    `configs/classes/<cls>.yaml` (read here, so the gate does not depend on how the config loader
    merges class profiles); None without the file or the key."""
    from selgate.kernels import config

    path = Path(config.CONFIG_DIR) / "classes" / f"{cls}.yaml"
    if not path.is_file():
        return None
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping, got {type(data).__name__}")
    name = data.get("bench_baseline")
    return str(name) if name else None


# Compute capability -> GPU class where selgate.kernels.config has no `device_class` of its own.
_CLASSES = {"9.0": "sm90", "8.9": "sm89", "8.0": "sm80", "8.6": "sm80", "8.7": "sm80"}


def gpu_class(capability) -> str | None:
    """GPU class ('sm90') of a compute capability ((9, 0) or '9.0'); None for None or an unknown one."""
    if capability in (None, ""):
        return None
    try:
        from selgate.kernels.config import device_class
    except ImportError:
        text = capability if isinstance(capability, str) else f"{capability[0]}.{capability[1]}"
        return _CLASSES.get(text.strip())
    return device_class(capability)


@dataclass
class Standing:
    """Which committed baselines judge a device: its own (`kind` "device"), its class's ("class":
    those of `source`, the class's `bench_baseline` device), or none (`paths` empty)."""

    kind: str | None
    cls: str | None
    source: str | None
    paths: list[Path]

    @property
    def against(self) -> str:
        return f"vs class {self.cls} baseline ({self.source}), as ratios to this run's floors"


def standing_baselines(device: str, *, device_class: str | None = None, capability=None) -> Standing:
    """The baselines that judge `device`: its own where it has any, else those of the device its
    class (`device_class`, or the class of `capability`) names as `bench_baseline`."""
    cls = device_class or gpu_class(capability)
    own = baselines(device)
    if own:
        return Standing("device", cls, device, own)
    source = class_bench_baseline(cls) if cls else None
    found = baselines(source) if source else []
    return Standing("class", cls, source, found) if found else Standing(None, cls, source, [])


def _shown(path: Path) -> str:
    """`path` relative to the working directory where it lies below it (bench/results/...)."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def missing_baseline(device: str, stand: Standing) -> tuple[str, str]:
    """(blocking line, note on the class) for a device that neither baseline judges."""
    line = (
        f"no committed baseline for {device} ({_shown(tables.RESULTS_DIR / device_slug(device))}/) nor for its class "
        f"{stand.cls or '(unknown)'}: run python -m selgate.bench sel --sweep full and python -m selgate.bench baseline"
    )
    if stand.cls is None:
        note = "the GPU class is unknown: pass `--class` (or the lane's `gpu_class` / `gpu_capability`) to fall back on it"
    elif stand.source is None:
        note = f"configs/classes/{stand.cls}.yaml names no `bench_baseline` device"
    else:
        where = tables.RESULTS_DIR / device_slug(stand.source)
        note = f"class {stand.cls} names {stand.source}, which has no baseline under {where}"
    return line, note


def _floors(r: dict) -> tuple[float | None, float | None]:
    """(copy, matmul) floors of a row in ms: its bytes at the run's copy bandwidth and its flops at
    the run's matmul rate, from the fractions the run recorded (`frac_* = floor / ms`)."""
    ms = r.get("ms")
    copy = mm = None
    if ms and r.get("frac_copy"):
        copy = r["frac_copy"] * ms
    elif r.get("io_bytes") and r.get("copy_gbps"):
        copy = r["io_bytes"] / (r["copy_gbps"] * 1e6)
    if ms and r.get("frac_matmul"):
        mm = r["frac_matmul"] * ms
    elif ms and r.get("tflops") and r.get("matmul_tflops"):
        mm = r["tflops"] / r["matmul_tflops"] * ms
    return copy, mm


def _sdpa_ms(rows: list[dict]) -> dict:
    return {r["config"]: r["ms"] for r in rows if r["method"] == "sdpa" and r.get("status") == "ok" and r.get("ms")}


def _vs_sdpa(r: dict, sdpa: dict) -> float | None:
    """SDPA's time over this row's in the same run (its `speedups` cell, else the sdpa row's)."""
    if r["method"] == "sdpa":
        return 1.0
    got = tables.parse_speedups(r.get("speedups") or "").get("sdpa")
    if got:
        return got
    return sdpa[r["config"]] / r["ms"] if r["config"] in sdpa and r.get("ms") else None


def compare_class_rows(base: list[dict], latest: list[dict], *, against: str, max_slowdown: float = MAX_SLOWDOWN):
    """Rows and blocking lines of `latest` (one device's run) against `base` (the class baseline,
    another device's run), as ratios to each run's own floors (module docstring).

    A row's slowdown on a scale is its time over that floor, against the same ratio in the
    baseline: `(t / floor) / (t_base / floor_base)`. It counts as slower only when it is beyond
    `max_slowdown` on both the copy and the matmul scale, i.e. `t / (t_base * K) > 1 + max_slowdown`
    with K the larger of the two floor ratios; the noise, graph and host-bound rules of
    `compare_rows` then apply to the times so scaled."""
    sdpa_base, sdpa_now = _sdpa_ms(base), _sdpa_ms(latest)
    lim = 1 + max_slowdown
    rows, blocking = [], []
    for b, r, what in _pairs(base, latest):
        row = {**_key(b), "base_ms": b["ms"], "latest_ms": None, "ratio": None, "copy": None, "matmul": None}
        row["base_vs_sdpa"], row["vs_sdpa"] = _vs_sdpa(b, sdpa_base), None
        if r is None or r["status"] == "skip":
            rows.append({**row, "verdict": "not measured"})
            continue
        if r["status"] != "ok":
            rows.append({**row, "verdict": "error"})
            if b["ours"]:
                blocking.append(f"{what}: measured {against} ({b['ms']:.4f} ms there), latest failed ({r['note']})")
            continue
        row.update(latest_ms=r["ms"], vs_sdpa=_vs_sdpa(r, sdpa_now))
        fb, fl = _floors(b), _floors(r)
        if None in fb + fl or 0 in fb + fl:
            rows.append({**row, "verdict": "BLOCKING, no floors recorded" if b["ours"] else "no floors recorded"})
            if b["ours"]:
                gone = "baseline" if None in fb or 0 in fb else "latest run"
                blocking.append(f"{what}: the {gone} recorded no copy or matmul floor, so it cannot be compared {against}")
            continue
        k_copy, k_mm = fl[0] / fb[0], fl[1] / fb[1]  # how much longer this run's floors are than the baseline's
        k = max(k_copy, k_mm)
        ratio = r["ms"] / (b["ms"] * k)
        row.update(ratio=ratio, copy=r["ms"] / (b["ms"] * k_copy), matmul=r["ms"] / (b["ms"] * k_mm))
        both_graph = None not in (r.get("graph_ms"), b.get("graph_ms"))
        graph_ratio = r["graph_ms"] / (b["graph_ms"] * k) if both_graph else None
        host_bound = r.get("host_ms") is not None and r["host_ms"] >= HOST_BOUND * r["ms"]
        noise = (
            None not in (r.get("ms_lo"), b.get("ms_hi"))
            and r["ms_lo"] / k <= b["ms_hi"]
            and min(_samples(r), _samples(b)) >= MIN_SAMPLES
        )
        scales = f"{row['copy']:.2f}x on the copy floor, {row['matmul']:.2f}x on the matmul rate"
        if b["ours"] and both_graph and graph_ratio > lim:
            verdict = f"BLOCKING on the device (graph {b['graph_ms']:.4f} -> {r['graph_ms']:.4f} ms, {graph_ratio:.2f}x)"
            blocking.append(
                f"{what}: device time (CUDA graph) {r['graph_ms'] / (b['graph_ms'] * k_copy):.2f}x on the copy floor, "
                f"{r['graph_ms'] / (b['graph_ms'] * k_mm):.2f}x on the matmul rate {against} "
                f"(graph {b['graph_ms']:.4f} ms there, {r['graph_ms']:.4f} ms here)"
            )
        elif ratio <= lim:
            verdict = "ok"
        elif not b["ours"]:
            verdict = "slower (torch baseline)"
        elif noise:
            verdict = (
                f"slower, within noise (interval from {r['ms_lo']:.4f} ms, scaled by the floors, "
                f"overlaps the baseline's to {b['ms_hi']:.4f})"
            )
        elif r.get("graph_ms") is not None and r["graph_ms"] / ((b.get("graph_ms") or b["ms"]) * k) <= lim:
            verdict = f"slower eagerly, device time within the baseline (graph {r['graph_ms']:.4f} ms)"
        elif host_bound and ratio <= HOST_SPREAD:
            verdict = f"slower, host-bound (host {r['host_ms']:.4f} ms/call)"
        elif host_bound:
            verdict = f"BLOCKING, host-bound beyond {HOST_SPREAD:g}x (host {r['host_ms']:.4f} ms/call)"
            blocking.append(f"{what}: host-bound, but {scales} {against} is more than a slower host explains ({HOST_SPREAD:g}x)")
        else:
            verdict = "BLOCKING"
            blocking.append(f"{what}: {scales} {against} ({b['ms']:.4f} ms there, {r['ms']:.4f} ms here)")
        rows.append({**row, "verdict": verdict})
    return rows, blocking


def compare_to_baseline(
    device: str, *, device_class: str | None = None, capability=None, max_slowdown: float = MAX_SLOWDOWN
) -> Comparison:
    """Compare the newest results of `device` (a name or slug) with its committed baselines, or,
    without any, with those of its GPU class (`device_class`, or the class of `capability`) as
    ratios to each run's floors; with neither, the comparison blocks naming what is missing.

    Returns a `Comparison`: `.markdown()` is the table, `.blocking` the one-line reasons."""
    stand = standing_baselines(device, device_class=device_class, capability=capability)
    cmp = Comparison(device, against=stand.against if stand.kind == "class" else None)
    if stand.kind is None:
        line, note = missing_baseline(device, stand)
        cmp.blocking.append(line)
        cmp.notes.append(note)
        return cmp
    for base in stand.paths:
        name = base.stem.removeprefix("baseline-")
        latest = tables.latest_csv(device, name)
        cmp.pairs.append((base, latest))
        if latest is None:
            where = tables.RESULTS_DIR / device_slug(device)
            cmp.blocking.append(
                f"{base.name}"
                + (f" of class {stand.cls} ({stand.source})" if stand.kind == "class" else "")
                + f": no `{name}.csv` run under {where}; run the same matrix again"
            )
            continue
        latest_rows = tables.read_csv(latest)
        cmp.notes.append(f"`{latest.name}` measured commit {', '.join(measured_commits(latest_rows))}")
        _judge(cmp, stand, tables.read_csv(base), latest_rows, max_slowdown)
    missing = sum(r["verdict"] == "not measured" for r in cmp.rows)
    if missing:
        cmp.notes.append(f"{missing} baseline configurations were not measured in the latest run")
    return cmp


def measured_commits(rows: list[dict]) -> list[str]:
    """The commits a results table's rows say they measured (its `software` column)."""
    return sorted({str(r.get("software") or "").partition("commit ")[2] or "unrecorded" for r in rows})


def _judge(cmp: Comparison, stand: Standing, base: list[dict], latest: list[dict], max_slowdown: float) -> None:
    """Add `latest`'s rows against `base` to `cmp`: as ratios to the floors where a class baseline stands."""
    if stand.kind == "class":
        rows, blocking = compare_class_rows(base, latest, against=stand.against, max_slowdown=max_slowdown)
    else:
        rows, blocking = compare_rows(base, latest, max_slowdown=max_slowdown)
    cmp.rows += rows
    cmp.blocking += blocking


def compare_smoke(
    device: str, path: Path, *, device_class: str | None = None, capability=None, max_slowdown: float = MAX_SLOWDOWN
) -> Comparison:
    """A lane's perf smoke (`path`, the `smoke` preset's CSV: a few of `full`'s configurations)
    against the same configurations in the standing `full` baseline, the device's or its class's,
    by the rules of `compare_to_baseline`. A smoke that no baseline judges, or whose
    configurations the baseline lacks, blocks: a smoke that compares nothing is no pass."""
    from .presets import SMOKE_BASELINE

    stand = standing_baselines(device, device_class=device_class, capability=capability)
    cmp = Comparison(device, against=stand.against if stand.kind == "class" else None)
    base = next((p for p in stand.paths if p.stem == f"baseline-{SMOKE_BASELINE}"), None)
    if stand.kind is None:
        line, note = missing_baseline(device, stand)
        cmp.blocking.append(line)
        cmp.notes.append(note)
        return cmp
    if base is None:
        cmp.blocking.append(f"no baseline-{SMOKE_BASELINE}.csv among {', '.join(_shown(p) for p in stand.paths)}")
        return cmp
    latest = tables.read_csv(path)
    timed = {(r["config"], r["method"]) for r in latest}
    base_rows = [r for r in tables.read_csv(base) if (r["config"], r["method"]) in timed]
    cmp.pairs.append((base, path))
    cmp.notes.append(f"`{path.name}` measured commit {', '.join(measured_commits(latest))}")
    if not base_rows:
        cmp.blocking.append(f"{_shown(base)} holds none of the smoke's {len(timed)} rows")
        return cmp
    _judge(cmp, stand, base_rows, latest, max_slowdown)
    missing = [r for r in cmp.rows if r["ours"] and r["verdict"] == "not measured"]
    cmp.blocking += [f"{r['config']} / {r['method']}: the smoke did not measure it" for r in missing]
    return cmp
