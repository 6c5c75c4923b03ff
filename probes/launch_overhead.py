"""Where the decode paths' time goes: host time per call of each layer (Triton: raw kernel
launch, strict wrapper, dispatcher; CUDA: the extension's own entry, the Python wrapper on
normalised ranges) against the kernels' own device time, whether a whole dispatcher call can
be captured in a CUDA graph (no host synchronisation), and profiles of the dispatcher's and
the CUDA wrapper's host time. A probe for a measured gap, not a benchmark.
Run on a GPU: python3 probes/launch_overhead.py"""

from __future__ import annotations

import time

import torch

from selgate.bench.inputs import decode_problem, make_inputs
from selgate.bench.timing import measure_limits, profile_text, time_graph
from selgate.kernels import selection_attention
from selgate.kernels.cuda import build, selection_attention_cuda
from selgate.kernels.cuda.decode import launch_tune, rows_view
from selgate.kernels.triton import selection_attention_triton, triton_forward
from selgate.reference import resolve_scale


def host_us(fn, n=300):
    """Host time per call with the GPU kept busy (no sync inside the loop)."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    host = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    return host


def loop_us(fns, n=300):
    """Wall time per call of a loop over rotating inputs, synchronised at the end: what a decode loop sees."""
    for f in fns:
        f()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for i in range(n):
        fns[i % len(fns)]()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6


def graph_us(fns):
    """Device time per call from CUDA-graph replay over rotating inputs; raises if a call
    cannot be captured (it synchronises with the host)."""
    return time_graph(fns, torch.device("cuda")).median_ms * 1e3


def main():
    copy = measure_limits(torch.device("cuda"), torch.bfloat16).copy_gbps
    ext = build.load_extension(torch.device("cuda"))
    rows, profiles = [], []
    for L in (256, 512, 1024):
        p = decode_problem(1024, 8, 128, 128, L, "many", "bfloat16")
        xs = [make_inputs(p, seed=i, device=torch.device("cuda")) for i in range(4)]  # 4 x >= 67 MB K/V: > L2
        sc = resolve_scale(None, 128)
        raw = [lambda x=x: triton_forward(x.q, x.k, x.v, x.ranges, scale=sc) for x in xs]
        wrap = [lambda x=x: selection_attention_triton(x.q, x.k, x.v, x.ranges, normalized=True) for x in xs]
        auto = [lambda x=x: selection_attention(x.q, x.k, x.v, x.ranges) for x in xs]
        tune = launch_tune(None)
        flat = [(x.q.contiguous(), rows_view(x.k), rows_view(x.v), x.ranges.contiguous()) for x in xs]
        cuda_raw = [lambda a=a: ext.fwd(*a, None, sc, True, tune) for a in flat]
        cuda_wrap = [lambda x=x: selection_attention_cuda(x.q, x.k, x.v, x.ranges, normalized=True) for x in xs]
        floor = 1024 * L * 256 * 2 / (copy * 1e3)  # selected K+V bytes over the copy bandwidth, in us
        try:
            auto_graph = f"{graph_us(auto):.1f}"
        except Exception as e:  # noqa: BLE001 - the probe reports why a capture failed
            auto_graph = f"capture failed: {type(e).__name__}: {str(e)[:80]}"
        rows.append(
            f"| {L} | {host_us(raw[0]):.1f} | {host_us(wrap[0]):.1f} | {host_us(auto[0]):.1f} | "
            f"{loop_us(auto):.1f} | {graph_us(raw):.1f} | {auto_graph} | {host_us(cuda_raw[0]):.1f} | "
            f"{host_us(cuda_wrap[0]):.1f} | {graph_us(cuda_raw):.1f} | {floor:.1f} |"
        )
        if L == 512:
            profiles = [profile_text(auto[0]), profile_text(cuda_wrap[0])]
    print("\n".join(profiles))
    print(f"copy bandwidth {copy:.0f} GB/s (read + write); decode bf16 N=1024 h=8 D=Dv=128 'many' ranges")
    print(
        "| L | triton raw launch host us | triton strict wrapper host us | dispatcher host us | dispatcher loop us "
        "(4 rotating sets) | triton raw kernel graph us | dispatcher graph us | cuda ext.fwd host us | "
        "cuda wrapper host us | cuda kernel graph us | HBM floor us |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
