"""Run problems x methods and return one result row per pair.

A method that does not apply is recorded as `skip`, one that raises as `error` with the
exception's first line; neither stops the sweep. Past the time budget the remaining
problems are recorded as skipped, so a sweep always ends with a complete table.
"""

from __future__ import annotations

import functools
import math
import sys
import time
from dataclasses import asdict, dataclass

import torch

from .baselines import get_method, triton_config, variant_config
from .inputs import Problem, make_inputs, selected_key_count, with_block_ranges
from .timing import BudgetSpent, Limits, rotation_count, time_calls, time_graph


@dataclass(frozen=True)
class MeasureOptions:
    """How each (problem, method) pair of a sweep is measured."""

    warmup: int
    iters: int
    max_seconds: float = 2.0  # per (problem, method) timing
    seed: int = 0
    graph: bool = False  # also CUDA-graph timing of decode rows of capturable methods


def progress(items, desc: str):
    """tqdm when installed, else one line per item on stderr."""
    try:
        from tqdm import tqdm

        return tqdm(items, desc=desc, file=sys.stderr)
    except ImportError:

        def simple():
            for i, item in enumerate(items):
                print(f"[{desc} {i + 1}/{len(items)}] {getattr(item, 'key', item)}", file=sys.stderr, flush=True)
                yield item

        return simple()


@functools.lru_cache(maxsize=None)
def software() -> str:
    """What a result depends on, from the lanes' environment stamp: 'torch 2.11.0 triton 3.6.0
    driver 580.159.04 commit 1a2b3c' (driver 'none' without a GPU)."""
    from selgate.kernels.served import run_environment

    env = run_environment()
    return f"torch {env['torch']} triton {env['triton']} driver {env['driver']} commit {env['commit']}"


def _work(p: Problem, ranges: torch.Tensor, item: int) -> dict:
    keys = selected_key_count(ranges)
    kv = keys * (p.D + p.Dv) * item
    io = kv + p.B * p.S * p.G * p.h * (p.D + p.Dv) * item
    return {"kv_bytes": kv, "io_bytes": io, "flops": 2 * keys * p.h * (p.D + p.Dv)}


def _row(p: Problem, method: str, device_name: str, limits: Limits, **fields) -> dict:
    base = asdict(p)
    del base["l_sel"], base["n_blocks"]
    row = {
        "config": p.key,
        **base,
        "L_max": None,
        "method": method,
        "ours": get_method(method).ours,
        "status": "ok",
        "ms": None,
        "ms_lo": None,
        "ms_hi": None,
        "iters": None,
        "host_ms": None,
        "graph_ms": None,
        "kv_bytes": None,
        "io_bytes": None,
        "gbps": None,
        "tflops": None,
        "frac_copy": None,
        "frac_matmul": None,
        "speedups": "",
        "kernel_config": "",
        "note": "",
        "device": device_name,
        "copy_gbps": limits.copy_gbps,
        "matmul_tflops": limits.matmul_tflops,
        "software": software(),
    }
    row.update(fields)
    return row


def _error(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".strip().splitlines()[0]
    return text[:300]


def _launch_name(method: str, p: Problem, device) -> str:
    """'BLOCK_LxWARPSxSTAGES' the Triton method ran with; the timing stands even if the kernel's
    config helper changed shape."""
    try:
        cfg = variant_config(method) or triton_config(p, device)
        return f"{cfg['BLOCK_L']}x{cfg['num_warps']}x{cfg['num_stages']}"
    except (TypeError, KeyError, ImportError) as e:
        return f"unknown ({_error(e)})"


def _measure(p, method, sets, device, s: MeasureOptions, deadline: float = math.inf) -> dict:
    m = get_method(method)
    fields = {}
    calls = [m.build(p, x) for x in sets]
    t = time_calls(calls, device, warmup=s.warmup, iters=s.iters, max_seconds=s.max_seconds, deadline=deadline)
    fields.update(ms=t.median_ms, ms_lo=t.lo_ms, ms_hi=t.hi_ms, iters=t.n, host_ms=t.host_ms)
    if s.graph and m.graphable and p.kind == "decode" and device.type == "cuda":
        try:
            fields["graph_ms"] = time_graph(calls, device).median_ms
        except Exception as e:  # the eager timing stands; say why the graph one is missing
            fields["note"] = f"graph timing failed: {_error(e)}"
    if method.startswith("triton"):
        fields["kernel_config"] = _launch_name(method, p, device)
    return fields


def input_sets(p: Problem, seed: int, device: torch.device) -> list:
    """The rotating input sets of `p`: enough that consecutive calls do not find the previous
    call's bytes in L2."""
    first = make_inputs(p, seed=seed, device=device)
    return [first] + [make_inputs(p, seed=seed + i, device=device) for i in range(1, rotation_count(first.nbytes(), device))]


def retime_graph(p: Problem, method: str, device: torch.device, s: MeasureOptions) -> float:
    """Graph time (ms) of `method` on `p` from re-allocated inputs (same seeds): a second
    opinion on a row (regression.recheck_graph)."""
    m = get_method(method)
    return time_graph([m.build(p, x) for x in input_sets(p, s.seed, device)], device).median_ms


def run_problem(
    p: Problem,
    methods: list[str],
    device: torch.device,
    limits: Limits,
    s: MeasureOptions,
    device_name: str,
    deadline: float = math.inf,
    budget_s: float = math.inf,
) -> list[dict]:
    """Rows for every method on problem `p` (inputs built once, rotated across calls); a method
    reached after `deadline` (time.monotonic()) is a skip naming the budget."""
    sets = input_sets(p, s.seed, device)
    rows = []
    for method in methods:
        if time.monotonic() > deadline:
            rows.append(_row(p, method, device_name, limits, status="skip", note=_spent(budget_s)))
            continue
        m = get_method(method)
        msets, note = sets, ""
        if m.block_size is not None:  # a block-index kernel accepts only whole blocks of its size
            msets = [with_block_ranges(p, x, m.block_size, seed=s.seed + i) for i, x in enumerate(sets)]
            note = f"ranges rebuilt as whole blocks of {m.block_size} keys (NSA builder, l_sel={m.block_size})"
        first = msets[0]
        work = _work(p, first.ranges, first.q.element_size())
        L_max = int((first.ranges[..., 1] - first.ranges[..., 0]).sum(-1).max())
        reason = m.skip_reason(p, device)
        if reason:
            rows.append(_row(p, method, device_name, limits, status="skip", note=reason, L_max=L_max))
            continue
        try:
            fields = _measure(p, method, msets, device, s, deadline)
        except BudgetSpent as e:
            rows.append(_row(p, method, device_name, limits, status="skip", note=f"{_spent(budget_s)}: {e}", L_max=L_max))
            continue
        except Exception as e:  # a failing method is a table entry, not the end of the sweep
            if device.type == "cuda":
                torch.cuda.empty_cache()
            rows.append(_row(p, method, device_name, limits, status="error", note=_error(e), L_max=L_max))
            continue
        fields["note"] = "; ".join(x for x in (note, fields.get("note", "")) if x)
        ms = fields["ms"]
        gbps, tflops = work["io_bytes"] / ms / 1e6, work["flops"] / ms / 1e9
        rows.append(
            _row(
                p,
                method,
                device_name,
                limits,
                L_max=L_max,
                kv_bytes=work["kv_bytes"],
                io_bytes=work["io_bytes"],
                gbps=gbps,
                tflops=tflops,
                frac_copy=gbps / limits.copy_gbps,
                frac_matmul=tflops / limits.matmul_tflops,
                **fields,
            )
        )
    timed = {r["method"]: r["ms"] for r in rows if r["status"] == "ok"}
    for r in rows:
        if r["status"] == "ok":
            r["speedups"] = ";".join(f"{m}={ms / r['ms']:.4g}" for m, ms in timed.items() if m != r["method"])
    return rows


def _spent(budget_s: float) -> str:
    return f"time budget of {budget_s:.0f} s spent"


def run_sweep(
    problems: list[Problem],
    methods: list[str],
    device: torch.device,
    limits: Limits,
    s: MeasureOptions,
    device_name: str,
    *,
    budget_s: float = math.inf,
    deadline: float = math.inf,
    desc: str = "bench",
) -> list[dict]:
    """Rows of every method on every problem; none measured past `budget_s` from now or past
    `deadline` (time.monotonic(): a run's budget shared by its matrices), whichever is first."""
    rows = []
    deadline = min(deadline, time.monotonic() + budget_s)
    for p in progress(problems, desc):
        if time.monotonic() > deadline:
            rows += [_row(p, m, device_name, limits, status="skip", note=_spent(budget_s)) for m in methods]
            continue
        try:
            rows += run_problem(p, methods, device, limits, s, device_name, deadline, budget_s)
        except Exception as e:  # inputs themselves failed (e.g. out of memory): record and go on
            rows += [_row(p, m, device_name, limits, status="error", note=f"inputs: {_error(e)}") for m in methods]
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows
