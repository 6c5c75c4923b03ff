"""Hardware counters of one decode call: the CUDA kernel, the Triton kernel and a plain
elementwise copy of the same bytes, side by side, for Nsight Compute.

Why: in graph time the Triton decode kernel streams about 5% faster than the CUDA one at
every decode benchmark grid point, with the same bytes to move; the counters say whether the CUDA
kernel reads more DRAM bytes, keeps fewer requests in flight, or stalls elsewhere.
Inputs are built and every method is called once (compile, build) before the profiler
window opens, so only the calls inside it are profiled, in the order printed.
Usage on a GPU machine:
    ncu --profile-from-start off --clock-control none --section SpeedOfLight \\
        --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats \\
        python3 probes/decode_ncu.py
"""

from __future__ import annotations

import torch

from selgate.kernels.cuda import selection_attention_cuda
from selgate.bench.cuda_decode import L_SEL, nsa_inputs, triton_method

POINTS = [(256, 4, 64, 16), (256, 4, 128, 8), (1024, 4, 128, 16)]  # N, h, D, n


def main() -> None:
    dev = torch.device("cuda")
    tri = triton_method()
    calls = []
    for N, h, D, n in POINTS:
        x = nsa_inputs(N, h, D, n, torch.bfloat16, seed=1, device=dev)
        moved = N * n * L_SEL * 2 * D * 2
        src = torch.randint(0, 255, (moved,), dtype=torch.uint8, device=dev)
        dst = torch.empty_like(src)
        methods = {
            "cuda": lambda x=x: selection_attention_cuda(x.q, x.k, x.v, x.ranges, scale=x.scale, normalized=True),
            "triton": None if tri is None else (lambda x=x: tri(x)),  # None: this checkout has no Triton path
            "copy": lambda src=src, dst=dst: torch.mul(src, 1, out=dst),
        }
        methods = {name: fn for name, fn in methods.items() if fn is not None}
        for name, fn in methods.items():
            fn()
            calls.append((f"N={N} h={h} D={D} n={n} {name}", fn))
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for i, (label, fn) in enumerate(calls):
        fn()
        torch.cuda.synchronize()
        print(f"profiled call {i}: {label}", flush=True)
    torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()
