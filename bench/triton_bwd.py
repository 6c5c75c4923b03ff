"""Benchmark of the Triton backward on the device, in one process: B=1, T=65536, 64 heads in
4 groups (h=16), D=Dv=128, 16 blocks of 64 from the range builder (block 0 and 2 local
forced), bf16: forward, backward (index build alone too), forward+backward through autograd
and through the dispatcher, packed SDPA forward+backward, a launch-config sweep, peak extra
memory of the backward and the device time per kernel. Whether the backward is right is the
conformance matrix's question (`pytest --pyargs selgate.conformance -m "conformance and
backward" --impl triton --size large`).

    selgate bench triton-bwd --out DIR

Writes DIR/triton_bwd.md and DIR/results.json; prints the tables last.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from selgate.kernels import selection_attention
from selgate.kernels.sdpa import selection_attention_sdpa
from selgate.reference import build_ranges, normalize_ranges, resolve_scale, selected_lengths
from selgate.reference.ranges import key_limit
from selgate.kernels.served import run_environment

from selgate.kernels.triton.autograd import selection_attention_triton_autograd
from selgate.kernels.triton.bwd import launch_config, triton_backward
from selgate.kernels.triton.inverse_index import InverseIndex
from selgate.kernels.triton.fwd import triton_forward
from selgate.cli import prog
from selgate.cli_args import Parser, positive_number

from .timing import time_calls

DEV = "cuda"
STAMP = ("gpu", "driver", "cuda", "torch", "triton", "python", "commit", "finished")
SWEEP = [
    {"overlap": False},
    {"dq_tma": False},
    {"dq_warps": 4},
    {"dq_warps": 1},
    {"dq_stages": 2},
    {"dq_block_n": 32},
    {"dq_tail_n": 16},
    {"block_m": 64},
    {"stages": 3},
    {"chunk": 512},
    {"block_n": 32},
]


def kernel_times(fn, reps: int = 3, top: int = 12) -> list:
    """Table rows `| kernel | ms |` of the device kernels `fn` launches (torch.profiler)."""
    try:
        from torch.profiler import ProfilerActivity, profile

        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(reps):
                fn()
            torch.cuda.synchronize()
        ev = sorted(prof.key_averages(), key=lambda e: -e.device_time_total)[:top]
        return [f"| {e.key[:90]} | {e.device_time_total / reps / 1e3:.3f} |" for e in ev]
    except Exception as e:  # the profiler is a nice-to-have; never lose the run over it
        return [f"| profiler failed: {type(e).__name__}: {e} | - |"]


def bench(out: dict, deadline: float) -> list:
    T, G, h, D = 65536, 4, 16, 128
    dt = torch.bfloat16
    g = torch.Generator(device=DEV).manual_seed(3)
    p = torch.rand(1, T, G, T // 64, device=DEV, generator=g)
    ranges = build_ranges(p, G=G, l_sel=64, n=16, S_kv=T)
    del p
    norm = normalize_ranges(ranges, T)
    sc = resolve_scale(None, D)
    sets = []
    for _ in range(2):  # rotate two input sets
        q = torch.randn(1, T, G, h, D, device=DEV, generator=g).to(dt)
        k = torch.randn(1, G, T, D, device=DEV, generator=g).to(dt)
        v = torch.randn(1, G, T, D, device=DEV, generator=g).to(dt)
        do = torch.randn(1, T, G, h, D, device=DEV, generator=g).to(dt)
        o, lse = triton_forward(q, k, v, norm, scale=sc)
        sets.append(dict(q=q, k=k, v=v, do=do, o=o, lse=lse, leaves=[t.clone().requires_grad_() for t in (q, k, v)]))

    def ms(fn, iters=20, warmup=3):  # 20 calls of a 50 ms forward+backward: a median of 4 moved by 3 ms between runs
        return time_calls([lambda s=s: fn(s) for s in sets], torch.device(DEV), warmup=warmup, iters=iters).median_ms

    def bwd(s, config=None):
        return triton_backward(s["q"], s["k"], s["v"], s["o"], s["lse"], s["do"], norm, scale=sc, config=config)

    def fwd_bwd_autograd(s):
        o, _ = selection_attention_triton_autograd(*s["leaves"], norm, scale=sc)
        return torch.autograd.grad(o, s["leaves"], s["do"])

    def fwd_bwd_dispatch(s):
        o = selection_attention(*s["leaves"], ranges, backend="triton", strict=True)
        return torch.autograd.grad(o, s["leaves"], s["do"])

    lim = key_limit(norm, T)[:, :, 0, 0].contiguous()
    res = {
        "fwd": ms(lambda s: triton_forward(s["q"], s["k"], s["v"], norm, scale=sc)),
        "bwd": ms(bwd),
        "index": ms(lambda s: InverseIndex(norm, lim, G, T, 64, launch_config(D, D, dt)["chunk"])),
        "fwd_bwd_autograd": ms(fwd_bwd_autograd),
        "fwd_bwd_dispatch": ms(fwd_bwd_dispatch),
    }
    print(f"bench: {res}", flush=True)
    s0 = sets[0]
    torch.cuda.synchronize()
    base_mem = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    grads = bwd(s0)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base_mem
    out_bytes = sum(t.numel() * t.element_size() for t in grads)
    del grads
    idx = InverseIndex(norm, lim, G, T, 64, launch_config(D, D, dt)["chunk"])
    idx_bytes = sum(t.numel() * t.element_size() for t in vars(idx).values() if isinstance(t, torch.Tensor))
    pairs, items, slots = idx.pair_row.numel(), idx.n_items, idx.n_slots
    del idx
    sweep = []
    for cfg in SWEEP:
        if time.time() > deadline:
            sweep.append((cfg, None, "not run: time budget"))
            continue
        try:
            sweep.append((cfg, ms(lambda s: bwd(s, cfg), iters=10), ""))
        except Exception as e:  # e.g. out of resources: record and go on
            sweep.append((cfg, None, f"{type(e).__name__}: {str(e)[:80]}"))
        print(f"  sweep {sweep[-1]}", flush=True)
    kernels = kernel_times(lambda: (triton_forward(s0["q"], s0["k"], s0["v"], norm, scale=sc), bwd(s0)))
    t_sdpa = None
    if time.time() < deadline:

        def sdpa_fb(s):
            o = selection_attention_sdpa(*s["leaves"], norm, scale=sc, normalized=True)
            return torch.autograd.grad(o, s["leaves"], s["do"])

        t_sdpa = ms(sdpa_fb, iters=1, warmup=1)  # seconds a call: one warm-up, one timed call
    L = selected_lengths(norm)
    out["bench"] = dict(
        res,
        sdpa_fwd_bwd=t_sdpa,
        peak_extra=peak - out_bytes,
        idx_bytes=idx_bytes,
        pairs=pairs,
        items=items,
        slots=slots,
        sweep=sweep,
    )
    mib = 1 / 2**20
    sdpa_ms = f"{t_sdpa:.1f} ms" if t_sdpa else "not run"
    speedup = f"{t_sdpa / res['fwd_bwd_autograd']:.1f}x" if t_sdpa else "-"
    return [
        f"prefill: B=1 T=65536 G=4 h=16 (64 heads) D=Dv=128 bf16, 16 builder blocks of 64 per row "
        f"(L {int(L.min())}..{int(L.max())}, mean {float(L.float().mean()):.0f}), "
        "median of event-timed calls over 2 rotating input sets",
        "",
        "| measurement | value |",
        "| --- | --- |",
        f"| forward (triton_forward) | {res['fwd']:.2f} ms |",
        f"| backward (triton_backward: delta, dq, index, dk/dv) | {res['bwd']:.2f} ms |",
        f"| of which inverse-index build | {res['index']:.2f} ms |",
        f"| **forward + backward (autograd Function)** | **{res['fwd_bwd_autograd']:.2f} ms** (target <= 50) |",
        f"| forward + backward through selection_attention (normalise + dispatch) | {res['fwd_bwd_dispatch']:.2f} ms |",
        f"| packed SDPA forward + backward | {sdpa_ms} |",
        f"| speed-up vs packed SDPA | {speedup} |",
        f"| peak extra memory of backward (beyond dq, dk, dv) | {(peak - out_bytes) * mib:.0f} MiB |",
        f"| of which inverse index | {idx_bytes * mib:.0f} MiB ({pairs:,} (row, tile) pairs, {items:,} dk/dv "
        f"programs, {slots:,} fp32 partial tiles) |",
        "",
        f"default launch config: {launch_config(D, D, dt)}",
        "",
        "| backward config override | ms | note |",
        "| --- | --- | --- |",
        *(f"| {c} | {'-' if t is None else round(t, 2)} | {n} |" for c, t, n in sweep),
        "",
        "GPU time per kernel, one forward + backward (torch.profiler, mean of 3):",
        "",
        "| kernel | ms |",
        "| --- | --- |",
        *kernels,
    ]


def main(argv=None):
    ap = Parser(prog=f"{prog('python -m selgate.bench')} triton-bwd", description=__doc__)
    ap.add_argument("--out", type=Path, required=True, help="folder for triton_bwd.md (the tables) and results.json")
    ap.add_argument(
        "--budget-s",
        "--budget_s",
        type=positive_number,
        default=135.0,
        help="stop starting new sweep entries after this many seconds",
    )
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    env = run_environment()
    out = {"stamp": {k: env.get(k) for k in STAMP}}
    print("\n".join(f"{k}: {v}" for k, v in out["stamp"].items()), flush=True)
    lines = bench(out, time.time() + args.budget_s)
    md = [
        "# Triton selection backward on the device: benchmark",
        "",
        "| | |",
        "| --- | --- |",
        *(f"| {k} | {v} |" for k, v in out["stamp"].items()),
        "",
        *lines,
    ]
    (args.out / "results.json").write_text(json.dumps(out, indent=1, default=str))
    (args.out / "triton_bwd.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
