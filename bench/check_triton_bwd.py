"""One-shot GPU check of the Triton backward, in one process:

1. benchmark, B=1, T=65536, 64 heads in 4 groups (h=16), D=Dv=128, 16 blocks of 64 from the
   range builder (block 0 and 2 local forced), bf16: forward, backward (index build
   alone too), forward+backward through autograd and through the dispatcher, packed SDPA
   forward+backward, a launch-config sweep, peak extra memory of the backward, and
   gradient parity of the last 256 queries at that size;
2. determinism: 50 forward+backward passes through the dispatcher at a heavy-reuse
   prefill shape, bitwise-equal o, lse, dq, dk, dv;
3. the bf16 autocast toy training loop (`train_check.py`);
4. gradient parity per SPEC.md: fp32/fp16/bf16 x h in {1, 4, 16} x D in {64, 128, 192}
   x few/many/heavy-reuse ranges x decode/prefill, NaN-poisoned outputs and NaN keys
   outside the selection (stops when its time budget is spent, and says so).

    python -m selgate.bench.check_triton_bwd --out DIR
    python -m selgate.bench.check_triton_bwd --out DIR --sections parity --dtypes bfloat16 --dims 128

Writes DIR/triton_bwd.md and DIR/results.json; prints the tables last.
"""

from __future__ import annotations

import argparse
import itertools
import time
from pathlib import Path

import torch

from selgate.kernels import selection_attention
from selgate.kernels.sdpa import selection_attention_sdpa
from selgate.reference import build_ranges, normalize_ranges, resolve_scale, selected_keys, selected_lengths
from selgate.reference.golden import gather_attention
from selgate.reference.ranges import key_limit

from selgate.kernels.triton.autograd import selection_attention_triton_autograd
from selgate.kernels.triton.bwd import InverseIndex, launch_config, triton_backward
from selgate.kernels.triton.fwd import triton_forward

from .check_triton_fwd import pattern_ranges, run_sections, stamp
from .timing import time_calls
from .train_check import run as train_run
from .train_check import verdict as train_verdict

DEV = "cuda"
NAMES = ("o", "lse", "dq", "dk", "dv")
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


def golden_grads(q, k, v, norm, do, w, sc, dtype):
    """o, lse and the gradients of `sum(o * do) + sum(lse * w)` (empty rows left out) by the
    gather formulation in `dtype`: fp64 is the golden result, a low precision the baseline."""
    leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
    o, lse = gather_attention(*leaves, norm, scale=sc, dtype=dtype)
    lse_f = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    loss = (o * do.to(dtype)).sum() + (lse_f * w.to(dtype)).sum()
    return [o.detach(), lse.detach(), *torch.autograd.grad(loss, leaves)]


def spec_check(dtype, got, ref, base, names=NAMES) -> dict:
    """SPEC.md per tensor: max error <= 1e-5 (fp32) or 2x/3x (o, lse / gradients) the
    baseline's plus 2 eps max|ref|, mean <= 1e-6 / 1e-3, NaN/inf where ref is finite fails,
    and -inf LSE exactly where the reference has it. Returns {name: (max, bound, mean, ok)}."""
    res = {}
    for name, x, r, b in zip(names, got, ref, base):
        fin = torch.isfinite(r)
        x, r, b = x.double(), r.double(), b.double()
        err = (x[fin] - r[fin]).abs()
        ok = bool(torch.isfinite(x[fin]).all()) and bool(torch.equal(x[~fin], r[~fin]))
        if not err.numel():
            res[name] = (0.0, 0.0, 0.0, ok)
            continue
        if dtype == torch.float32:
            bound, mean_bound = 1e-5, 1e-6
        else:
            factor = 2 if name in ("o", "lse") else 3
            bound = factor * float((b[fin] - r[fin]).abs().max()) + 2 * torch.finfo(dtype).eps * float(r[fin].abs().max())
            mean_bound = 1e-3
        mx, mean = float(err.max()), float(err.mean())
        res[name] = (mx, bound, mean, ok and mx <= bound and mean <= mean_bound)
    return res


def parity(
    out: dict,
    deadline: float,
    dtypes=(torch.float32, torch.float16, torch.bfloat16),
    dims=(64, 128, 192),
    heads=(1, 4, 16),
    patterns=("few", "many", "heavy_reuse"),
    modes=("decode", "prefill"),
) -> list:
    g = torch.Generator().manual_seed(0)
    gd = torch.Generator(device=DEV).manual_seed(0)
    S_kv, G = 2112, 2
    rows = []
    for dtype, D in itertools.product(dtypes, dims):
        name = str(dtype).split(".")[1]
        if time.time() > deadline:
            rows.append(f"| {name} | {D} | not run: time budget spent | | | | | |")
            continue
        n_ok, n_all, worst = 0, 0, {k: (0.0, 1.0, 0.0) for k in NAMES}
        for h, pattern, mode in itertools.product(heads, patterns, modes):
            B, S = (3, 1) if mode == "decode" else (1, 48)
            q = torch.randn(B, S, G, h, D, device=DEV, generator=gd).to(dtype)
            k = torch.randn(B, G, S_kv, D, device=DEV, generator=gd).to(dtype)
            v = torch.randn(B, G, S_kv, D, device=DEV, generator=gd).to(dtype)
            do = torch.randn(B, S, G, h, D, device=DEV, generator=gd).to(dtype)
            w = torch.randn(B, S, G, h, device=DEV, generator=gd)
            norm = normalize_ranges(pattern_ranges(pattern, B, S, G, S_kv, g), S_kv)
            sc = resolve_scale(None, D)
            used = selected_keys(norm, S_kv)
            kp, vp = k.clone(), v.clone()
            kp[~used] = float("nan")  # never read by the kernels
            vp[~used] = float("nan")
            o = torch.full((B, S, G, h, D), float("nan"), dtype=dtype, device=DEV)
            lse = torch.full((B, S, G, h), float("nan"), device=DEV)
            triton_forward(q, kp, vp, norm, scale=sc, out=(o, lse))
            poison = tuple(torch.full_like(t, float("nan")) for t in (q, k, v))
            dq, dk, dv = triton_backward(q, kp, vp, o, lse, do, norm, scale=sc, dlse=w, out=poison)
            ref = golden_grads(q, k, v, norm, do.double(), w.double(), sc, torch.float64)
            base = ref if dtype == torch.float32 else golden_grads(q, k, v, norm, do, w, sc, dtype)
            r = spec_check(dtype, (o, lse, dq, dk, dv), ref, base)
            zero = bool((dk[~used] == 0).all()) and bool((dv[~used] == 0).all())
            ok = zero and all(x[3] for x in r.values())
            n_all += 1
            n_ok += ok
            for key, x in r.items():
                if x[0] / max(x[1], 1e-30) > worst[key][0] / max(worst[key][1], 1e-30):
                    worst[key] = x[:3]
            if not ok:
                print(f"PARITY FAIL {name} D={D} h={h} {pattern} {mode} zero_unselected={zero}: {r}", flush=True)
        rows.append(
            f"| {name} | {D} | {n_ok}/{n_all} | "
            + " | ".join(f"{worst[k][0]:.2e} / {worst[k][1]:.2e} ({worst[k][2]:.1e})" for k in NAMES)
            + " |"
        )
        print(f"parity {name} D={D}: {n_ok}/{n_all} ok\n{rows[-1]}", flush=True)  # the row survives a cut-off call
    out["parity"] = rows
    return [
        "| dtype | D=Dk=Dv | cases ok | " + " | ".join(f"worst {k}: max err / bound (mean)" for k in NAMES) + " |",
        "| --- | --- | --- | " + " | ".join("---" for _ in NAMES) + " |",
        *rows,
        "",
        "cases: h in {1, 4, 16} x few/many/heavy_reuse x decode (B=3) / prefill (S=48), G=2, S_kv=2112; "
        "outputs NaN-poisoned, keys outside every row's selection NaN, their dk/dv must be exactly 0.",
    ]


def determinism(out: dict) -> list:
    B, S, G, h, D = 1, 4096, 4, 16, 128
    g = torch.Generator(device=DEV).manual_seed(1)
    leaves = [
        torch.randn(*shape, device=DEV, generator=g).to(torch.bfloat16).requires_grad_()
        for shape in ((B, S, G, h, D), (B, G, S, D), (B, G, S, D))
    ]
    ranges = build_ranges(torch.rand(B, S, G, S // 64, device=DEV, generator=g), G=G, l_sel=64, n=16, S_kv=S)
    do = torch.randn(B, S, G, h, D, device=DEV, generator=g).to(torch.bfloat16)
    w = torch.randn(B, S, G, h, device=DEV, generator=g)

    def once():
        for t in leaves:
            t.grad = None
        o, lse = selection_attention(*leaves, ranges, backend="triton", strict=True, return_lse=True)
        ((o * do).float().sum() + (lse * w).sum()).backward()
        return [o.detach(), lse.detach(), *(t.grad.clone() for t in leaves)]

    first = once()
    diff = [0] * 5
    for _ in range(49):
        for i, (a, b) in enumerate(zip(first, once())):
            diff[i] += not torch.equal(a, b)
    line = (
        "determinism: 50 forward+backward passes through selection_attention(backend='triton', strict=True), "
        "bf16, B=1 S=S_kv=4096 G=4 h=16 D=128, 16 builder blocks of 64 (block 0 and 2 local blocks in every row): "
        + ", ".join(f"{n} {'bitwise equal' if d == 0 else f'DIFFERS in {d} runs'}" for n, d in zip(NAMES, diff))
    )
    out["determinism"] = diff
    print(line, flush=True)
    return [line]


def training(out: dict) -> list:
    t0 = time.time()
    losses = train_run(300)
    ok, first, last = train_verdict(losses)
    out["training"] = {"losses": losses[::10], "ok": ok}
    line = (
        f"bf16 autocast toy training (selection layer G=2 h=4 D=32, T=256, 4 blocks of 32; target = first "
        f"token, reached through block 0), 300 AdamW steps via the dispatcher's Triton path: loss {first:.4f} -> "
        f"{last:.4f} (mean of first/last 20 steps), all finite: {'PASS' if ok else 'FAIL'} ({time.time() - t0:.0f} s)"
    )
    print(line, flush=True)
    return [line]


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
    idx = InverseIndex(norm, lim, G, T, 64, launch_config(D, D, dt)["chunk"])
    idx_bytes = sum(t.numel() * t.element_size() for t in vars(idx).values() if isinstance(t, torch.Tensor))
    pairs, items, slots = idx.pair_row.numel(), idx.n_items, idx.n_slots
    del idx
    # parity at this size: gradients of the last 256 queries only (do = 0 elsewhere)
    tail = slice(T - 256, T)
    do_t = torch.zeros_like(s0["do"])
    do_t[:, tail] = s0["do"][:, tail]
    dq, dk, dv = triton_backward(s0["q"], s0["k"], s0["v"], s0["o"], s0["lse"], do_t, norm, scale=sc)
    zero_w = torch.zeros(1, 256, G, h, device=DEV)
    ref = golden_grads(
        s0["q"][:, tail], s0["k"], s0["v"], norm[:, tail], do_t[:, tail].double(), zero_w.double(), sc, torch.float64
    )
    low = golden_grads(s0["q"][:, tail], s0["k"], s0["v"], norm[:, tail], do_t[:, tail], zero_w, sc, dt)
    tail_chk = spec_check(dt, (dq[:, tail], dk, dv), ref[2:], low[2:], names=("dq", "dk", "dv"))
    tail_ok = all(x[3] for x in tail_chk.values()) and bool((dq[:, : T - 256] == 0).all())
    del ref, low, dq, dk, dv
    sweep = []
    for cfg in SWEEP:
        if time.time() > deadline:
            sweep.append((cfg, None, "not run: time budget"))
            continue
        try:
            got = bwd(s0, cfg)
            same = max(float((a.float() - b.float()).abs().max()) for a, b in zip(got, grads))
            sweep.append((cfg, ms(lambda s: bwd(s, cfg), iters=10), f"max |diff| vs default {same:.2e}"))
        except Exception as e:  # e.g. out of resources: record and go on
            sweep.append((cfg, None, f"{type(e).__name__}: {str(e)[:80]}"))
        print(f"  sweep {sweep[-1]}", flush=True)
    del grads
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
        tail=tail_chk,
        sweep=[(c, t, n) for c, t, n in sweep],
    )
    mib = 1 / 2**20
    sdpa_ms = f"{t_sdpa:.1f} ms" if t_sdpa else "not run"
    speedup = f"{t_sdpa / res['fwd_bwd_autograd']:.1f}x" if t_sdpa else "-"
    lines = [
        f"prefill: B=1 T=65536 G=4 h=16 (64 heads) D=Dv=128 bf16, 16 builder blocks of 64 per row "
        f"(L {int(L.min())}..{int(L.max())}, mean {float(L.float().mean()):.0f}), median of event-timed calls over 2 rotating input sets",
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
        f"| gradient parity, last 256 queries (3x bf16 baseline + floor) | {'PASS' if tail_ok else 'FAIL'}: "
        + ", ".join(f"{k} {v[0]:.2e}/{v[1]:.2e}" for k, v in tail_chk.items())
        + " |",
        "",
        f"default launch config: {launch_config(D, D, dt)}",
        "",
        "| backward config override | ms | check |",
        "| --- | --- | --- |",
        *(f"| {c} | {'-' if t is None else round(t, 2)} | {n} |" for c, t, n in sweep),
        "",
        "GPU time per kernel, one forward + backward (torch.profiler, mean of 3):",
        "",
        "| kernel | ms |",
        "| --- | --- |",
        *kernels,
    ]
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--budget-s", type=float, default=270.0, help="stop starting new work after this many seconds")
    ap.add_argument(
        "--sections",
        nargs="+",
        default=["bench", "determinism", "training", "parity"],
        choices=["bench", "determinism", "training", "parity"],
    )
    ap.add_argument(
        "--dtypes",
        nargs="+",
        default=["float32", "float16", "bfloat16"],
        choices=["float32", "float16", "bfloat16"],
        help="parity dtypes",
    )
    ap.add_argument("--dims", nargs="+", type=int, default=[64, 128, 192], help="parity head dims")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    out = {"stamp": stamp()}
    print("\n".join(f"{k}: {v}" for k, v in out["stamp"].items()), flush=True)
    sections = {name: ["not run (--sections)"] for name in ("bench", "determinism", "training", "parity")}
    dtypes = tuple(getattr(torch, d) for d in args.dtypes)
    steps = (
        ("bench", lambda: bench(out, t0 + args.budget_s * 0.5)),
        ("determinism", lambda: determinism(out)),
        ("training", lambda: training(out)),
        ("parity", lambda: parity(out, t0 + args.budget_s, dtypes=dtypes, dims=tuple(args.dims))),
    )

    def report(done: dict) -> str:
        got = {**sections, **done}
        md = [
            "# Triton selection backward on the device",
            "",
            "| | |",
            "| --- | --- |",
            *(f"| {k} | {v} |" for k, v in out["stamp"].items()),
            "",
            "## Benchmark",
            "",
            *got["bench"],
            "",
            "## Determinism",
            "",
            *got["determinism"],
            "",
            "## Training",
            "",
            *got["training"],
            "",
            "## Gradient parity (SPEC.md, strict)",
            "",
            *got["parity"],
        ]
        (args.out / "triton_bwd.md").write_text("\n".join(md) + "\n")
        return "\n".join(md)

    sections.update(run_sections([s for s in steps if s[0] in args.sections], out, args.out, after=report))
    print(report(sections))


if __name__ == "__main__":
    main()
