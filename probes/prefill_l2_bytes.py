"""L2 and DRAM bytes of one 64k prefill forward call (bf16, T=65536, 4 KV heads, D=128, 16 blocks
of 64) at h query heads per KV head, summed over the call's kernels: what a forward whose cost
does not follow h moves through L2 (each row reloads its keys) against a KV-outer one. One warm
call first, then one call between cudaProfilerStart/Stop, so only that call is profiled. The
route comes from the profile or from SELGATE_TRITON_KV_OUTER. Run on a GPU, under Nsight Compute:

    ncu --clock-control none --profile-from-start off --csv --print-units base \\
        --metrics lts__t_bytes.sum,dram__bytes_read.sum,dram__bytes_write.sum \\
        python3 probes/prefill_l2_bytes.py 4 > ncu.csv
    python3 probes/prefill_l2_bytes.py --sum ncu.csv
"""

import csv
import sys
from collections import defaultdict


def call(h: int) -> None:
    import torch

    from selgate.bench.inputs import make_inputs, prefill_problem
    from selgate.kernels import selection_attention, stats

    x = make_inputs(prefill_problem(65536, 4 * h, 4, 128, 128, 64, 16, "bfloat16"), seed=0, device="cuda")
    selection_attention(x.q, x.k, x.v, x.ranges, scale=x.scale)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    selection_attention(x.q, x.k, x.v, x.ranges, scale=x.scale)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    print("launches:", sorted(k for k in stats()["launches"] if k.startswith("triton_fwd")), file=sys.stderr)


def total(path: str) -> dict[str, float]:
    """Each metric summed over the profiled kernels of ncu's CSV (base units: bytes)."""
    sums: dict[str, float] = defaultdict(float)
    kernels = set()
    with open(path) as f:
        lines = [line for line in f if line.startswith('"')]  # ncu's own lines start with ==PROF==
    for row in csv.DictReader(lines):
        kernels.add(row["ID"])
        sums[row["Metric Name"]] += float(row["Metric Value"].replace(",", ""))
    return {"kernels": len(kernels), **sums}


if __name__ == "__main__":
    if sys.argv[1] == "--sum":
        t = total(sys.argv[2])
        print(" ".join(f"{k}={v / 1e9:.2f}GB" if k != "kernels" else f"kernels={v}" for k, v in t.items()))
    else:
        call(int(sys.argv[1]))
