"""Why some packed-SDPA decode rows of the full sweep cost 50-130 ms of host time per call
while the same rows cost 2-4 ms in another run: per-call wall time over rotating input sets
with each SDPA backend allowed in turn, and the top host-time ops of the slowest calls.
A probe for a measured gap, not a benchmark.
Run on a GPU: python3 probes/sdpa_host.py"""

from __future__ import annotations

import time

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from selgate.bench.inputs import decode_problem, make_inputs
from selgate.kernels.sdpa import selection_attention_sdpa

CONFIGS = [  # (N, h, D, Dv, L, dist): rows that read 45-130 ms in one sweep and 2-4 ms in another
    (256, 8, 64, 128, 64, "mixed"),
    (256, 8, 64, 64, 32, "mixed"),
    (256, 4, 128, 64, 32, "mixed"),
    (64, 8, 64, 64, 1024, "few"),
]
BACKENDS = {
    "default": None,
    "no cudnn": [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH],
    "cudnn only": [SDPBackend.CUDNN_ATTENTION],
    "efficient only": [SDPBackend.EFFICIENT_ATTENTION],
}


def per_call_ms(sets, backends, calls=12):
    out = []
    for i in range(calls):
        x = sets[i % len(sets)]
        torch.cuda.synchronize()
        t = time.perf_counter()
        if backends is None:
            selection_attention_sdpa(x.q, x.k, x.v, x.ranges, scale=x.scale, normalized=True)
        else:
            with sdpa_kernel(backends):
                selection_attention_sdpa(x.q, x.k, x.v, x.ranges, scale=x.scale, normalized=True)
        torch.cuda.synchronize()
        out.append((time.perf_counter() - t) * 1e3)
    return out


def main():
    dev = torch.device("cuda")
    print("| N | h | D | Dv | L | dist | backends | first call ms | later calls ms (min / median / max) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    worst = None
    for N, h, D, Dv, L, dist in CONFIGS:
        p = decode_problem(N, h, D, Dv, L, dist, "bfloat16")
        for name, bk in BACKENDS.items():
            sets = [make_inputs(p, seed=100 * s + len(name), device=dev) for s in range(6)]
            try:
                ms = per_call_ms(sets, bk)
            except RuntimeError as e:
                print(f"| {N} | {h} | {D} | {Dv} | {L} | {dist} | {name} | error: {str(e).splitlines()[0][:80]} | |")
                continue
            later = sorted(ms[1:])
            print(
                f"| {N} | {h} | {D} | {Dv} | {L} | {dist} | {name} | {ms[0]:.1f} | "
                f"{later[0]:.2f} / {later[len(later) // 2]:.2f} / {later[-1]:.2f} |"
            )
            if name == "default" and (worst is None or later[len(later) // 2] > worst[0]):
                worst = (later[len(later) // 2], p, sets)
    _, p, sets = worst
    print(f"\nProfile of 6 default calls at {p.key} (top host time):")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        per_call_ms(sets, None, calls=6)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))


if __name__ == "__main__":
    main()
