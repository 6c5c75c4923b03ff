"""Why does the prefill forward's sustained speed depend on the K/V layout?

fwd_kv_layout.py timed the 64k prefill forward (do_bench, L2 flushed before each call)
4.6 % faster with K and V in one [G, 2, S_kv, D] buffer than as separate tensors, while
Nsight Compute saw the same 15.37 ms and the same L2 and DRAM traffic for one isolated call
of each. This probe times each layout two ways, do_bench and 40 back-to-back calls over two
rotating input sets (CUDA events, no flush), while nvidia-smi samples SM clock, power and
throttle reasons every 50 ms; per layout it prints the samples' medians.
Run on a GPU: python3 bench/probes/fwd_kv_power.py"""

import statistics
import subprocess
import time

import torch
from triton.testing import do_bench

from selgate.bench.inputs import KV_LAYOUTS, make_inputs, prefill_problem, with_kv_layout
from selgate.kernels.triton.fwd import launch_config, triton_forward

dev = torch.device("cuda")
p = prefill_problem(65536, 64, 4, 128, 128, 64, 16, "bfloat16")
sets = [make_inputs(p, seed=s, device=dev) for s in range(2)]
base = launch_config(128, 128, 2, "prefill", dtype=torch.bfloat16, S_kv=p.S_kv, n=sets[0].ranges.shape[3])
QUERY = "clocks.sm,clocks.mem,power.draw,clocks_event_reasons.active"


def sampled(fn):
    smi = subprocess.Popen(
        ["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits", "-lms", "50"], stdout=subprocess.PIPE, text=True
    )
    time.sleep(0.3)
    out = fn()
    time.sleep(0.1)
    smi.terminate()
    rows = [r.split(", ") for r in smi.communicate()[0].strip().splitlines() if r]
    sm = statistics.median(float(r[0]) for r in rows)
    power = statistics.median(float(r[2]) for r in rows)
    reasons = sorted({r[3] for r in rows})
    return out, sm, power, reasons


def stream_ms(xs):
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for i in range(40):
        x = xs[i % 2]
        triton_forward(x.q, x.k, x.v, x.ranges, scale=x.scale, config=base)
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / 40


rows = []
for rnd in range(2):
    for layout in KV_LAYOUTS:
        xs = [with_kv_layout(x, layout) for x in sets]
        it = iter(range(10**6))
        t_db, sm1, w1, r1 = sampled(
            lambda: do_bench(
                lambda: (lambda x: triton_forward(x.q, x.k, x.v, x.ranges, scale=x.scale, config=base))(xs[next(it) % 2]),
                warmup=10,
                rep=300,
                return_mode="median",
            )
        )
        stream_ms(xs)
        t_st, sm2, w2, r2 = sampled(lambda: stream_ms(xs))
        rows.append((rnd, layout, t_db, sm1, w1, t_st, sm2, w2, r1 + r2))
        print(rows[-1], flush=True)
print("| round | layout | do_bench ms | SM MHz | W | stream ms | SM MHz | W | event reasons |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for r in rows:
    print(f"| {r[0]} | {r[1]} | {r[2]:.2f} | {r[3]:.0f} | {r[4]:.0f} | {r[5]:.2f} | {r[6]:.0f} | {r[7]:.0f} | {' '.join(r[8])} |")
