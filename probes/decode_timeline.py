"""Where a CUDA decode call spends its time: per-warp timestamps inside the tensor-core kernel.

Builds a private copy of the extension whose kernel stamps %globaltimer at seven points per
warp (entry, griddepcontrol.wait returned, ranges and q ready, first slab landed, loop done,
merge done, stores issued) into a device buffer, replays the decode benchmark grid from a CUDA
graph over rotating inputs (as bench/cuda_decode.py does), and prints per call: span from first warp
entry to last store, the gap to the next call, the time from the previous call's last store to
this call's first wait return, and median / 90th-percentile phase lengths over warps. With PDL
a block may enter long before its wait returns (its `pre-wait` phase).
The stamps are patched into the copy by exact-text anchors, so the probe fails loudly when
the kernel's text moves. Usage on a GPU machine: python3 probes/decode_timeline.py
"""

from __future__ import annotations

import sys

import torch

from selgate.bench.timing import time_graph
from selgate.kernels.cuda import DecodeLaunch, Prefetch, build
from selgate.bench.cuda_decode import nsa_inputs

HEADER = r"""
__device__ unsigned long long sel_tl[1 << 20];
__device__ unsigned int sel_tl_next;
__device__ __forceinline__ unsigned long long sel_now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ unsigned sel_smid() {
  unsigned s;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
  return s;
}
"""
READER = r"""
namespace selgate {
int sel_tl_read(unsigned long long* host, int cap) {
  unsigned used = 0;
  cudaDeviceSynchronize();
  cudaMemcpyFromSymbol(&used, sel_tl_next, sizeof(used));
  const int n = static_cast<int>(used) < cap ? static_cast<int>(used) : cap;
  cudaMemcpyFromSymbol(host, sel_tl, sizeof(unsigned long long) * 8 * n);
  const unsigned zero = 0;
  cudaMemcpyToSymbol(sel_tl_next, &zero, sizeof(zero));
  return n;
}
}  // namespace selgate
"""


def _record(merged: str) -> str:
    """Lane 0 of each warp appends its stamps (`merged`: the merge-done stamp) and returns."""
    return (
        "    if (lane == 0) {\n      const unsigned slot = atomicAdd(&sel_tl_next, 1u);\n"
        "      if (slot < (1u << 17)) {\n        unsigned long long* e = sel_tl + 8ull * slot;\n"
        "        e[0] = (unsigned long long)blockIdx.x | ((unsigned long long)warp << 32) | "
        "((unsigned long long)sel_smid() << 40);\n"
        f"        e[1] = tl0; e[2] = tl1; e[3] = tl2 ? tl2 : tl1; e[4] = tl3; e[5] = {merged}; e[6] = sel_now(); "
        "e[7] = tlw;\n      }\n    }\n    return;\n"
    )


PATCHES = [  # (anchor, replacement) applied once each to sel_decode.cu
    ('#include "sel_decode.h"\n', '#include "sel_decode.h"\n' + HEADER + READER),
    (
        "  extern __shared__ __align__(16) unsigned char smem[];\n  constexpr int NV = DVB / 8;",
        "  extern __shared__ __align__(16) unsigned char smem[];\n  const unsigned long long tl0 = sel_now();\n"
        "  unsigned long long tl2 = 0;\n  constexpr int NV = DVB / 8;",
    ),
    ("  wait_prior_grids();\n", "  wait_prior_grids();\n  const unsigned long long tlw = sel_now();\n"),
    (
        "  const int L = static_cast<int>(rv.L);",
        "  const int L = static_cast<int>(rv.L);\n  const unsigned long long tl1 = sel_now();",
    ),
    ("    if (next == p.stages) next = 0;\n", "    if (i == 0) tl2 = sel_now();\n    if (next == p.stages) next = 0;\n"),
    (
        "  cp_async_wait<0>();\n  l0 = quad_sum(l0);",
        "  const unsigned long long tl3 = sel_now();\n  cp_async_wait<0>();\n  l0 = quad_sum(l0);",
    ),
    # shared slabs: no merge, the stores follow the loop (merge-done stamp = loop-done stamp)
    ("    return;\n  }\n  __syncthreads();\n  constexpr int OS", _record("tl3") + "  }\n  __syncthreads();\n  constexpr int OS"),
    (
        "  T* og = static_cast<T*>(p.o) + (row * p.h + head0) * p.Dv;\n  if (p.split == 1) {",
        "  T* og = static_cast<T*>(p.o) + (row * p.h + head0) * p.Dv;\n  const unsigned long long tl4 = sel_now();\n"
        "  if (p.split == 1) {",
    ),
    ("    return;\n  }\n  if (tid < HG) {", _record("tl4") + "  }\n  if (tid < HG) {"),
]
BIND = (
    "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {",
    "namespace selgate { int sel_tl_read(unsigned long long* host, int cap); }\n"
    "at::Tensor timeline() {\n  auto out = at::empty({1 << 17, 8}, at::kLong);\n"
    "  const int n = selgate::sel_tl_read(reinterpret_cast<unsigned long long*>(out.data_ptr<int64_t>()), 1 << 17);\n"
    "  return out.narrow(0, 0, n);\n}\n\nPYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {\n"
    '  m.def("timeline", &timeline);',
)


def patched_extension():
    return build.load_patched("sel_decode_timeline", {"sel_decode.cu": PATCHES, "sel_decode_bind.cpp": [BIND]})


def pct(x: torch.Tensor, q: float) -> float:
    return float(torch.quantile(x.double(), q))


def probe(ext, N, h, D, n, launch: DecodeLaunch = DecodeLaunch(), sets_count=4):
    sets = [nsa_inputs(N, h, D, n, torch.bfloat16, seed=s, device="cuda") for s in range(sets_count)]
    tune = launch.ext_tune()  # the patched extension takes the overrides as the plain one does
    calls = [lambda x=x: ext.fwd(x.q, x.k.flatten(0, 1), x.v.flatten(0, 1), x.ranges, None, x.scale, True, tune) for x in sets]
    per_call = time_graph(calls, torch.device("cuda")).median_ms * 1e3
    ext.timeline()  # reset
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(8):
            calls[i % len(calls)]()
    ext.timeline()  # capture ran nothing on the device; reset anyway
    g.replay()
    tl = ext.timeline()
    warps_per_call = tl.shape[0] // 8
    tl = tl[: 8 * warps_per_call].view(8, warps_per_call, 8)
    t = tl[:, :, 1:7].double() / 1e3  # us
    tw = tl[:, :, 7].double() / 1e3  # after griddepcontrol.wait
    starts, ends = t[:, :, 0].min(1).values, t[:, :, 5].max(1).values
    spans = ends - starts
    gaps = starts[1:] - ends[:-1]
    wake = tw.min(1).values[1:] - ends[:-1]  # previous call's last store to this call's first wait return
    body = t[2:7]  # steady-state calls
    bw = tw[2:7]
    ph = {
        "pre-wait": bw - body[..., 0],
        "ranges+q": body[..., 1] - bw,
        "first slab": body[..., 2] - body[..., 1],
        "stream": body[..., 3] - body[..., 2],
        "merge": body[..., 4] - body[..., 3],
        "store": body[..., 5] - body[..., 4],
    }
    entry_lag = body[..., 0] - body[..., 0].min(1, keepdim=True).values
    exit_lag = body[..., 5].max(1, keepdim=True).values - body[..., 5]
    sm = (tl[0, :, 0] >> 40).long()
    blocks_per_sm = torch.bincount(sm).float()
    out = (
        f"N={N} h={h} D={D} n={n} launch={launch.label()}: graph {per_call:.1f} us/call; span med "
        f"{spans[2:7].median():.1f} us, gap med {gaps[1:].median():.2f} us, last store to first wait return med "
        f"{wake[1:].median():.2f} us, wait returns spread med {(tw.max(1).values - tw.min(1).values)[2:7].median():.2f} us; warps/call {warps_per_call}, "
        f"warps per SM min/max {blocks_per_sm[blocks_per_sm > 0].min():.0f}/{blocks_per_sm.max():.0f}\n"
    )
    out += "  phase (us) median / p90 / max: " + "; ".join(
        f"{k} {pct(v, 0.5):.2f}/{pct(v, 0.9):.2f}/{float(v.max()):.2f}" for k, v in ph.items()
    )
    out += (
        f"\n  entry lag after first warp p50/p90/max {pct(entry_lag, 0.5):.2f}/{pct(entry_lag, 0.9):.2f}/"
        f"{float(entry_lag.max()):.2f}; finish before last warp p50/p90/max {pct(exit_lag, 0.5):.2f}/"
        f"{pct(exit_lag, 0.9):.2f}/{float(exit_lag.max()):.2f}"
    )
    return out


def main() -> int:
    ext = patched_extension()
    shapes = [(256, 4, 64, 8), (256, 8, 64, 8), (256, 4, 64, 16), (1024, 8, 64, 8)]
    for shape in shapes:  # the automatic launch, and the launch of before tail landing (occupancy not capped)
        for launch in (DecodeLaunch(), DecodeLaunch(prefetch=Prefetch.NONE, occupancy=6)):
            print(probe(ext, *shape, launch=launch), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
