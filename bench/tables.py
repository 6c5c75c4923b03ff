"""Result tables: one CSV row and one Markdown line per (configuration, method).

Files go to `bench/results/<device-slug>/<date>/<name>.csv` and `.md` (`./bench-results/...` run
outside the checkout's root: `results_dir`). The CSV is the machine-readable record (the
threshold optimiser and the regression gate read it); the Markdown is for people. Effective
rates count only the selected keys (the useful work), so a dense baseline that reads every key
shows a low GB/s rather than a flattering one.
"""

from __future__ import annotations

import csv
import math
import datetime as dt
from pathlib import Path

from selgate import env_vars
from selgate.kernels.config import device_slug

RESULTS_DIR = env_vars.get("SELGATE_BENCH_RESULTS") or Path(__file__).resolve().parent / "results"

COLUMNS = [
    "config",
    "kind",
    "dtype",
    "B",
    "S",
    "G",
    "h",
    "D",
    "Dv",
    "S_kv",
    "L",
    "dist",
    "kv_layout",
    "L_max",
    "method",
    "ours",
    "status",
    "ms",
    "ms_lo",
    "ms_hi",
    "iters",
    "host_ms",
    "graph_ms",
    "kv_bytes",
    "io_bytes",
    "gbps",
    "tflops",
    "frac_copy",
    "frac_matmul",
    "speedups",
    "kernel_config",
    "note",
    "device",
    "copy_gbps",
    "matmul_tflops",
    "software",
]


def _write_root() -> Path:
    """RESULTS_DIR where it was set (SELGATE_BENCH_RESULTS) or the command runs in the root of the
    checkout it belongs to; else ./bench-results: a run from a user's folder never writes into
    site-packages, or into the checkout an editable install points at (a table written there
    changed the tree a release gates)."""
    packaged = Path(__file__).resolve().parent / "results"
    checkout = packaged.parent.parent
    if Path(RESULTS_DIR) != packaged or (Path.cwd().resolve() == checkout and (checkout / "pyproject.toml").is_file()):
        return Path(RESULTS_DIR)
    return Path.cwd() / "bench-results"


def results_dir(device_name: str, date: str | None = None) -> Path:
    """Where a run's tables go by default: `_write_root()`/<device>/<date>."""
    return _write_root() / device_slug(device_name) / (date or dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d"))


def write_csv(rows: list[dict], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="raise")
        w.writeheader()
        w.writerows({k: f"{v:.6g}" if isinstance(v, float) else v for k, v in r.items()} for r in rows)
    return path


def read_csv(path: Path) -> list[dict]:
    """Rows of a results CSV with numeric columns parsed (empty cells become None)."""
    numeric = {"B", "S", "G", "h", "D", "Dv", "S_kv", "L", "L_max", "iters", "kv_bytes", "io_bytes"}
    real = {
        "ms",
        "ms_lo",
        "ms_hi",
        "host_ms",
        "graph_ms",
        "gbps",
        "tflops",
        "frac_copy",
        "frac_matmul",
        "copy_gbps",
        "matmul_tflops",
    }
    with Path(path).open(newline="") as f:
        rows = list(csv.DictReader(f))
    missing = {"config", "method", "status", "ms"} - set(rows[0] if rows else COLUMNS)
    if missing:
        raise ValueError(f"{path}: not a selgate results CSV, missing columns {sorted(missing)}")
    for line, r in enumerate(rows, start=2):
        for key in numeric | real:
            if key in r:
                try:
                    r[key] = None if r[key] in ("", None) else (int(float(r[key])) if key in numeric else float(r[key]))
                except ValueError:
                    raise ValueError(f"{path}: line {line}, column {key}: expected a number, got {r[key]!r}") from None
        r["ours"] = r.get("ours") in ("True", "true", "1")
    return rows


def parse_speedups(cell: str) -> dict[str, float]:
    """'sdpa=2.10;gather_sdpa=5.3' -> {'sdpa': 2.1, 'gather_sdpa': 5.3}."""
    return {k: float(v) for k, v in (item.split("=") for item in cell.split(";") if item)} if cell else {}


def _fmt(x, spec: str) -> str:
    return "" if x in (None, "") else format(x, spec)


def markdown(rows: list[dict], title: str) -> str:
    head = rows[0] if rows else {}
    lines = [
        f"# {title}",
        "",
        f"Device: {head.get('device', '?')}; measured in this run: copy {_fmt(head.get('copy_gbps'), '.0f')} GB/s, "
        f"matmul {_fmt(head.get('matmul_tflops'), '.1f')} TFLOP/s; {head.get('software', '?')}. "
        "Median of the timed calls with its 95% interval (back-to-back eager calls: the host's issue time "
        "counts where it exceeds the device's); `graph ms`: the same calls replayed from a CUDA graph, the "
        "device time alone (decode, capturable methods); rates count the selected keys only and use `ms`; "
        "speedup = other method's ms / this method's ms.",
        "",
        "| config | method | ms | 95% interval | graph ms | speedup | GB/s | TFLOP/s | % copy | % matmul | note |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        ok = r["status"] == "ok"
        lines.append(
            "| "
            + " | ".join(
                [
                    r["config"],
                    r["method"],
                    _fmt(r["ms"], ".4f") if ok else r["status"],
                    f"{r['ms_lo']:.4f}-{r['ms_hi']:.4f}" if ok else "",
                    _fmt(r.get("graph_ms"), ".4f"),
                    ", ".join(f"{k} {v:.2f}x" for k, v in parse_speedups(r["speedups"]).items()),
                    _fmt(r["gbps"], ".0f"),
                    _fmt(r["tflops"], ".2f"),
                    _fmt(ok and 100 * r["frac_copy"], ".0f"),
                    _fmt(ok and 100 * r["frac_matmul"], ".1f"),
                    r["note"].replace("|", "/")[:160],
                ]
            )
            + " |"
        )
    return "\n".join(lines) + "\n"


def write_tables(rows: list[dict], out_dir: Path, name: str) -> tuple[Path, Path]:
    csv_path = write_csv(rows, out_dir / f"{name}.csv")
    md_path = out_dir / f"{name}.md"
    md_path.write_text(markdown(rows, f"selgate bench `{name}`"))
    return csv_path, md_path


# CSVs of other layouts in the same date folders (bench/host.py's), never a results table
OTHER_CSVS = ("host",)


def latest_csv(device_name: str, name: str | None = None) -> Path | None:
    """Newest results CSV of a device (by date folder, then modification time), of file stem
    `name` when given (e.g. 'full' for `--sweep full` runs; without it, not one of OTHER_CSVS)."""
    root = RESULTS_DIR / device_slug(device_name)
    found = [p for p in root.glob(f"*/{name or '*'}.csv") if name or p.stem not in OTHER_CSVS]
    return max(found, key=lambda p: (p.parent.name, p.stat().st_mtime), default=None)


def _geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def summary(rows: list[dict], paths) -> str:
    """Short Markdown printed last: limits, status counts, per-method speedup over packed SDPA."""
    head = rows[0] if rows else {}
    count = {s: sum(r["status"] == s for r in rows) for s in ("ok", "skip", "error")}
    lines = [
        "## selgate bench summary",
        "",
        f"- device: {head.get('device', '?')}; copy {_fmt(head.get('copy_gbps'), '.0f')} GB/s, "
        f"matmul {_fmt(head.get('matmul_tflops'), '.1f')} TFLOP/s (measured in this run)",
        f"- {len({r['config'] for r in rows})} configs: {count['ok']} measured, {count['skip']} skipped, {count['error']} errors",
        "",
        "| method | measured | geomean speedup vs sdpa | median % copy bw |",
        "| --- | --- | --- | --- |",
    ]
    for m in dict.fromkeys(r["method"] for r in rows):
        ok = [r for r in rows if r["method"] == m and r["status"] == "ok"]
        vs = [x for x in (parse_speedups(r["speedups"]).get("sdpa") for r in ok) if x]  # sdpa_ms / this ms
        fr = sorted(r["frac_copy"] for r in ok if r["frac_copy"] is not None)
        lines.append(
            f"| {m} | {len(ok)} | {_fmt(_geomean(vs) if vs else None, '.2f')} | "
            f"{_fmt(100 * fr[len(fr) // 2] if fr else None, '.0f')} |"
        )
    errors = [r for r in rows if r["status"] == "error"]
    if errors:
        lines += ["", "errors (first 5):"] + [f"- {r['config']} / {r['method']}: {r['note']}" for r in errors[:5]]
    lines += ["", "files: " + ", ".join(str(p) for p in paths)]
    return "\n".join(lines)
