"""Host cost per call of selgate's Triton launches, plain (Triton's JITFunction.run) vs the
cached launcher (selgate.kernels.triton.launch), on one decode shape.

Run from the repo root on a GPU host: python3 probes/triton_launch.py (the set-up's .venv/bin/python)
Host time = time.perf_counter() around each call, no synchronize inside the loop (one after).
Every part is independent: a failure prints its traceback and the probe goes on."""

from __future__ import annotations

import importlib
import random
import statistics
import time
import traceback

import torch

B, G, h, D, S_kv, n, BLK = 1, 8, 16, 128, 8192, 8, 64
CALLS, WARM = 200, 20
DTYPE = torch.bfloat16
ROWS: list[tuple] = []  # (name, median us, mean us, p10 us, p90 us, note)


def host_times(fn, calls=CALLS, warm=WARM):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    ts.sort()
    return statistics.median(ts), statistics.fmean(ts), ts[len(ts) // 10], ts[(9 * len(ts)) // 10]


def part(name, note=""):
    """Decorator: time `fn` as row `name`; on failure print and go on."""

    def wrap(make):
        try:
            fn = make()
            ROWS.append((name, *host_times(fn), note))
        except Exception:
            print(f"--- {name}: FAILED")
            traceback.print_exc()
            ROWS.append((name, float("nan"), float("nan"), float("nan"), float("nan"), "FAILED"))
        return make

    return wrap


def guarded(title):
    def wrap(fn):
        try:
            fn()
        except Exception:
            print(f"--- {title}: FAILED")
            traceback.print_exc()
        return fn

    return wrap


print(f"torch {torch.__version__}, device {torch.cuda.get_device_name()}")
import triton  # noqa: E402

print(f"triton {triton.__version__}")
from selgate.bench.timing import profile_text  # noqa: E402
from selgate.kernels.triton import fwd, launch as L  # noqa: E402
from selgate.kernels.triton.normalize import normalize_ranges_triton  # noqa: E402
from selgate.reference import normalize_ranges  # noqa: E402

dev = torch.device("cuda")
g = torch.Generator().manual_seed(0)
q = torch.randn(B, 1, G, h, D, generator=g).to(dev, DTYPE)
k = torch.randn(B, G, S_kv, D, generator=g).to(dev, DTYPE)
v = torch.randn(B, G, S_kv, D, generator=g).to(dev, DTYPE)
rng = random.Random(0)
starts = [[sorted(rng.sample(range(0, S_kv, BLK), n)) for _ in range(G)] for _ in range(B)]
ranges = torch.tensor([[[[[s, s + BLK] for s in row] for row in b]] for b in starts], device=dev)  # [B,1,G,n,2]
norm = normalize_ranges(ranges, S_kv)
scale = D**-0.5
print(f"q {tuple(q.shape)} k/v {tuple(k.shape)} ranges {tuple(ranges.shape)} {ranges.dtype}, {DTYPE}")


def fwd_call():
    return fwd.triton_forward(q, k, v, norm, scale=scale)


def with_launcher(on: bool, fn):
    def call():
        L.ENABLED = on
        try:
            return fn()
        finally:
            L.ENABLED = True

    return call


# What triton_forward hands the launcher: captured once, for the raw rows below.
captured = {}


@guarded("capture the forward launch")
def _capture():
    real = fwd.launch

    def spy(kernel, grid, *args, **kwargs):
        captured.update(kernel=kernel, grid=grid, args=args, kwargs=kwargs)
        return real(kernel, grid, *args, **kwargs)

    fwd.launch = spy
    try:
        fwd_call()
    finally:
        fwd.launch = real
    print(f"forward launch: grid {captured['grid']}, {len(captured['args'])} positional args, kwargs {captured['kwargs']}")


@guarded("bitwise (a) vs (b)")
def _bitwise():
    plain = with_launcher(False, fwd_call)()
    fast1 = with_launcher(True, fwd_call)()  # may fill the cache
    fast2 = with_launcher(True, fwd_call)()  # a hit
    same = all(torch.equal(a, b) for a, b in zip(plain, fast1)) and all(torch.equal(a, b) for a, b in zip(plain, fast2))
    print(f"bitwise equal (a) plain vs (b) launcher, o and lse: {same}")
    nplain = with_launcher(False, lambda: normalize_ranges_triton(ranges, S_kv))()
    nfast = with_launcher(True, lambda: normalize_ranges_triton(ranges, S_kv))()
    print(
        f"bitwise equal normalize plain vs launcher: {torch.equal(nplain, nfast)}; equals reference: {torch.equal(nplain, norm)}"
    )


@part("raw kernel[grid](...) (Triton JITFunction.run)")
def _raw_plain():
    kern, grid, args, kw = captured["kernel"], captured["grid"], captured["args"], captured["kwargs"]
    return lambda: kern[grid](*args, **kw)


@part("raw launch(kernel, grid, ...) hit")
def _raw_fast():
    kern, grid, args, kw = captured["kernel"], captured["grid"], captured["args"], captured["kwargs"]
    L.launch(kern, grid, *args, **kw)
    return lambda: L.launch(kern, grid, *args, **kw)


@part("  of which: key (_Kernel.key) only", "no launch")
def _key_only():
    kern, args, kw = captured["kernel"], captured["args"], captured["kwargs"]
    kk = L._kernels[id(kern)]
    return lambda: kk.key(args, kw)


@part("  floor: ck.run(...) only", "compiled launcher, no key")
def _floor():
    kern, grid, args, kw = captured["kernel"], captured["grid"], captured["args"], captured["kwargs"]
    from triton.runtime import driver

    device = torch.cuda.current_device()
    kk = L._kernels[id(kern)]
    _, run, function, meta, tail = kk.cache[(device, kk.key(args, kw))]
    stream = driver.active.get_current_stream(device)
    return lambda: run(grid[0], 1, 1, stream, function, meta, None, None, None, *args, *tail)


part("(a) triton_forward, launcher off")(lambda: with_launcher(False, fwd_call))
part("(b) triton_forward, launcher on")(lambda: with_launcher(True, fwd_call))
part("(c) normalize_ranges_triton, launcher off")(lambda: with_launcher(False, lambda: normalize_ranges_triton(ranges, S_kv)))
part("(c) normalize_ranges_triton, launcher on")(lambda: with_launcher(True, lambda: normalize_ranges_triton(ranges, S_kv)))


def dispatcher(normalized: bool, on: bool, backend: str):
    from selgate.kernels import selection_attention

    r = norm if normalized else ranges
    return with_launcher(on, lambda: selection_attention(q, k, v, r, normalized=normalized, backend=backend))


for backend, normalized in (("auto", False), ("auto", True), ("triton", True)):
    for on in (False, True):
        label = f"(d) selection_attention {backend}{' normalized=True' if normalized else ''}, launcher {'on' if on else 'off'}"
        part(label)(lambda normalized=normalized, on=on, backend=backend: dispatcher(normalized, on, backend))


@guarded("which backend served (d)")
def _backends():
    st = importlib.import_module("selgate.kernels.stats")
    st.reset_stats()
    from selgate.kernels import selection_attention

    for kw in ({}, {"normalized": True}, {"normalized": True, "backend": "triton"}):
        st.reset_stats()
        selection_attention(q, k, v, norm if kw else ranges, **kw)
        s = st.stats()
        print(f"(d) {kw or 'auto'} served by: calls {s.get('calls')}, launches {s.get('launches')}")


@part("(e) torch SDPA (enable_gqa)", "q [B,G*h,1,D], k/v [B,G,S_kv,D]")
def _sdpa():
    qs = q.reshape(B, 1, G * h, D).transpose(1, 2)
    F = torch.nn.functional
    return lambda: F.scaled_dot_product_attention(qs, k, v, enable_gqa=True)


def profile(title, fn, calls=CALLS):
    fn()
    torch.cuda.synchronize()
    text = profile_text(fn, calls, top=15)
    print(f"\n=== cProfile: {title}, {calls} calls, top 15 by tottime ===")
    print("\n".join(line for line in text.splitlines() if line.strip())[:6000])


print(f"\n{'part':62s} {'median':>8s} {'mean':>8s} {'p10':>8s} {'p90':>8s}  (us of host time per call, {CALLS} calls)")
for name, med, mean, p10, p90, note in ROWS:
    print(f"{name:62s} {med:8.1f} {mean:8.1f} {p10:8.1f} {p90:8.1f}  {note}")

guarded("cProfile launcher hits")(lambda: profile("triton_forward, launcher hits", with_launcher(True, fwd_call)))
guarded("cProfile plain")(lambda: profile("triton_forward, launcher off (Triton's path)", with_launcher(False, fwd_call)))


@guarded("launcher cache")
def _cache():
    print({kk.fn.__name__ if hasattr(kk.fn, "__name__") else repr(kk.fn): len(kk.cache) for kk in L._kernels.values()})
