"""Issue-4 prefill forward with and without a bulk L2 prefetch of each row's selected K/V.

Why: the forward is bound by L2 -> SM traffic, and the 6 % of its tile reads that miss L2 cost
about 1.5 ms (triton_fwd_dev.md, run 5: 15.86 ms against 14.33 with a 2 MiB working set). A row
knows all its ranges at the start, so it can ask L2 for all of them at once and its pipelined
tile loads then wait on L2, not DRAM. Same shape, inputs and timer as fwd_tma_sweep.py; the
profile's launch (32x1x3, TMA, tail 32), each variant timed twice, interleaved.
Run on a GPU: python3 bench/probes/fwd_prefetch.py"""
import itertools

import torch
from triton.testing import do_bench

from selgate.bench.inputs import make_inputs, prefill_problem
from selgate.kernels.triton.fwd import triton_forward

p = prefill_problem(65536, 64, 4, 128, 128, 64, 16, "bfloat16")
sets = [make_inputs(p, seed=s, device=torch.device("cuda")) for s in range(2)]
it = itertools.count()
base = dict(BLOCK_L=32, num_warps=1, num_stages=3, TMA=True, TAIL_L=32)
variants = {"profile": base, "prefetch": dict(base, PREFETCH=True),
            "prefetch 64x1x2": dict(base, BLOCK_L=64, num_stages=2, PREFETCH=True),
            "prefetch 32x1x2": dict(base, num_stages=2, PREFETCH=True)}
x = sets[0]
ref = triton_forward(x.q, x.k, x.v, x.ranges, scale=x.scale, config=base)[0].float()
rows = []
for rnd in range(2):
    for name, c in variants.items():
        o = triton_forward(x.q, x.k, x.v, x.ranges, scale=x.scale, config=c)[0].float()
        t = do_bench(lambda: (lambda y: triton_forward(y.q, y.k, y.v, y.ranges, scale=y.scale, config=c))(sets[next(it) % 2]),
                     warmup=10, rep=300, return_mode="median")
        rows.append((rnd, name, t, float((o - ref).abs().max())))
        print(rows[-1], flush=True)
print("| round | variant | ms | max diff vs profile |\n| --- | --- | --- | --- |")
for rnd, name, t, d in rows:
    print(f"| {rnd} | {name} | {t:.2f} | {d} |")
