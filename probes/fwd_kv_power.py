"""Does the K/V layout change the prefill forward's sustained clock or power?

Back-to-back 64k prefill forward calls ran 3-4 % faster with K and V in one buffer than as
separate tensors, while Nsight Compute saw the same 15.37 ms and the same L2 and DRAM traffic
for one isolated call of each (docs/design/triton-forward.md). This probe times each layout
with the bench timer (`bench.timing.time_calls`: back-to-back calls over two rotating input
sets, CUDA events) while nvidia-smi samples SM clock, power and throttle reasons every 50 ms;
per layout it prints the samples' medians.
Run on a GPU: python3 probes/fwd_kv_power.py"""

import statistics
import subprocess
import time

import torch

from selgate.bench.inputs import KV_LAYOUTS, make_inputs, prefill_problem, with_kv_layout
from selgate.bench.timing import time_calls
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


rows = []
for rnd in range(2):
    for layout in KV_LAYOUTS:
        calls = [
            lambda x=with_kv_layout(x, layout): triton_forward(x.q, x.k, x.v, x.ranges, scale=x.scale, config=base) for x in sets
        ]
        t, sm, w, reasons = sampled(lambda: time_calls(calls, dev, warmup=5, iters=40, max_seconds=4.0).median_ms)
        rows.append((rnd, layout, t, sm, w, reasons))
        print(rows[-1], flush=True)
print("| round | layout | ms | SM MHz | W | event reasons |")
print("| --- | --- | --- | --- | --- | --- |")
for r in rows:
    print(f"| {r[0]} | {r[1]} | {r[2]:.2f} | {r[3]:.0f} | {r[4]:.0f} | {' '.join(r[5])} |")
