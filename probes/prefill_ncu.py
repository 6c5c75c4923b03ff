"""Hardware counters of one Triton prefill forward call at the 64k prefill shape, for Nsight Compute.

Why: the prefill forward (T=65536, bf16, 16 blocks of 64) reads 137 GB of selected K/V
tiles from L2 and sat about 1 % above the 15 ms acceptance bar. Ablations that left loads out
(docs/design/triton-forward.md) put the MMAs and softmax at 4.5 ms and an
all-L2-hit working set at 14.3 ms; these counters say how much of the real call's traffic
misses L2, how much crosses between the two L2 partitions, and what the warps wait on.
The call is made once (compile, tuning) before the profiler window opens. The optional
argument stores K and V in another layout (`bench.inputs.KV_LAYOUTS`), same values.
Usage on a GPU machine:
    ncu --profile-from-start off --clock-control none --section SpeedOfLight \\
        --section MemoryWorkloadAnalysis --section WarpStateStats \\
        python3 probes/prefill_ncu.py [separate|group|key]
"""

from __future__ import annotations

import sys

import torch

from selgate.bench.inputs import make_inputs, prefill_problem, with_kv_layout
from selgate.kernels.triton.fwd import triton_forward


def main() -> None:
    x = make_inputs(prefill_problem(65536, 64, 4, 128, 128, 64, 16, "bfloat16"), seed=0, device=torch.device("cuda"))
    x = with_kv_layout(x, sys.argv[1] if len(sys.argv) > 1 else "separate")
    call = lambda: triton_forward(x.q, x.k, x.v, x.ranges, scale=x.scale)  # noqa: E731
    call()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    call()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    print(f"profiled one prefill forward call, v - k = {(x.v.data_ptr() - x.k.data_ptr()) / 2**20:.3f} MiB", flush=True)


if __name__ == "__main__":
    main()
