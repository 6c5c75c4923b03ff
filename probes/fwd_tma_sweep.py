"""Launch sweep of the Triton forward's TMA path at the 64k prefill shape (T=65536, bf16).

The bench's `triton@BxWxS` variants time the gather path only; this probe times the tensor-
descriptor path the H100 profile uses for prefill, against the gather path (first row), so
the profile's `triton_fwd.prefill` values come from a measurement (docs/design/triton-forward.md).
Run on a GPU: python3 probes/fwd_tma_sweep.py"""

import torch

from selgate.bench.inputs import make_inputs, prefill_problem
from selgate.bench.timing import time_calls
from selgate.kernels.triton.fwd import triton_forward

p = prefill_problem(65536, 64, 4, 128, 128, 64, 16, "bfloat16")
dev = torch.device("cuda")
sets = [make_inputs(p, seed=s, device=dev) for s in range(2)]
ref = None
rows = []
cfgs = [dict(BLOCK_L=64, num_warps=2, num_stages=3, TMA=False, TAIL_L=64)]
for bl, w, st, tail in [
    (64, 2, 3, 32),
    (64, 1, 2, 32),
    (64, 2, 2, 32),
    (64, 1, 3, 32),
    (32, 1, 2, 32),
    (32, 2, 2, 32),
    (32, 1, 3, 32),
    (32, 1, 4, 32),
    (32, 2, 4, 32),
    (16, 1, 3, 16),
    (16, 1, 4, 16),
    (16, 1, 6, 16),
    (64, 1, 2, 16),
    (64, 1, 2, 64),
]:
    cfgs.append(dict(BLOCK_L=bl, num_warps=w, num_stages=st, TMA=True, TAIL_L=tail))
for c in cfgs:
    try:
        x = sets[0]
        o = triton_forward(x.q, x.k, x.v, x.ranges, scale=x.scale, config=c)[0]
        if ref is None:
            ref = o.float()
        diff = float((o.float() - ref).abs().max())
        calls = [lambda x=x: triton_forward(x.q, x.k, x.v, x.ranges, scale=x.scale, config=c) for x in sets]
        t = time_calls(calls, dev, warmup=5, iters=20).median_ms
        rows.append((c, t, diff))
    except Exception as e:
        rows.append((c, None, f"{type(e).__name__}: {str(e)[:80]}"))
    print(rows[-1], flush=True)
print("| BLOCK_L | warps | stages | TMA | TAIL_L | ms | max diff vs gather |")
for c, t, d in rows:
    print(
        f"| {c['BLOCK_L']} | {c['num_warps']} | {c['num_stages']} | {c['TMA']} | {c['TAIL_L']} | {t if t is None else round(t, 2)} | {d} |"
    )
