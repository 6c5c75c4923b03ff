"""Where the Triton decode path's time goes at small L: host time per call of each layer
(raw kernel launch, strict wrapper, dispatcher) against the kernel's own device time.
A probe for a measured gap (decode stays at ~0.21 ms from L=256 to 1024), not a benchmark."""
from __future__ import annotations

import time

import torch

from selgate.bench.inputs import decode_problem, make_inputs
from selgate.kernels import selection_attention
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


def device_us(fn, n=100):
    """Kernel time per call from a CUDA graph replay (no launch overhead)."""
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        fn()
        with torch.cuda.graph(g, stream=s):
            for _ in range(10):
                fn()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(n // 10):
        g.replay()
    e1.record()
    torch.cuda.synchronize()
    return e0.elapsed_time(e1) / n * 1e3


def main():
    print("| L | raw launch host us | strict wrapper host us | dispatcher host us | kernel device us (graph) |")
    print("| --- | --- | --- | --- | --- |")
    for L in (256, 512, 1024):
        p = decode_problem(1024, 8, 128, 128, L, "many", "bfloat16")
        x = make_inputs(p, seed=0, device=torch.device("cuda"))
        sc = resolve_scale(None, 128)
        raw = lambda: triton_forward(x.q, x.k, x.v, x.ranges, scale=sc)  # noqa: E731
        wrap = lambda: selection_attention_triton(x.q, x.k, x.v, x.ranges, normalized=True)  # noqa: E731
        disp = lambda: selection_attention(x.q, x.k, x.v, x.ranges, backend="triton", strict=True)  # noqa: E731
        print(f"| {L} | {host_us(raw):.1f} | {host_us(wrap):.1f} | {host_us(disp):.1f} | {device_us(raw):.1f} |",
              flush=True)


if __name__ == "__main__":
    main()
