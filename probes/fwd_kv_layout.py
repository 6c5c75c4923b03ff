"""Does where K and V sit in memory change the prefill forward's speed?

Why: fwd_l2_window.py found the 64k prefill forward 4.6 % faster when a group's K and V
were stored in one [G, 2, S_kv, D] buffer than as two separate tensors, with the same bytes
selected. This probe times the profile launch (`bench.timing.time_calls` median, two rotating input sets)
on the same values in several storage layouts, all passed as k/v views of the SPEC shapes,
and checks every output equals the separate-tensor one bit for bit:
  - separate: q, k, v as `make_inputs` allocates them (their distance is printed);
  - gap X: K and V in one buffer, V starting 64 MiB + X after K ([2, G, S_kv, D] for X = 0);
  - group-interleaved: [G, 2, S_kv, D]; key-interleaved: [G, S_kv, 2, D] (K, V rows adjacent);
  - `repack + run`: copying separate K, V into the group-interleaved layout inside the call.
Run on a GPU: python3 probes/fwd_kv_layout.py"""

import torch

from selgate.bench.inputs import make_inputs, prefill_problem, with_kv_layout
from selgate.bench.timing import time_calls
from selgate.kernels.triton.fwd import launch_config, triton_forward

dev = torch.device("cuda")
p = prefill_problem(65536, 64, 4, 128, 128, 64, 16, "bfloat16")
sets = [make_inputs(p, seed=s, device=dev) for s in range(2)]
G, S_kv, D = p.G, p.S_kv, 128
base = launch_config(D, D, 2, "prefill", dtype=torch.bfloat16, S_kv=S_kv, n=sets[0].ranges.shape[3])
for x in sets:
    print(f"v - k = {(x.v.data_ptr() - x.k.data_ptr()) / 2**20:.3f} MiB; k % 2 MiB = {x.k.data_ptr() % (2 << 20)}", flush=True)
MiB = 1 << 20
per = G * S_kv * D  # elements of one of K, V


def gap(x, extra):
    buf = torch.empty(2 * per + extra // 2, dtype=x.k.dtype, device=dev)
    k = buf[:per].view(1, G, S_kv, D)
    v = buf[per + extra // 2 :].view(1, G, S_kv, D)
    k.copy_(x.k)
    v.copy_(x.v)
    return k, v


def stored(layout):
    return lambda x: (lambda y: (y.k, y.v))(with_kv_layout(x, layout))


layouts = {
    "separate": lambda x: (x.k, x.v),
    "gap 0": lambda x: gap(x, 0),
    "gap 4 KiB": lambda x: gap(x, 4096),
    "gap 1 MiB": lambda x: gap(x, MiB),
    "gap 8 MiB": lambda x: gap(x, 8 * MiB),
    "group-interleaved": stored("group"),
    "key-interleaved": stored("key"),
}
kv = {name: [make(x) for x in sets] for name, make in layouts.items()}


def run(x, k, v):
    return triton_forward(x.q, k, v, x.ranges, scale=x.scale, config=base)[0]


def repack_run(x):
    return run(x, *stored("group")(x))


ref = run(sets[0], sets[0].k, sets[0].v)
variants = {name: (lambda name: lambda i: run(sets[i], *kv[name][i]))(name) for name in layouts}
variants["repack + run"] = lambda i: repack_run(sets[i])
rows = []
for rnd in range(2):
    for name, fn in variants.items():
        same = bool(torch.equal(fn(0), ref))
        t = time_calls([lambda: fn(0), lambda: fn(1)], dev, warmup=5, iters=20).median_ms
        rows.append((rnd, name, t, same))
        print(rows[-1], flush=True)
print("| round | layout | ms | output equal |")
print("| --- | --- | --- | --- |")
for rnd, name, t, same in rows:
    print(f"| {rnd} | {name} | {t:.2f} | {same} |")
