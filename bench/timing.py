"""Timing: device events around batches of calls, median over rotating input sets, a 95% interval.

The interval is the distribution-free confidence interval of the median (order statistics
of a Binomial(n, 1/2)), so no normality is assumed. The machine's copy bandwidth and
matmul rate are measured with the same timer, so results can be read as a fraction of
what this device delivered in this run rather than of a datasheet number.
"""

from __future__ import annotations

import cProfile
import io
import math
import pstats
import time
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Timing:
    median_ms: float
    lo_ms: float
    hi_ms: float
    n: int
    host_ms: float | None = None  # median host time to issue one call (CUDA): >= median_ms means host-bound


def median_interval(samples: list[float], z: float = 1.96) -> Timing:
    """Median and its 95% order-statistic interval (ranks n/2 -+ z*sqrt(n)/2)."""
    xs = sorted(samples)
    n = len(xs)
    if n == 0:
        raise ValueError("samples: expected at least one timing, got none")
    mid = (xs[(n - 1) // 2] + xs[n // 2]) / 2
    half = z * math.sqrt(n) / 2
    lo = max(int(math.floor(n / 2 - half)), 0)
    hi = min(int(math.ceil(n / 2 + half)), n - 1)
    return Timing(mid, xs[lo], xs[hi], n)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# Timed calls behind a median for its 95% interval to mean anything (with fewer, the interval is
# the samples' whole range): the regression and threshold rules trust intervals only from this
# many, so the sampler does not cut below it.
MIN_SAMPLES = 10


class BudgetSpent(Exception):
    """The run's time budget ends before this timing could take its samples."""


def _within(deadline: float) -> None:
    if time.monotonic() > deadline:
        raise BudgetSpent("reached during the warm-up calls")


def time_calls(
    calls,
    device: torch.device,
    *,
    warmup: int,
    iters: int,
    max_seconds: float = 2.0,
    batch_ms: float = 1.0,
    deadline: float = math.inf,
) -> Timing:
    """Median time per call of `calls[i % len(calls)]()`: `iters` samples after `warmup` untimed calls.

    Rotating over several input sets keeps one set from sitting in L2 between calls. On
    CUDA one sample is one pair of events around a batch of back-to-back calls (sized to
    last about `batch_ms`) divided by its length: the time per call a loop of calls (a
    decode loop) sees, the host's issue time included where it exceeds the device's,
    without one call's launch latency added to every short sample. `host_ms` is the
    median host time to issue one call: where it reaches the timed median the GPU waited
    on Python, and the sample measures the host rather than the kernel. The number of samples
    is cut when they would take over `max_seconds`, to no fewer than MIN_SAMPLES (or `iters`
    if that is fewer): one slow warm-up call (a host stall) once cut a 2 ms row to 9 samples,
    too few for the regression rule's noise test. Past `deadline` (time.monotonic()) no call
    starts, and samples that would end past it are not begun: BudgetSpent (a 3 s call under the
    interpreter once took a 5 s budget to 63 s)."""
    if not calls:
        raise ValueError("calls: expected at least one callable")
    batch = 1
    if warmup:
        calls[0]()  # a first call may compile; it does not count towards the estimate
        synchronize(device)
        started = time.perf_counter()
        for i in range(1, warmup):
            _within(deadline)
            calls[i % len(calls)]()
        synchronize(device)
        per_call = (time.perf_counter() - started) / (warmup - 1) if warmup > 1 else 0.0
        if per_call > 0:
            if device.type == "cuda":
                batch = max(1, min(64, round(batch_ms / 1e3 / per_call)))
            room = min(max_seconds, deadline - time.monotonic())
            iters = max(min(iters, int(room / (per_call * batch))), min(iters, MIN_SAMPLES))
            if iters * batch * per_call > deadline - time.monotonic():
                raise BudgetSpent(f"{iters} timed calls of {per_call * 1e3:.3g} ms would end past it")
    samples = []
    if device.type == "cuda":
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
        issue, i = [], 0
        for a, b in events:
            a.record()
            t0 = time.perf_counter()
            for _ in range(batch):
                calls[i % len(calls)]()
                i += 1
            issue.append((time.perf_counter() - t0) * 1e3 / batch)
            b.record()
        torch.cuda.synchronize(device)
        samples = [a.elapsed_time(b) / batch for a, b in events]
        t = median_interval(samples)
        return Timing(t.median_ms, t.lo_ms, t.hi_ms, t.n, host_ms=median_interval(issue).median_ms)
    else:
        for i in range(iters):
            if time.monotonic() > deadline:  # no warm-up gave an estimate: stop once it has its samples
                if len(samples) < min(iters, MIN_SAMPLES):
                    raise BudgetSpent(f"reached after {len(samples)} timed calls")
                break
            t0 = time.perf_counter()
            calls[i % len(calls)]()
            samples.append((time.perf_counter() - t0) * 1e3)
    return median_interval(samples)


def time_graph(calls, device: torch.device, *, min_calls: int = 32, replays: int = 15, warm_ms: float = 50.0) -> Timing:
    """Device time per call from CUDA-graph replays of back-to-back calls over the rotating
    `calls`: no host issue time between calls (what a decode step captured in a graph
    costs) and cold L2 by rotation. The calls must be capturable (no host synchronisation).
    The median and interval are over `replays` replays of one graph, issued back to back.

    Before timing, the graph replays until `warm_ms` of device time have passed, and the
    timed replays follow each other with no host wait between them (so the host's launch
    of one replay does not land inside another's sample). Before both changes, on the H100
    the first launch timed in a CUDA decode sweep, after host-side work, read 5% slower
    than the same launch timed later in its row (1.73 against 1.64 of the floor; 1.59
    against 1.56 after); the GPU's clock ramp is the suspected cause."""
    n = len(calls) * math.ceil(min_calls / len(calls))
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):  # warm-up off the capture (compiles, allocator pools)
        for call in calls:
            call()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="relaxed"):
        for i in range(n):
            calls[i % len(calls)]()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    warmed = 0.0
    while warmed < warm_ms:
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        warmed += a.elapsed_time(b)
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(replays)]
    for a, b in events:
        a.record()
        graph.replay()
        b.record()
    torch.cuda.synchronize(device)
    samples = [a.elapsed_time(b) / n for a, b in events]
    del graph
    return median_interval(samples)


@dataclass(frozen=True)
class Limits:
    """What this device delivered in this run: copy bandwidth (read + write) and matmul rate."""

    copy_gbps: float
    matmul_tflops: float


def measure_limits(device: torch.device, dtype: torch.dtype, *, iters: int = 20) -> Limits:
    """Device-to-device copy of a buffer much larger than L2, and a square matmul in `dtype`."""
    big = device.type == "cuda"
    nbytes = (1 << 30) if big else (32 << 20)
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    copy = time_calls([lambda: dst.copy_(src)], device, warmup=3, iters=iters)
    n = 8192 if big else 256
    mm_dtype = dtype if big else torch.float32
    a = torch.randn(n, n, device=device, dtype=mm_dtype)
    b = torch.randn(n, n, device=device, dtype=mm_dtype)
    mm = time_calls([lambda: a @ b], device, warmup=3, iters=iters)
    return Limits(copy_gbps=2 * nbytes / copy.median_ms / 1e6, matmul_tflops=2 * n**3 / mm.median_ms / 1e9)


def rotation_count(set_bytes: int, device: torch.device, *, max_sets: int = 8) -> int:
    """Input sets needed so that their total is at least 4x the L2 cache (at least 2)."""
    l2 = 50 << 20
    if device.type == "cuda":
        l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", l2) or l2
    return int(min(max(math.ceil(4 * l2 / max(set_bytes, 1)), 2), max_sets))


def profile_text(fn, calls: int = 200, top: int = 18) -> str:
    """cProfile of `calls` back-to-back calls of `fn`, the `top` functions by own time: where
    a call's host time goes (the probes of docs/design/dispatcher.md)."""
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(calls):
        fn()
    pr.disable()
    torch.cuda.synchronize()
    buf = io.StringIO()
    pstats.Stats(pr, stream=buf).sort_stats("tottime").print_stats(top)
    return buf.getvalue()
