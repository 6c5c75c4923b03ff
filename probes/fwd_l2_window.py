"""Is the prefill forward held back by what L2 keeps, and can an L2 access-policy window help?

Why: the 64k prefill forward is bound by moving the selected K/V tiles from L2 (Nsight
Compute: L2 at 91.5 % of peak), yet the same kernel with every key taken modulo 4096 (a 2 MiB
working set per group) ran 10 % faster (docs/design/triton-forward.md). Triton 3.6 drops cache hints on tensor-
descriptor loads, but a stream's access-policy window (driver API, SM >= 8.0) marks an
address range as persisting in L2 for every kernel launched on it. This probe times, at the
64k prefill shape (`bench.timing.time_calls` median, two rotating input sets, the profile launch):
  - `mod M`: keys taken modulo M (ranges remapped, then normalised): time against working set;
  - `kv interleaved`: K and V of a group in one 32 MiB block ([G, 2, S_kv, D] storage);
  - `per group`: one launch per KV group on that layout;
  - `per group + window r`: the same with the group's K and V in a persisting window, hitRatio r.
Outputs of the layout and window variants must equal the profile launch's bit for bit.
Run on a GPU: python3 probes/fwd_l2_window.py"""

import ctypes

import torch

from selgate.bench.inputs import make_inputs, prefill_problem, with_kv_layout
from selgate.bench.timing import time_calls
from selgate.kernels.triton.fwd import launch_config, triton_forward
from selgate.reference import normalize_ranges

cu = ctypes.CDLL("libcuda.so.1")


class Window(ctypes.Structure):
    _fields_ = [
        ("base_ptr", ctypes.c_void_p),
        ("num_bytes", ctypes.c_size_t),
        ("hitRatio", ctypes.c_float),
        ("hitProp", ctypes.c_int),
        ("missProp", ctypes.c_int),
    ]


class AttrValue(ctypes.Union):
    _fields_ = [("window", Window), ("pad", ctypes.c_char * 64)]


def check(rc, what):
    if rc != 0:
        raise RuntimeError(f"{what} failed: CUresult {rc}")


def set_window(stream, ptr, nbytes, ratio):
    val = AttrValue()
    val.window = Window(ptr, nbytes, ratio, 2 if nbytes else 0, 1 if nbytes else 0)  # persisting / streaming
    check(cu.cuStreamSetAttribute(ctypes.c_void_p(stream), 1, ctypes.byref(val)), "cuStreamSetAttribute")


def attr(i):
    out = ctypes.c_int()
    check(cu.cuDeviceGetAttribute(ctypes.byref(out), i, 0), f"cuDeviceGetAttribute({i})")
    return out.value


dev = torch.device("cuda")
torch.zeros(1, device=dev)
max_persist, max_window = attr(108), attr(109)
print(f"max persisting L2 {max_persist / 2**20:.1f} MiB, max window {max_window / 2**20:.1f} MiB", flush=True)
check(cu.cuCtxSetLimit(6, ctypes.c_size_t(max_persist)), "cuCtxSetLimit")

p = prefill_problem(65536, 64, 4, 128, 128, 64, 16, "bfloat16")
sets = [make_inputs(p, seed=s, device=dev) for s in range(2)]
G, S_kv = p.G, p.S_kv
base = launch_config(128, 128, 2, "prefill", dtype=torch.bfloat16, S_kv=S_kv, n=sets[0].ranges.shape[3])
print("profile launch", base, flush=True)


kvs = [with_kv_layout(x, "group") for x in sets]  # a group's K then its V: one window per group
group_bytes = 2 * S_kv * 128 * 2
stream = torch.cuda.current_stream().cuda_stream


def whole(x, k, v, ranges=None):
    return triton_forward(x.q, k, v, x.ranges if ranges is None else ranges, scale=x.scale, config=base)[0]


def per_group(x, y, ratio=None):
    o = torch.empty(1, p.S, G, p.h, 128, dtype=x.v.dtype, device=dev)
    lse = torch.empty(1, p.S, G, p.h, dtype=torch.float32, device=dev)
    for g in range(G):
        if ratio is not None:
            set_window(stream, y.k[0, g].data_ptr(), min(group_bytes, max_window), ratio)
        triton_forward(
            x.q[:, :, g : g + 1],
            y.k[:, g : g + 1],
            y.v[:, g : g + 1],
            x.ranges[:, :, g : g + 1],
            scale=x.scale,
            config=base,
            out=(o[:, :, g : g + 1], lse[:, :, g : g + 1]),
        )
    if ratio is not None:
        set_window(stream, 0, 0, 0.0)
    return o


ref = whole(sets[0], sets[0].k, sets[0].v)
variants = {
    "profile launch": lambda i: whole(sets[i], sets[i].k, sets[i].v),
    "kv interleaved": lambda i: whole(sets[i], kvs[i].k, kvs[i].v),
    "per group": lambda i: per_group(sets[i], kvs[i]),
}
for r in (1.0, 0.75, 0.5):
    variants[f"per group + window {r}"] = (lambda r: lambda i: per_group(sets[i], kvs[i], min(r, max_persist / group_bytes)))(r)
for M in (32768, 16384, 4096):
    rs = [
        normalize_ranges(
            torch.stack([x.ranges[..., 0] % M, x.ranges[..., 0] % M + x.ranges[..., 1] - x.ranges[..., 0]], -1), S_kv
        )
        for x in sets
    ]  # each range moved below M, same length
    variants[f"mod {M}"] = (lambda rs: lambda i: whole(sets[i], sets[i].k, sets[i].v, rs[i]))(rs)
rows = []
for rnd in range(2):
    for name, fn in variants.items():
        same = bool(torch.equal(fn(0), ref)) if not name.startswith("mod") else "n/a"
        t = time_calls([lambda: fn(0), lambda: fn(1)], dev, warmup=5, iters=20).median_ms
        rows.append((rnd, name, t, same))
        print(rows[-1], flush=True)
check(cu.cuCtxResetPersistingL2Cache(), "cuCtxResetPersistingL2Cache")
print("| round | variant | ms | output equal |")
print("| --- | --- | --- | --- |")
for rnd, name, t, same in rows:
    print(f"| {rnd} | {name} | {t:.2f} | {same} |")
