"""Host cost per decode call of each selection path, against SDPA's on the same inputs.

Why: where issuing a decode call takes the host longer than the kernel takes the device, the
GPU waits on Python (probes/launch_overhead.py found where that time goes). Per shape and path,
in one process on one device, medians of REPEATS rounds, each round one loop of `--calls`
back-to-back calls of every path of the shape in turn (SDPA's among them), so a host that
speeds up or slows down during the run moves every path alike, not one path's ratio:
- host_us: perf_counter around the loop, no synchronisation inside (the issue time; past about
  a thousand queued launches it also waits for the queue); wall_us: up to the sync after it;
- graph_us: device time per call from CUDA-graph replay (timing.time_graph); why a call could
  not be captured goes to `note`;
- host_x_sdpa = host_us / sdpa's host_us of the shape; eager_x_graph = wall_us / graph_us.
One input set per shape: the question is the host's, not the cache's. A path that cannot run
here is a row with a status, not a stopped run. `host_checks` holds the bars (release report).

    selgate bench host [--calls 200] [--warmup 20] [--out FILE.csv]   (writes FILE.md beside it)
"""

from __future__ import annotations

import csv
import datetime as dt
import inspect
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F

from selgate.kernels import reset_stats, selection_attention, stats
from selgate.kernels.config import current_device_name
from selgate.kernels.served import run_environment
from selgate.cli import prog
from selgate.cli_args import Parser, count, positive_int

from . import tables
from .inputs import decode_problem, make_inputs
from .timing import time_graph

DTYPE = "bfloat16"
# name -> (problem, keys per range): spaced ranges of that many keys (n = L / keys); 0: the
# problem's own NSA-builder ranges
SHAPES = {
    "a": (decode_problem(1, 16, 128, 128, 8 * 64, "few", DTYPE, G=8, S_kv=8192), 64),
    "b": (decode_problem(4, 4, 64, 64, 8 * 32, "few", DTYPE, G=8, S_kv=4096), 32),
    "c": (decode_problem(1024, 8, 128, 128, 512, "many", DTYPE), 0),
}
REPEATS = 5
COLUMNS = ["shape", "B", "G", "h", "D", "S_kv", "n", "path", "status", "host_us", "wall_us", "graph_us", "host_x_sdpa",
           "eager_x_graph", "note", "device", "torch", "triton", "commit", "date"]  # fmt: skip
INTS = ("B", "G", "h", "D", "S_kv", "n")
FLOATS = ("host_us", "wall_us", "graph_us", "host_x_sdpa", "eager_x_graph")


def spaced_ranges(B: int, G: int, n: int, keys: int, S_kv: int, gen: torch.Generator) -> torch.Tensor:
    """Decode ranges [B, 1, G, n, 2] of `keys` keys at n distinct random slots, a gap after each:
    sorted, disjoint, not adjacent and below S_kv (= t + 1), i.e. already normal."""
    slots = torch.rand(B, 1, G, S_kv // (2 * keys), generator=gen, device=gen.device)
    start = slots.argsort(-1)[..., :n].sort(-1).values * (2 * keys)
    return torch.stack([start, start + keys], -1).to(torch.int32)


def shape_inputs(name: str, device):
    p, keys = SHAPES[name]
    x = make_inputs(p, seed=0, device=device)
    gen = torch.Generator(device=device).manual_seed(1)
    return replace(x, ranges=spaced_ranges(p.B, p.G, p.L // keys, keys, p.S_kv, gen)) if keys else x


def paths(x) -> dict:
    """Per path the call to time, or the status saying why it cannot run. The explicit
    backends are strict: a fallback would time another backend under their name."""
    q, k, v, r = x.q, x.k, x.v, x.ranges
    B, _, G, h, D = q.shape
    q_sdpa = q.reshape(B, G * h, 1, D)
    sel = selection_attention
    unsupported = "unsupported: selection_attention has no `normalized` keyword"
    normal = "normalized" in inspect.signature(sel).parameters
    return {
        "sdpa": lambda: F.scaled_dot_product_attention(q_sdpa, k, v, enable_gqa=True),
        "auto": lambda: sel(q, k, v, r),
        "auto_normalized": (lambda: sel(q, k, v, r, normalized=True)) if normal else unsupported,
        "triton": lambda: sel(q, k, v, r, backend="triton", strict=True),
        "cuda": lambda: sel(q, k, v, r, backend="cuda", strict=True),
        "cuda_normalized": (lambda: sel(q, k, v, r, backend="cuda", strict=True, normalized=True)) if normal else unsupported,
    }


def one_line(e: Exception) -> str:
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:200]}"


def interleaved_us(calls_by_path: dict, calls: int, sync=None) -> dict:
    """{path: (host_us, wall_us)} per call: medians over REPEATS rounds of one loop of `calls`
    back-to-back calls per path, the paths taking turns within each round."""
    sync = sync or torch.cuda.synchronize
    host = {p: [] for p in calls_by_path}
    wall = {p: [] for p in calls_by_path}
    for _ in range(REPEATS):
        for path, call in calls_by_path.items():
            sync()
            t0 = time.perf_counter()
            for _ in range(calls):
                call()
            t1 = time.perf_counter()
            sync()
            host[path].append(t1 - t0)
            wall[path].append(time.perf_counter() - t0)
    return {p: (statistics.median(host[p]) * 1e6 / calls, statistics.median(wall[p]) * 1e6 / calls) for p in calls_by_path}


def prepare(call, warmup: int) -> dict:
    """The path's first call (which backend served it) and its warm-up; a path that raises is
    a status: a path that cannot run here is a finding of the run, not its end."""
    try:
        reset_stats()
        call()
        served = ",".join(stats()["calls"])  # the dispatcher's backend for this call (none for sdpa)
        for _ in range(warmup):
            call()
    except Exception as e:
        return {"status": f"error: {one_line(e)}"}
    return {"status": "ok", "note": f"served by {served}" if served else ""}


def graph_time(call, note: str) -> dict:
    """graph_us of the path, or why the call could not be captured (in `note`)."""
    try:
        return {"graph_us": time_graph([call], torch.device("cuda")).median_ms * 1e3}
    except Exception as e:
        return {"note": "; ".join(filter(None, [note, f"graph capture failed: {one_line(e)}"]))}


def add_ratios(rows: list[dict]) -> list[dict]:
    sdpa = {r["shape"]: r["host_us"] for r in rows if r["path"] == "sdpa"}
    for r in rows:
        if r["host_us"] is not None and sdpa.get(r["shape"]):
            r["host_x_sdpa"] = r["host_us"] / sdpa[r["shape"]]
        if r["wall_us"] is not None and r["graph_us"]:
            r["eager_x_graph"] = r["wall_us"] / r["graph_us"]
    return rows


def bench(calls: int, warmup: int) -> list[dict]:
    env = run_environment()
    date = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d")
    stamp = {"device": current_device_name(), "torch": env["torch"], "triton": env["triton"], "commit": env["commit"]}
    rows = []
    for name, (p, _) in SHAPES.items():
        x = shape_inputs(name, torch.device("cuda"))
        shape_rows, ready = {}, {}
        for path, call in paths(x).items():
            row = dict.fromkeys(COLUMNS, None) | {"shape": name, "B": p.B, "G": p.G, "h": p.h, "D": p.D}
            row |= {"S_kv": p.S_kv, "n": x.ranges.shape[3], "path": path, "note": "", **stamp, "date": date}
            row |= prepare(call, warmup) if callable(call) else {"status": call}
            shape_rows[path] = row
            if row["status"] == "ok":
                ready[path] = call
        try:
            times = interleaved_us(ready, calls)
        except Exception as e:  # a path that fails only when timed: every timed row says so
            times = {}
            for path in ready:
                shape_rows[path]["status"] = f"error: {one_line(e)}"
        for path, (host_us, wall_us) in times.items():
            row = shape_rows[path]
            row |= {"host_us": host_us, "wall_us": wall_us}
            row |= graph_time(ready[path], row["note"])
        for path, row in shape_rows.items():
            print(f"{name} / {path}: {row['status']}", flush=True)
        rows += shape_rows.values()
    return add_ratios(rows)


def _unmeasured(r, what: str) -> str | None:
    """Why row `r` of path `what` has no host time, or None."""
    if r is None:
        return f"no {what} row"
    return None if r["status"] == "ok" and r["host_us"] is not None else f"{what}: {r['status']}"


HOST_BARS = {"auto": 2.0, "auto_normalized": 2.0, "cuda": 1.5, "cuda_normalized": 1.5}  # host time / SDPA's, shapes a, b
EAGER_BAR = 1.5  # shape c: an eager loop's wall time / its CUDA-graph device time


def host_checks(rows: list[dict]) -> list[str]:
    """PASS/FAIL lines of the host-cost bars: on shapes a and b each path of HOST_BARS issues a
    call in at most its multiple of SDPA's host time; on shape c an eager loop of auto, ranges
    declared normal or not, costs at most EAGER_BAR times its CUDA-graph device time. A bar
    without the rows to judge it reads "not measured" and fails."""
    by = {(r["shape"], r["path"]): r for r in rows}
    checks = []  # (shape, path, bar, why not measured, (measure, us, against, its name))
    for shape in ("a", "b"):
        sdpa = by.get((shape, "sdpa"))
        for path, bar in HOST_BARS.items():
            r = by.get((shape, path))
            why = _unmeasured(r, path) or _unmeasured(sdpa, "sdpa")
            checks.append((shape, path, bar, why, None if why else ("host", r["host_us"], sdpa["host_us"], "sdpa's")))
    for path in ("auto", "auto_normalized"):
        r = by.get(("c", path))
        why = _unmeasured(r, path) or (None if r["graph_us"] else f"no graph time: {r['note'] or 'none recorded'}")
        checks.append(("c", path, EAGER_BAR, why, None if why else ("eager", r["wall_us"], r["graph_us"], "its graph")))
    return [_bar_line(*check) for check in checks]


def _bar_line(shape: str, path: str, bar: float, why, measured) -> str:
    if why:
        return f"- FAIL {shape} / {path}: not measured ({why})"
    what, us, against, name = measured
    x = us / against
    return (
        f"- {'PASS' if x <= bar else 'FAIL'} {shape} / {path}: {what} {us:.1f} us/call = {x:.2f}x {name} "
        f"{against:.1f} us (bar {bar:g}x)"
    )


def _cell(x) -> str:
    return "" if x is None else f"{x:.2f}" if isinstance(x, float) else str(x).replace("|", "/")[:120]


def markdown(rows: list[dict]) -> str:
    head = rows[0]
    shapes = {r["shape"]: f"{r['shape']}: B={r['B']} G={r['G']} h={r['h']} D={r['D']} S_kv={r['S_kv']} n={r['n']}" for r in rows}
    keys = ("shape", "path", "status", "host_us", "wall_us", "graph_us", "host_x_sdpa", "eager_x_graph", "note")
    return "\n".join(
        [
            f"Host cost per decode call (bf16), {head['device']}, torch {head['torch']}, triton {head['triton']}, "
            f"commit {head['commit']}, {head['date']}; {'; '.join(shapes.values())}",
            "",
            "| " + " | ".join(keys) + " |",
            "| --- " * len(keys) + "|",
            *("| " + " | ".join(_cell(r[k]) for k in keys) + " |" for r in rows),
        ]
    )


def write_csv(rows: list[dict], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="raise")
        w.writeheader()
        w.writerows(rows)
    return path


def read_csv(path: Path) -> list[dict]:
    """Rows of a host.csv, numbers parsed (empty cells become None)."""
    with Path(path).open(newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        for key in INTS + FLOATS:
            r[key] = None if r[key] == "" else int(r[key]) if key in INTS else float(r[key])
    return rows


def main(argv=None) -> int:
    ap = Parser(prog=f"{prog('python -m selgate.bench')} host", description=__doc__)
    ap.add_argument("--calls", type=positive_int, default=200, help="timed calls per loop")
    ap.add_argument("--warmup", type=count, default=20, help="untimed calls before the loops")
    ap.add_argument(
        "--out",
        type=Path,
        help="CSV file, the .md beside it (default <device>/<date>/host.csv under bench/results "
        "run in the checkout's root, else under ./bench-results)",
    )
    a = ap.parse_args(argv)
    if a.calls < 1 or a.warmup < 0:
        ap.error("--calls must be >= 1 and --warmup >= 0")
    if not torch.cuda.is_available():
        print("selgate bench host: no CUDA device: it times calls issued to a GPU", file=sys.stderr)
        return 2
    rows = bench(a.calls, a.warmup)
    out = write_csv(rows, a.out or tables.results_dir(current_device_name()) / "host.csv")
    table, bars = markdown(rows), "\n".join(["Bars:", *host_checks(rows)])
    out.with_suffix(".md").write_text(f"{table}\n\n{bars}\n")
    print(f"wrote {out} and {out.with_suffix('.md')}\n\n{bars}\n\n{table}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
