"""The benchmark matrices, sized so the full H100 sweep stays under six minutes.

`acceptance`: the forward kernels' acceptance settings and bars (decode bf16 N=1024, h=8,
D=Dv=128, L in {512, 1024}; prefill bf16 B=1, T=65536, 64 heads in 4 groups, D=Dv=128,
16 blocks of 64, K and V as separate tensors, and the same with K and V stored per key,
reported beside it). `seed`: H in {4, 8}, D, Dv in {64, 128}, L in {16..1024}, N in {64, 256, 1024},
few/many/mixed (504 decode configurations, few timed calls each). `full`: both.
`smoke`: the lanes' perf smoke, a few rows of `full` (decode at L=1024, the 64k prefill forward) that
a GPU lane times after its tests, judged against the standing `full` baseline (bench/regression.py).
`launch`: Triton launch variants (BLOCK_L x warps x stages) over L, for the optimiser's
per-bucket block sizes. `prefill_scaling`: the acceptance prefill setting at T in {4k .. 64k}
(`PREFILL_SCALING_T`), ours beside fla-core and the SDPA baselines that fit, for the prefill
plot (bench/plots.py). `prefill_heads`: the same prefill at h in {1 .. 16} query heads per KV head and
T in {8k, 16k, 64k}, the served forward beside the pairs and KV-outer ones and fla-core.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass

from .inputs import DISTS, Problem, decode_problem, prefill_problem
from .sweep import MeasureOptions

SEED_L = (16, 32, 64, 128, 256, 512, 1024)
LAUNCH_VARIANTS = tuple(f"triton@{b}x{w}x{s}" for b in (16, 32, 64, 128) for w, s in ((4, 2), (4, 3), (8, 3)))


@dataclass(frozen=True)
class Matrix:
    name: str
    problems: list[Problem]
    measure: MeasureOptions
    methods: tuple[str, ...] = ()  # empty: the device's defaults or --backends


def acceptance_decode(dtype: str) -> list[Problem]:
    return [decode_problem(1024, 8, 128, 128, L, dist, dtype) for L in (512, 1024) for dist in ("few", "many")]


def acceptance_prefill(dtype: str, T: int = 65536) -> Problem:
    return prefill_problem(T, 64, 4, 128, 128, 64, 16, dtype)


def acceptance(dtype: str = "bfloat16") -> list[Matrix]:
    """The prefill setting twice: K and V as separate tensors (the bar's row), and stored per key
    (each key's K and V rows adjacent), which the H100 reads 3-4 % faster (docs/design/triton-forward.md)."""
    prefill = acceptance_prefill(dtype)
    return [
        Matrix("acceptance-decode", acceptance_decode(dtype), MeasureOptions(warmup=10, iters=100, graph=True)),
        Matrix(
            "acceptance-prefill",
            [prefill, dataclasses.replace(prefill, kv_layout="key")],
            MeasureOptions(warmup=2, iters=10, max_seconds=4.0),
        ),
    ]


def seed(dtype: str = "bfloat16") -> list[Matrix]:
    problems = [
        decode_problem(N, H, D, Dv, L, dist, dtype)
        for N, H, D, Dv, L, dist in itertools.product((64, 256, 1024), (4, 8), (64, 128), (64, 128), SEED_L, DISTS)
    ]
    return [Matrix("seed", problems, MeasureOptions(warmup=3, iters=15, max_seconds=0.5, graph=True))]


def launch(dtype: str = "bfloat16") -> list[Matrix]:
    methods = ("sdpa", "triton", *LAUNCH_VARIANTS)
    decode = [decode_problem(1024, 8, D, D, L, "many", dtype) for D in (64, 128) for L in SEED_L]
    return [
        Matrix("launch-decode", decode, MeasureOptions(warmup=3, iters=20, max_seconds=0.5), methods),
        Matrix("launch-prefill", [acceptance_prefill(dtype)], MeasureOptions(warmup=2, iters=5, max_seconds=1.0), methods),
    ]


def full(dtype: str = "bfloat16") -> list[Matrix]:
    """acceptance then seed, without seed's repeats of acceptance's configurations: a configuration
    appears once per run, so the regression check compares one row with one row."""
    first = acceptance(dtype)
    seen = {p.key for m in first for p in m.problems}
    return first + [dataclasses.replace(m, problems=[p for p in m.problems if p.key not in seen]) for m in seed(dtype)]


SMOKE_BASELINE = "full"  # the matrix whose baseline rows judge the smoke's (its configurations are among them)


def smoke(dtype: str = "bfloat16") -> list[Matrix]:
    """Decode at L=1024 (few and many ranges: our kernels, SDPA and gather-then-SDPA for the acceptance
    bars, graph-timed) and the 64k prefill forward (Triton only: SDPA's packed prefill alone takes ~0.5 s a call), with
    `acceptance`'s timing settings, so each row is one of `full`'s configurations timed the same way."""
    decode = [p for p in acceptance_decode(dtype) if p.L == 1024]
    methods = ("triton", "cuda", "sdpa", "gather_sdpa")
    return [
        Matrix("smoke-decode", decode, MeasureOptions(warmup=10, iters=100, graph=True), methods),
        Matrix("smoke-prefill", [acceptance_prefill(dtype)], MeasureOptions(warmup=2, iters=10, max_seconds=4.0), ("triton",)),
    ]


PREFILL_SCALING_T = (4096, 8192, 16384, 32768, 65536)
# gather_sdpa is left out: its gathered K/V (~132 GiB at 64k, linear in T) is over the dense
# budget (SELGATE_BENCH_DENSE_BUDGET_MB, 8 GiB) even at T=4096; masked_sdpa's mask (quadratic
# in T) fits at T=4096 only, and is recorded as a skip above it.
PREFILL_SCALING_METHODS = ("triton", "fla_nsa", "sdpa", "masked_sdpa", "dense_causal")


def prefill_scaling(dtype: str = "bfloat16") -> list[Matrix]:
    """Prefill forward time against T: the acceptance prefill's heads, dims and selection (64
    heads in 4 groups, D=Dv=128, 16 blocks of 64) at each of PREFILL_SCALING_T, K and V as
    separate tensors, the acceptance prefill's timing settings. On the H100 about a minute:
    ~15 s of calls (2 warm-up and 10 timed calls per row; packed SDPA, linear in T, is most of
    it from its 474 ms at 64k) plus start-up and compilation."""
    problems = [acceptance_prefill(dtype, T) for T in PREFILL_SCALING_T]
    return [Matrix("prefill-scaling", problems, MeasureOptions(warmup=2, iters=10, max_seconds=4.0), PREFILL_SCALING_METHODS)]


PREFILL_HEADS_T = (8192, 16384, 65536)
PREFILL_HEADS_H = (1, 2, 4, 8, 16)
PREFILL_HEADS_METHODS = ("triton", "triton_pairs", "triton_kv_outer", "fla_nsa")


def prefill_heads(dtype: str = "bfloat16") -> list[Matrix]:
    """Prefill forward time against h, the query heads per KV head: the acceptance prefill's
    4 KV heads, dims and selection (16 blocks of 64) at h in PREFILL_HEADS_H and T in
    PREFILL_HEADS_T; the served Triton forward (what the profile routes), the pairs (row) and
    KV-outer forwards each on its own (`bench thresholds` takes the KV-outer route's bars from
    the two), and fla-core where it applies (h = 16). Why: a row-outer forward costs the same
    at every h (each row reloads its keys); a KV-outer one follows the work."""
    problems = [prefill_problem(T, 4 * h, 4, 128, 128, 64, 16, dtype) for T in PREFILL_HEADS_T for h in PREFILL_HEADS_H]
    return [Matrix("prefill-heads", problems, MeasureOptions(warmup=2, iters=10, max_seconds=4.0), PREFILL_HEADS_METHODS)]


PRESETS = {
    "acceptance": acceptance,
    "seed": seed,
    "full": full,
    "launch": launch,
    "prefill_scaling": prefill_scaling,
    "prefill_heads": prefill_heads,
    "smoke": smoke,
}


def acceptance_checks(rows: list[dict]) -> list[str]:
    """The acceptance bars (decode: <= 1.5x the HBM floor and >= 5x gather-then-SDPA; prefill:
    <= 15 ms), for the rows of `rows` that measure them."""
    dtype = "bfloat16"
    decode = {p.key for p in acceptance_decode(dtype)}
    prefill = acceptance_prefill(dtype)
    prefill_key = dataclasses.replace(prefill, kv_layout="key").key
    by = {(r["config"], r["method"]): r for r in rows if r["status"] == "ok"}
    lines = []
    for (config, method), r in sorted(by.items()):
        if method not in ("triton", "cuda"):
            continue
        if config in decode:
            # The floor bar is on device time: graph replay where measured (eager calls of a
            # Python launcher are host-bound on slow hosts; both are shown). The gather bar
            # compares eager calls with eager calls.
            x_floor = 1 / r["frac_copy"]
            dev_ms = r.get("graph_ms") or r["ms"]
            x_dev = x_floor * dev_ms / r["ms"]
            gather = by.get((config, "gather_sdpa"))
            vs = f"{gather['ms'] / r['ms']:.1f}x" if gather else "not measured"
            verdict = "PASS" if x_dev <= 1.5 and gather and gather["ms"] / r["ms"] >= 5 else "FAIL"
            graph = f"graph {dev_ms:.4f} ms = {x_dev:.2f}x" if r.get("graph_ms") else "no graph timing"
            lines.append(
                f"- {verdict} {config} / {method}: {graph} the HBM floor (bar 1.5x; eager "
                f"{r['ms']:.4f} ms = {x_floor:.2f}x, host {r['host_ms'] or 0:.4f} ms/call), "
                f"{vs} vs gather_sdpa (bar 5x)"
            )
        elif config == prefill.key:
            lines.append(f"- {'PASS' if r['ms'] <= 15 else 'FAIL'} {config} / {method}: {r['ms']:.2f} ms (bar 15 ms)")
        elif config == prefill_key:
            lines.append(
                f"- INFO {config} / {method}: {r['ms']:.2f} ms (K and V stored per key; the bar is judged "
                "on separate K and V tensors)"
            )
    return ["", "Acceptance bars:"] + lines if lines else []
