"""Device check and benchmark of the CUDA decode kernel, in one run.

1. Parity against the fp64 golden reference over h in {1,2,4,8,16}, (Dk, Dv) pairs from
   {64,128,192}, L from 0 to 2048, few/many/mixed ranges, fp16/bf16 on both kernels
   (tensor cores "mma", CUDA cores "simt") and fp32 ("simt"). Every case NaN-poisons the
   keys outside the selection (keys past `t` included), leaves NaN in free caching-allocator
   blocks of the outputs' sizes before the call (`poison_cuda_cache`; an unwritten output
   element reads NaN), passes raw ranges (shuffled, duplicated,
   out of bounds) so normalisation runs, and empties one row (o exact zeros, lse -inf).
2. Benchmark, side by side in one process: CUDA kernel, packed SDPA and the Triton path
   (when importable) on NSA-style ranges (l_sel = 64, n blocks; normalised once outside the
   timed call, as the dispatcher does), against the HBM floor = (selected K/V + q + o bytes)
   / device-to-device copy bandwidth measured in the same run. Both timers are the project's
   (bench/timing.py), over the same rotating input sets (together at least 4x L2, so each call
   reads its bytes cold: rotation takes the place of an L2 flush before every call, and no
   flush's write-back is timed): `time_calls` (eager: median per call of back-to-back calls,
   what a decode loop sees, the host's issue time included where it exceeds the device's,
   with that host time reported beside it) for every method, and `time_graph` (CUDA-graph
   replay, no launch gaps: the kernel's own device time, as in a decode step captured in a
   graph) for the methods that can be captured (not packed SDPA: it syncs).
3. `--sweep`: graph time of launch overrides of the tensor-core kernel (`DecodeLaunch`,
   kernels/cuda/launch.py), each named by its non-automatic fields (`field=value`).

Usage on a GPU machine: python -m selgate.bench.check_cuda_decode [--out FILE.md]
"""

from __future__ import annotations

import argparse
import functools
import itertools
import math
import subprocess
import sys

import torch

from selgate.conformance.poison import poison_cuda_cache
from selgate.kernels.cuda import build
from selgate.kernels.cuda.decode import selection_attention_cuda
from selgate.kernels.cuda.launch import DecodeLaunch, Pdl, Prefetch, Schedule
from selgate.kernels.errors import BackendUnavailable
from selgate.kernels.sdpa import selection_attention_sdpa
from selgate.reference import build_ranges, normalize_ranges, selection_attention_ref
from selgate.reference.golden import gather_attention

from .inputs import Inputs, decode_problem, make_inputs
from .parity import check_parity, poisoned
from .timing import measure_limits, rotation_count, time_calls, time_graph

H_LIST = (1, 2, 4, 8, 16)
DIMS = ((64, 64), (128, 128), (192, 192), (64, 192), (192, 64), (128, 192))
L_LIST = (0, 1, 7, 64, 100, 333, 512, 1000, 2048)
DISTS = ("few", "many", "mixed")
VARIANTS = (
    (torch.float32, "simt"),
    (torch.float16, "simt"),
    (torch.bfloat16, "simt"),
    (torch.float16, "mma"),
    (torch.bfloat16, "mma"),
)
BENCH_GRID = dict(N=(256, 1024), h=(4, 8), D=(64, 128), n=(8, 16))
SHARED, PER_WARP = Schedule.SHARED_SLABS, Schedule.PER_WARP_SLABS
AFTER_LOOP, AFTER_WAIT = Pdl.TRIGGER_AFTER_LOOP, Pdl.TRIGGER_AFTER_WAIT
# launch overrides checked for parity, on these (h, (Dk, Dv), L, dist) cases
LAUNCH_PARITY = (
    DecodeLaunch(stages=2, split=1, warps=4),
    DecodeLaunch(stages=6, split=1, warps=1),
    DecodeLaunch(stages=3, split=2, warps=4),
    DecodeLaunch(stages=2, split=4, warps=4, pdl=AFTER_LOOP),
    DecodeLaunch(stages=3, split=4, warps=2),
    DecodeLaunch(stages=2, split=3, warps=4),
    DecodeLaunch(stages=4, split=1, warps=8, pdl=AFTER_LOOP),
    DecodeLaunch(stages=2, split=1, warps=4, slab=16),
    DecodeLaunch(stages=3, split=2, warps=2, pdl=AFTER_LOOP, slab=16),
    DecodeLaunch(stages=2, split=1, warps=2, slab=32, schedule=SHARED),
    DecodeLaunch(stages=4, split=1, warps=2, pdl=AFTER_LOOP, slab=32, schedule=SHARED),
    DecodeLaunch(stages=4, split=1, warps=2, pdl=AFTER_WAIT, slab=32, schedule=SHARED),
    DecodeLaunch(stages=2, split=1, warps=4, pdl=AFTER_WAIT, slab=32, schedule=PER_WARP),
    DecodeLaunch(stages=4, split=1, warps=2, pdl=AFTER_WAIT, slab=32, schedule=SHARED, prefetch=Prefetch.FIRST_KEYS_LINES),
    DecodeLaunch(stages=2, split=1, warps=4, pdl=AFTER_WAIT, slab=32, schedule=PER_WARP, prefetch=Prefetch.FIRST_KEYS_BULK),
    DecodeLaunch(
        stages=6, split=1, warps=2, pdl=AFTER_WAIT, slab=32, schedule=SHARED, prefetch=Prefetch.FIRST_KEYS_LINES, occupancy=2
    ),
    DecodeLaunch(
        stages=3, split=1, warps=2, pdl=AFTER_LOOP, slab=32, schedule=SHARED, prefetch=Prefetch.FIRST_KEYS_BULK, occupancy=3
    ),
)
LAUNCH_CASES = (
    (4, (64, 64), 512, "few"),
    (8, (128, 128), 1000, "mixed"),
    (16, (192, 64), 333, "many"),
    (20, (72, 40), 129, "mixed"),
    (2, (64, 192), 7, "few"),
    (1, (256, 256), 2048, "many"),
)
# variants timed side by side by --sweep (the first: the automatic launch)
SWEEP = (
    DecodeLaunch(),
    DecodeLaunch(prefetch=Prefetch.NONE, occupancy=6),
    DecodeLaunch(prefetch=Prefetch.NONE),
    DecodeLaunch(prefetch=Prefetch.RANGES_AND_Q),
    DecodeLaunch(prefetch=Prefetch.FIRST_KEYS_LINES),
    DecodeLaunch(pdl=AFTER_LOOP),
    DecodeLaunch(stages=5),
)
L_SEL = 64


# ------------------------------------------------------------------------------ parity
def decode_case(h, Dk, Dv, L, dist, dtype, *, seed, device, B=3, G=2):
    """One parity case: clean q/k/v, raw ranges, positions, and k/v with NaN outside the selection.

    Batch 1 decodes at `t = S_kv - 38` while its ranges reach `S_kv` (the kernel must clamp),
    the last batch's first group selects nothing; odd seeds pass int64 ranges, seeds divisible
    by 3 int32 positions (the kernel reads both widths)."""
    name = str(dtype).removeprefix("torch.")
    if L == 0:
        S_kv, gen = 64, torch.Generator(device=device).manual_seed(seed)
        q = torch.randn(B, 1, G, h, Dk, generator=gen, device=device).to(dtype)
        k = torch.randn(B, G, S_kv, Dk, generator=gen, device=device).to(dtype)
        v = torch.randn(B, G, S_kv, Dv, generator=gen, device=device).to(dtype)
        x = Inputs(q, k, v, torch.zeros(B, 1, G, 2, 2, dtype=torch.int32, device=device), Dk**-0.5)
    else:
        x = make_inputs(decode_problem(B, h, Dk, Dv, L, dist, name, G=G), seed=seed, device=device)
        S_kv = x.k.shape[2]
    x.ranges[-1, 0, 0] = 0
    positions = torch.full((B, 1), S_kv - 1, dtype=torch.int64, device=device)
    if S_kv > 64:
        positions[1] = S_kv - 38
    n = x.ranges.shape[3]
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).to(device)
    far = torch.tensor([S_kv + 3, S_kv + 9], dtype=x.ranges.dtype, device=device).expand(B, 1, G, 1, 2)
    raw = torch.cat([x.ranges[..., perm, :], x.ranges[..., :1, :], far], dim=3)
    raw[-1, 0, 0] = 0
    raw = raw.long() if seed % 2 else raw.int()
    positions = positions.int() if seed % 3 == 0 else positions
    norm = normalize_ranges(raw, S_kv, positions)
    bad = poisoned(Inputs(x.q, x.k, x.v, norm, x.scale))
    return x, raw, positions, norm, bad


def errors(got: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    """Max and mean abs error where `ref` is finite; inf when `got` is non-finite there or
    differs from `ref` where `ref` is not finite (lse = -inf of empty rows)."""
    g = got.double()
    fin = torch.isfinite(ref)
    if not torch.equal(torch.isfinite(g), fin) or not torch.equal(g[~fin], ref[~fin]):
        return math.inf, math.inf
    if not fin.any():
        return 0.0, 0.0
    e = (g - ref).abs()[fin]
    return float(e.max()), float(e.mean())


def bounds(dtype, plain: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    """SPEC.md: fp32 max 1e-5 / mean 1e-6; fp16/bf16 max 2x plain PyTorch error + 2 eps max|ref|, mean 1e-3."""
    if dtype == torch.float32:
        return 1e-5, 1e-6
    fin = torch.isfinite(ref)
    floor = 2 * torch.finfo(dtype).eps * float(ref[fin].abs().max()) if fin.any() else 0.0
    return 2 * errors(plain, ref)[0] + floor, 1e-3


def run_case(h, Dk, Dv, L, dist, dtype, kernel, *, seed, device, launch: DecodeLaunch | None = None) -> dict:
    x, raw, positions, norm, bad = decode_case(h, Dk, Dv, L, dist, dtype, seed=seed, device=device)
    ref_o, ref_lse = selection_attention_ref(x.q, x.k, x.v, raw, scale=x.scale, positions=positions, return_lse=True)
    plain_o, plain_lse = gather_attention(x.q, x.k, x.v, norm, scale=x.scale, dtype=dtype)
    poison_cuda_cache(bad.q, bad.k, bad.v)
    o, lse = selection_attention_cuda(
        bad.q, bad.k, bad.v, raw, scale=x.scale, positions=positions, return_lse=True, kernel=kernel, launch=launch
    )
    o2, lse2 = selection_attention_cuda(
        bad.q, bad.k, bad.v, raw, scale=x.scale, positions=positions, return_lse=True, kernel=kernel, launch=launch
    )
    overrides = launch is not None and launch != DecodeLaunch()
    res = dict(
        h=h,
        Dk=Dk,
        Dv=Dv,
        L=L,
        dist=dist,
        dtype=str(dtype).removeprefix("torch."),
        kernel=f"{kernel} {launch.label()}" if overrides else kernel,
        overrides=overrides,
    )
    ok = True
    for name, got, ref, plain in (("o", o, ref_o, plain_o), ("lse", lse, ref_lse, plain_lse)):
        mx, mean = errors(got, ref)
        bmx, bmean = bounds(dtype, plain, ref)
        res[f"{name}_max"], res[f"{name}_mean"], res[f"{name}_bound"] = mx, mean, bmx
        ok &= mx <= bmx and mean <= bmean
    res["empty_row_exact"] = bool((o[-1, 0, 0] == 0).all() and torch.isneginf(lse[-1, 0, 0]).all())
    res["deterministic"] = bool(torch.equal(o, o2) and torch.equal(lse, lse2))
    res["ok"] = ok and res["empty_row_exact"] and res["deterministic"]
    return res


def fits(launch: DecodeLaunch, h, Dk, Dv, dtype) -> bool:
    """Whether the tensor-core launch with overrides `launch` fits the device (ext.plan refuses it otherwise)."""
    ext = build.load_extension()
    try:
        ext.plan({torch.float16: 0, torch.bfloat16: 1}[dtype], 3, 2, h, 4096, Dk, Dv, 8, True, launch.ext_tune())
    except RuntimeError:
        return False
    return True


def parity_matrix(device) -> list[dict]:
    """h x (Dk, Dv) x dist for every dtype/kernel, with L cycling through L_LIST, plus edge shapes."""
    results, seed = [], 0
    for dtype, kernel in VARIANTS:
        for h, (Dk, Dv), dist in itertools.product(H_LIST, DIMS, DISTS):
            L = L_LIST[seed % len(L_LIST)]
            seed += 1
            results.append(run_case(h, Dk, Dv, L, dist, dtype, kernel, seed=seed, device=device))
        # odd head dims (pad paths), Dk = Dv = 256, tiny dims, h > 16 (several blocks per row)
        for h, Dk, Dv, L in ((3, 72, 40, 300), (2, 256, 256, 700), (5, 8, 8, 65), (20, 128, 128, 513), (33, 64, 64, 129)):
            seed += 1
            results.append(run_case(h, Dk, Dv, L, "mixed", dtype, kernel, seed=seed, device=device))
        done = [r for r in results if r["kernel"] == kernel and r["dtype"] == str(dtype).removeprefix("torch.")]
        print(f"parity {dtype} {kernel}: {sum(r['ok'] for r in done)}/{len(done)} pass", flush=True)
    # Launch overrides of the tensor-core kernel: every swept variant must compute the same
    # function (a cluster split and PDL on need SM >= 9.0).
    sm90 = torch.cuda.get_device_capability(device) >= (9, 0)
    for launch in LAUNCH_PARITY:
        if not sm90 and launch.needs_sm90():
            continue
        for dtype in (torch.float16, torch.bfloat16):
            for h, (Dk, Dv), L, dist in LAUNCH_CASES:
                seed += 1
                if not fits(launch, h, Dk, Dv, dtype):
                    continue  # more shared memory than a block may have: the launch refuses it
                results.append(run_case(h, Dk, Dv, L, dist, dtype, "mma", seed=seed, device=device, launch=launch))
    tuned = [r for r in results if r["overrides"]]
    print(f"parity mma with launch overrides: {sum(r['ok'] for r in tuned)}/{len(tuned)} pass", flush=True)
    return results


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
        bad = poisoned(sets[0])
        for name, fn in methods.items():
            try:
                parity = check_parity(fn(bad), bad)
                row[name], row[name + "_host"] = eager_us(fn, sets)
                row[name + "_parity"] = parity.label()
            except Exception as exc:  # a method that fails is reported, not fatal
                row[name], row[name + "_host"] = math.nan, math.nan
                row[name + "_parity"] = f"error: {type(exc).__name__}: {str(exc)[:120]}"
            if name != "sdpa":
                try:
                    row[name + "_graph"] = graph_us(fn, sets)
                except Exception as exc:
                    row[name + "_graph"] = math.nan
                    print(f"graph timing of {name} failed: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
        row["copy_graph"] = copy_us(row["moved"], device)
        row["x_sdpa"] = row["sdpa"] / row["cuda"]
        row["x_floor"] = row["cuda"] / row["floor_us"]
        row["x_floor_graph"] = row["cuda_graph"] / row["floor_us"]
        print(row, flush=True)
        rows.append(row)
        del sets, bad
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
    """Graph-replay time of every SWEEP variant of the tensor-core kernel on the bench grid,
    each checked for parity on the first input set (NaN-poisoned outside the selection)."""
    limits = measure_limits(device, dtype)
    rows = []
    for row, sets in grid_sets(device, dtype, limits.copy_gbps):
        floor = row["floor_us"]
        bad = poisoned(sets[0])
        row["launch"] = plan_of(sets[0])
        for launch in SWEEP:
            key = launch.label()
            fn = functools.partial(sweep_call, launch=launch)
            try:
                ok = check_parity(fn(bad), bad).ok
                row[key] = f"{graph_us(fn, sets) / floor:.2f}{'' if ok else '!'}"
            except BackendUnavailable as exc:  # a launch the wrapper refuses (unverified, does not fit)
                row[key] = "refused"
                print(f"sweep {key} refused: {str(exc)[:200]}", flush=True)
            except Exception as exc:
                row[key] = "error"
                print(f"sweep {key} failed: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
        print(row, flush=True)
        rows.append(row)
        del sets, bad
        torch.cuda.empty_cache()
    return rows, limits.copy_gbps


def sweep_markdown(rows: list[dict], copy_gbps: float) -> str:
    keys = [launch.label() for launch in SWEEP]
    out = [
        "## Launch sweep of the tensor-core kernel (graph replay, time / HBM floor)",
        "",
        f"Copy bandwidth {copy_gbps:.0f} GB/s. Columns: launch overrides (`DecodeLaunch`, "
        "kernels/cuda/launch.py) by their non-automatic fields, `auto` = none; `!` = parity "
        "failure; `refused`: the wrapper declines that launch here; `launch` = what the automatic launch "
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
    # over the points where the variant ran with parity
    worst = {k: max((float(r[k]) for r in rows if r[k][-1].isdigit()), default=math.nan) for k in keys}
    out += [
        "",
        "Worst time / floor per variant, over the grid points where it ran with parity: "
        + ", ".join(f"{k}: {v:.2f}" for k, v in sorted(worst.items(), key=lambda kv: kv[1])),
        "",
    ]
    return "\n".join(out)


# ------------------------------------------------------------------------------ report
def stamp() -> dict:
    from selgate.reports.environment import collect_environment

    env = collect_environment()
    try:
        env["nvcc"] = subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]
    except (OSError, IndexError):
        env["nvcc"] = "absent"
    return env


def markdown(env: dict, build_s: float, parity: list[dict], rows: list[dict], copy_gbps: float) -> str:
    fails = [r for r in parity if not r["ok"]]
    out = [
        "# CUDA selection decode kernel on the H100",
        "",
        "Produced by `python -m selgate.bench.check_cuda_decode` in one process.",
        "",
        "| " + " | ".join(f"{k}: {env.get(k)}" for k in ("gpu", "driver", "cuda", "torch", "triton", "nvcc", "commit")) + " |",
        "",
        f"Extension build (or cache load) in this run: {build_s:.1f} s.",
        "",
        f"## Parity: {len(parity) - len(fails)}/{len(parity)} cases pass",
        "",
        "Worst case per dtype/kernel (max abs error / bound):",
        "",
        "| dtype | kernel | cases | worst o err | its bound | worst lse err | its bound | all empty rows exact | deterministic |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for (dt, ker), group in itertools.groupby(parity, key=lambda r: (r["dtype"], r["kernel"])):
        g = list(group)
        wo = max(g, key=lambda r: r["o_max"] / max(r["o_bound"], 1e-30))
        wl = max(g, key=lambda r: r["lse_max"] / max(r["lse_bound"], 1e-30))
        out.append(
            f"| {dt} | {ker} | {len(g)} | {wo['o_max']:.3g} | {wo['o_bound']:.3g} | {wl['lse_max']:.3g} | "
            f"{wl['lse_bound']:.3g} | {all(r['empty_row_exact'] for r in g)} | {all(r['deterministic'] for r in g)} |"
        )
    if fails:
        out += ["", "Failing cases:", ""] + [f"- {r}" for r in fails[:40]]
    out += [
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
        "copy moving the same bytes, graph-replayed (how close to the floor a transfer of this size gets).",
        "",
        "| N | h | D=Dv | n | L | cuda eager | cuda host | cuda graph | simt eager | simt graph | sdpa eager "
        "| triton eager | triton graph | HBM floor | same-size copy graph | sdpa/cuda (eager) | cuda/floor (eager) "
        "| cuda/floor (graph) | copy/floor (graph) | parity cuda, simt, sdpa, triton | cuda launch |",
        "| --- " * 21 + "|",
    ]
    for r in rows:
        out.append(
            f"| {r['N']} | {r['h']} | {r['D']} | {r['n']} | {r['L']} | {r['cuda']:.1f} | {r['cuda_host']:.1f} | "
            f"{r['cuda_graph']:.1f} | "
            f"{r['cuda_simt']:.1f} | {r['cuda_simt_graph']:.1f} | {r['sdpa']:.1f} | "
            f"{r.get('triton', math.nan):.1f} | {r.get('triton_graph', math.nan):.1f} | {r['floor_us']:.1f} | "
            f"{r['copy_graph']:.1f} | {r['x_sdpa']:.2f} | {r['x_floor']:.2f} | {r['x_floor_graph']:.2f} | "
            f"{r['copy_graph'] / r['floor_us']:.2f} | {r['cuda_parity']}, "
            f"{r['cuda_simt_parity']}, {r['sdpa_parity']}, {r.get('triton_parity', '-')} | {r['plan']} |"
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
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the Markdown report here")
    ap.add_argument("--skip-bench", action="store_true")
    ap.add_argument("--skip-parity", action="store_true")
    ap.add_argument("--sweep", action="store_true", help="also time the tensor-core kernel's launch variants")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to check", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    build.load_extension(device)
    build_s = build.build_seconds.get(build.device_arch(device), 0.0)
    print(f"extension ready in {build_s:.1f} s", flush=True)
    parity = [] if args.skip_parity else parity_matrix(device)
    for r in parity:
        if not r["ok"]:
            print("FAIL", r, flush=True)
    print(f"parity: {sum(r['ok'] for r in parity)}/{len(parity)} pass", flush=True)
    rows, gbps = ([], math.nan) if args.skip_bench else bench(device)
    text = markdown(stamp(), build_s, parity, rows, gbps)
    if args.sweep:
        text += "\n" + sweep_markdown(*sweep(device))
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print(text)
    return 0 if all(r["ok"] for r in parity) else 1


if __name__ == "__main__":
    sys.exit(main())
