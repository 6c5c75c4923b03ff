"""Benchmark of the CUDA decode kernel on the device, in one run.

1. Side by side in one process: CUDA kernel, packed SDPA and the Triton path (when
   importable) on NSA-style ranges (l_sel = 64, n blocks; normalised once outside the timed
   call, as the dispatcher does), against the HBM floor = (selected K/V + q + o bytes) /
   device-to-device copy bandwidth measured in the same run. Both timers are the project's
   (bench/timing.py), over the same rotating input sets (together at least 4x L2, so each call
   reads its bytes cold: rotation takes the place of an L2 flush before every call, and no
   flush's write-back is timed): `time_calls` (eager: median per call of back-to-back calls,
   what a decode loop sees, the host's issue time included where it exceeds the device's,
   with that host time reported beside it) for every method, and `time_graph` (CUDA-graph
   replay, no launch gaps: the kernel's own device time, as in a decode step captured in a
   graph) for the methods that can be captured (not packed SDPA: it syncs).
2. `--sweep`: graph time of launch overrides of the tensor-core kernel (`DecodeLaunch`,
   kernels/cuda/launch.py), each named by its non-automatic fields (`field=value`).

Whether the kernel is right is the conformance matrix's question
(`pytest --pyargs selgate.conformance -m conformance --impl cuda --size large`).

Usage on a GPU machine: selgate bench cuda-decode [--out FILE.md]
"""

from __future__ import annotations

import functools
import itertools
import math
import subprocess
import sys

import torch

from selgate.kernels.cuda import build
from selgate.kernels.cuda.decode import selection_attention_cuda
from selgate.kernels.cuda.launch import DecodeLaunch, Pdl, Prefetch, Schedule
from selgate.errors import BackendUnavailable
from selgate.kernels.sdpa import selection_attention_sdpa
from selgate.reference import build_ranges
from selgate.cli import prog
from selgate.cli_args import Parser

from .inputs import Inputs
from .timing import measure_limits, rotation_count, time_calls, time_graph

BENCH_GRID = dict(N=(256, 1024), h=(4, 8), D=(64, 128), n=(8, 16))
# variants timed side by side by --sweep (the first: the automatic launch)
SWEEP = (
    DecodeLaunch(),
    DecodeLaunch(prefetch=Prefetch.NONE, occupancy=6),
    DecodeLaunch(prefetch=Prefetch.NONE),
    DecodeLaunch(prefetch=Prefetch.RANGES_AND_Q),
    DecodeLaunch(prefetch=Prefetch.FIRST_KEYS_LINES),
    DecodeLaunch(pdl=Pdl.TRIGGER_AFTER_LOOP),
    DecodeLaunch(stages=5),
)
L_SEL = 64


# ------------------------------------------------------------------------------ benchmark
def nsa_inputs(N, h, D, n, dtype, *, seed, device) -> Inputs:
    """Decode inputs with NSA ranges: n blocks of l_sel = 64 (block 0 and the 2 local blocks forced)."""
    L = n * L_SEL
    S_kv = 4 * L
    gen = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(N, 1, 1, h, D, generator=gen, device=device).to(dtype)
    k = torch.randn(N, 1, S_kv, D, generator=gen, device=device).to(dtype)
    v = torch.randn(N, 1, S_kv, D, generator=gen, device=device).to(dtype)
    scores = torch.rand(N, 1, 1, S_kv // L_SEL, generator=gen, device=device)
    return Inputs(q, k, v, build_ranges(scores, G=1, l_sel=L_SEL, n=n, S_kv=S_kv), D**-0.5)


def triton_method():
    """The Triton decode path if this checkout has one, else None."""
    try:
        from selgate.kernels.triton import selection_attention_triton
    except ImportError:
        return None
    return lambda x: selection_attention_triton(x.q, x.k, x.v, x.ranges, scale=x.scale, normalized=True)


def graph_us(fn, sets) -> float:
    """Median device time per call of `fn` over the rotating `sets`, in us, from CUDA-graph replays."""
    return time_graph([functools.partial(fn, x) for x in sets], torch.device("cuda")).median_ms * 1e3


def copy_us(moved: int, device) -> float:
    """Graph-replay time of a plain device copy that moves the same bytes (`moved` / 2 read,
    as many written), over rotating buffers: what any streaming kernel of this size can
    reach, against the floor's bandwidth, which is measured on a large copy."""
    half = moved // 2
    count = rotation_count(half, device)
    src = torch.empty(count, half, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return graph_us(lambda i: dst[i].copy_(src[i]), list(range(count)))


def grid_sets(device, dtype, copy_gbps):
    """For each BENCH_GRID point: its row (shape, HBM floor = (selected K/V + q + o bytes) / copy
    bandwidth) and the rotating input sets (together at least 4x L2, so each call reads cold)."""
    for N, h, D, n in itertools.product(*BENCH_GRID.values()):
        L, es = n * L_SEL, torch.finfo(dtype).bits // 8
        selected = N * L * 2 * D * es
        sets = [nsa_inputs(N, h, D, n, dtype, seed=s, device=device) for s in range(rotation_count(selected, device))]
        moved = selected + 2 * N * h * D * es  # + q read + o written
        yield dict(N=N, h=h, D=D, n=n, L=L, floor_us=moved / (copy_gbps * 1e3), moved=moved), sets
        del sets
        torch.cuda.empty_cache()


def eager_us(fn, sets) -> tuple[float, float]:
    """Median time per call of `fn` over the rotating `sets` from `time_calls` (back-to-back calls,
    cold L2 by rotation), and the median host time to issue one call, both in us."""
    t = time_calls([functools.partial(fn, x) for x in sets], sets[0].q.device, warmup=25, iters=200)
    return t.median_ms * 1e3, math.nan if t.host_ms is None else t.host_ms * 1e3


def bench(device, dtype=torch.bfloat16) -> tuple[list[dict], float]:
    limits = measure_limits(device, dtype)
    methods = {
        "cuda": lambda x: selection_attention_cuda(x.q, x.k, x.v, x.ranges, scale=x.scale, normalized=True),
        "cuda_simt": lambda x: selection_attention_cuda(x.q, x.k, x.v, x.ranges, scale=x.scale, normalized=True, kernel="simt"),
        "sdpa": lambda x: selection_attention_sdpa(x.q, x.k, x.v, x.ranges, scale=x.scale, normalized=True),
    }
    tri = triton_method()
    if tri is not None:
        methods["triton"] = tri
    rows = []
    for row, sets in grid_sets(device, dtype, limits.copy_gbps):
        row["plan"] = plan_of(sets[0])
        errors = []
        for name, fn in methods.items():
            try:
                row[name], row[name + "_host"] = eager_us(fn, sets)
            except Exception as exc:  # a method that fails is reported, not fatal
                row[name], row[name + "_host"] = math.nan, math.nan
                errors.append(f"{name}: {type(exc).__name__}: {str(exc)[:120]}")
            if name != "sdpa":
                try:
                    row[name + "_graph"] = graph_us(fn, sets)
                except Exception as exc:
                    row[name + "_graph"] = math.nan
                    print(f"graph timing of {name} failed: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
        row["errors"] = "; ".join(errors) or "-"
        row["copy_graph"] = copy_us(row["moved"], device)
        row["x_sdpa"] = row["sdpa"] / row["cuda"]
        row["x_floor"] = row["cuda"] / row["floor_us"]
        row["x_floor_graph"] = row["cuda_graph"] / row["floor_us"]
        print(row, flush=True)
        rows.append(row)
        del sets
        torch.cuda.empty_cache()
    return rows, limits.copy_gbps


def plan_of(x: Inputs, launch: DecodeLaunch | None = None) -> str:
    """The tensor-core launch for x, as `field=value` of the launch's fields (codes by name,
    pdl as launched), then blocks per SM and shared memory per block."""
    from selgate.kernels.cuda.build import load_extension

    ext = load_extension(x.q.device)
    B, _, G, h, Dk = x.q.shape
    dt = {torch.float16: 0, torch.bfloat16: 1, torch.float32: 2}[x.q.dtype]
    # ext.plan's order (sel_decode_bind.cpp): kernel, stages, split, warps, threads, smem bytes,
    # blocks per SM, pdl, blocks, slab, schedule, prefetch
    _, st, sp, w, _, smem, bps, pdl, _, slab, sched, pf = ext.plan(
        dt, B, G, h, x.k.shape[2], Dk, x.v.shape[3], x.ranges.shape[3], True, (launch or DecodeLaunch()).ext_tune()
    )
    launched_pdl = Pdl.OFF.name if pdl == 0 else Pdl(pdl).name  # the plan's 0: launched without PDL
    return (
        f"stages={st} split={sp} warps={w} pdl={launched_pdl} slab={slab} "
        f"schedule={Schedule(sched).name} prefetch={Prefetch(pf).name}, {bps}/SM, {smem / 1024:.0f} KB"
    )


def sweep_call(x: Inputs, launch: DecodeLaunch):
    return selection_attention_cuda(x.q, x.k, x.v, x.ranges, scale=x.scale, normalized=True, launch=launch)


def sweep(device, dtype=torch.bfloat16) -> tuple[list[dict], float]:
    """Graph-replay time of every SWEEP variant of the tensor-core kernel on the bench grid."""
    limits = measure_limits(device, dtype)
    rows = []
    for row, sets in grid_sets(device, dtype, limits.copy_gbps):
        floor = row["floor_us"]
        row["launch"] = plan_of(sets[0])
        for launch in SWEEP:
            key = launch.label()
            fn = functools.partial(sweep_call, launch=launch)
            try:
                row[key] = f"{graph_us(fn, sets) / floor:.2f}"
            except BackendUnavailable as exc:  # a launch the wrapper refuses (unverified, does not fit)
                row[key] = "refused"
                print(f"sweep {key} refused: {str(exc)[:200]}", flush=True)
            except Exception as exc:
                row[key] = "error"
                print(f"sweep {key} failed: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
        print(row, flush=True)
        rows.append(row)
        del sets
        torch.cuda.empty_cache()
    return rows, limits.copy_gbps


def sweep_markdown(rows: list[dict], copy_gbps: float) -> str:
    keys = [launch.label() for launch in SWEEP]
    out = [
        "## Launch sweep of the tensor-core kernel (graph replay, time / HBM floor)",
        "",
        f"Copy bandwidth {copy_gbps:.0f} GB/s. Columns: launch overrides (`DecodeLaunch`, "
        "kernels/cuda/launch.py) by their non-automatic fields, `auto` = none; "
        "`refused`: the wrapper declines that launch here; `launch` = what the automatic launch "
        "ran (pdl as launched; blocks per SM, shared memory).",
        "",
        "| N | h | D | n | floor us | launch | " + " | ".join(keys) + " |",
        "| --- " * (6 + len(keys)) + "|",
    ]
    for r in rows:
        out.append(
            f"| {r['N']} | {r['h']} | {r['D']} | {r['n']} | {r['floor_us']:.1f} | {r['launch']} | "
            + " | ".join(r[k] for k in keys)
            + " |"
        )
    # over the points where the variant ran
    worst = {k: max((float(r[k]) for r in rows if r[k][-1].isdigit()), default=math.nan) for k in keys}
    out += [
        "",
        "Worst time / floor per variant, over the grid points where it ran: "
        + ", ".join(f"{k}: {v:.2f}" for k, v in sorted(worst.items(), key=lambda kv: kv[1])),
        "",
    ]
    return "\n".join(out)


# ------------------------------------------------------------------------------ report
def stamp() -> dict:
    from selgate.kernels.served import run_environment

    env = run_environment()
    try:
        env["nvcc"] = subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]
    except (OSError, IndexError):
        env["nvcc"] = "absent"
    return env


def markdown(env: dict, build_s: float, rows: list[dict], copy_gbps: float) -> str:
    out = [
        "# CUDA selection decode kernel on the H100",
        "",
        "Produced by `selgate bench cuda-decode` in one process.",
        "",
        "| " + " | ".join(f"{k}: {env.get(k)}" for k in ("gpu", "driver", "cuda", "torch", "triton", "nvcc", "commit")) + " |",
        "",
        f"Extension build (or cache load) in this run: {build_s:.1f} s.",
        "",
        f"## Benchmark (bf16, l_sel = {L_SEL}, times in us)",
        "",
        f"Copy bandwidth measured in this run: {copy_gbps:.0f} GB/s (read + write). Both timers rotate "
        "over input sets of at least 4x L2 together (cold L2 on every call, no flush timed). `eager`: "
        "`time_calls` median per call of back-to-back calls (a decode loop: the host's issue time counts "
        "where it exceeds the device's; `cuda host`: the host time to issue one call); `graph`: CUDA-graph "
        "replay (device time only). N = B*G decode rows (G = 1), S_kv = 4L. `cuda launch`: the "
        "tensor-core kernel's automatic launch by DecodeLaunch field (pdl as launched), blocks per SM, "
        "shared memory per block. `same-size copy graph`: a plain device "
        "copy moving the same bytes, graph-replayed (how close to the floor a transfer of this size gets). "
        "`errors`: the methods that raised, whose times read nan.",
        "",
        "| N | h | D=Dv | n | L | cuda eager | cuda host | cuda graph | simt eager | simt graph | sdpa eager "
        "| triton eager | triton graph | HBM floor | same-size copy graph | sdpa/cuda (eager) | cuda/floor (eager) "
        "| cuda/floor (graph) | copy/floor (graph) | errors | cuda launch |",
        "| --- " * 21 + "|",
    ]
    for r in rows:
        out.append(
            f"| {r['N']} | {r['h']} | {r['D']} | {r['n']} | {r['L']} | {r['cuda']:.1f} | {r['cuda_host']:.1f} | "
            f"{r['cuda_graph']:.1f} | "
            f"{r['cuda_simt']:.1f} | {r['cuda_simt_graph']:.1f} | {r['sdpa']:.1f} | "
            f"{r.get('triton', math.nan):.1f} | {r.get('triton_graph', math.nan):.1f} | {r['floor_us']:.1f} | "
            f"{r['copy_graph']:.1f} | {r['x_sdpa']:.2f} | {r['x_floor']:.2f} | {r['x_floor_graph']:.2f} | "
            f"{r['copy_graph'] / r['floor_us']:.2f} | {r['errors']} | {r['plan']} |"
        )
    ok_sdpa = all(r["x_sdpa"] >= 1.2 for r in rows)
    ok_floor = all(r["x_floor"] <= 1.3 for r in rows if r["L"] >= 512)
    ok_graph = all(r["x_floor_graph"] <= 1.3 for r in rows if r["L"] >= 512)
    out += [
        "",
        f"Targets: >= 1.2x faster than packed SDPA everywhere: {'met' if ok_sdpa else 'NOT met'}; "
        f"within 1.3x of the HBM floor at L >= 512: eager {'met' if ok_floor else 'NOT met'}, "
        f"graph {'met' if ok_graph else 'NOT met'}.",
        "",
    ]
    return "\n".join(out)


def main(argv=None) -> int:
    ap = Parser(prog=f"{prog('python -m selgate.bench')} cuda-decode", description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the Markdown report to this file as well (default: the terminal only)")
    ap.add_argument("--skip-bench", action="store_true", help="time only the launch variants (with --sweep)")
    ap.add_argument("--sweep", action="store_true", help="also time the tensor-core kernel's launch variants")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to time", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    build.load_extension(device)
    build_s = build.build_seconds.get(build.device_arch(device), 0.0)
    print(f"extension ready in {build_s:.1f} s", flush=True)
    rows, gbps = ([], math.nan) if args.skip_bench else bench(device)
    text = markdown(stamp(), build_s, rows, gbps)
    if args.sweep:
        text += "\n" + sweep_markdown(*sweep(device))
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
