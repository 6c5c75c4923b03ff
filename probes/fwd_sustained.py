"""What makes back-to-back prefill forward calls slower than an isolated one?

Nsight Compute timed one isolated 64k prefill forward call (caches flushed before it) at
15.37 ms with K and V as separate tensors, the same as with K and V in one [G, 2, S_kv, D]
buffer, while back-to-back calls took 15.8 ms separate and 15.4 ms in the one buffer
(fwd_kv_power.py: same SM clock and power in both). This probe times each call alone
(CUDA events around the call only, where the bench timer times calls back to back) after
different things happen between calls: nothing, a 256 MiB read (leaves L2 clean), a 256 MiB
write (leaves it dirty), or an idle 20 ms; for K/V stored separately and per key
(`with_kv_layout`).
Run on a GPU: python3 probes/fwd_sustained.py"""

import statistics
import time

import torch

from selgate.bench.inputs import make_inputs, prefill_problem, with_kv_layout
from selgate.kernels.triton.fwd import launch_config, triton_forward

dev = torch.device("cuda")
p = prefill_problem(65536, 64, 4, 128, 128, 64, 16, "bfloat16")
x0 = make_inputs(p, seed=0, device=dev)
base = launch_config(128, 128, 2, "prefill", dtype=torch.bfloat16, S_kv=p.S_kv, n=x0.ranges.shape[3])
buf = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
between = {
    "nothing": lambda: None,
    "read 256 MiB": lambda: buf.max(),
    "write 256 MiB": lambda: buf.zero_(),
    "idle 20 ms": lambda: (torch.cuda.synchronize(), time.sleep(0.02)),
}
rows = []
for rnd in range(2):
    for layout in ("separate", "key"):
        x = with_kv_layout(x0, layout)
        for name, gap in between.items():
            ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(12)]
            for a, b in ev:
                gap()
                a.record()
                triton_forward(x.q, x.k, x.v, x.ranges, scale=x.scale, config=base)
                b.record()
            torch.cuda.synchronize()
            t = statistics.median(a.elapsed_time(b) for a, b in ev[2:])
            rows.append((rnd, layout, name, t))
            print(rows[-1], flush=True)
print("| round | layout | between calls | ms per call |")
print("| --- | --- | --- | --- |")
for r in rows:
    print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]:.2f} |")
