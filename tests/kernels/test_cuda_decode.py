"""The CUDA decode backend: why it declines a call (reason codes), input errors, the wrapper's
plumbing into the extension, the build cache, and (GPU only) the conformance families on the
kernel variants and launch overrides the registered `cuda` implementation does not reach.

CPU machines cannot run the kernel; there the extension is replaced by a stand-in that
records what the wrapper passes it, so the wrapper's normalisation, scale and kernel choice
are still checked, and build/launch failures are injected to check their reason codes."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from selgate.conformance.cases import Case, Shape
from selgate.conformance.families import FAMILIES
from selgate.conformance.registry import REGISTRY
from selgate.kernels.cuda import DecodeLaunch, Pdl, Prefetch, Schedule, build, decode, selection_attention_cuda
from selgate.kernels.cuda.launch import EXT_ORDER
from selgate.errors import BackendUnavailable
from selgate.reference import normalize_ranges, selection_attention_ref
from tests.helpers import assert_matches_reference, poison_unselected, random_inputs

ON_GPU = torch.cuda.is_available()


def decode_inputs(dtype=torch.float16, h=3, Dk=16, Dv=8, S_kv=23, n=4, B=2, G=2, seed=0):
    return random_inputs(B=B, S=1, G=G, h=h, Dk=Dk, Dv=Dv, S_kv=S_kv, n=n, dtype=dtype, seed=seed)


def reason_of(*args, **kwargs) -> BackendUnavailable:
    with pytest.raises(BackendUnavailable) as info:
        selection_attention_cuda(*args, **kwargs)
    return info.value


def test_prefill_is_declined_as_not_decode():
    q, k, v, r = random_inputs(S=3, dtype=torch.float16)
    e = reason_of(q, k, v, r)
    assert e.reason == "not_decode" and "S=3" in e.detail


def test_fp64_is_declined_as_dtype():
    e = reason_of(*decode_inputs(dtype=torch.float64))
    assert e.reason == "dtype" and "float64" in e.detail


@pytest.mark.parametrize("Dk, Dv, name", [(12, 8, "Dk=12"), (264, 8, "Dk=264"), (8, 20, "Dv=20"), (16, 272, "Dv=272")])
def test_unsupported_head_dims_are_declined(Dk, Dv, name):
    e = reason_of(*decode_inputs(Dk=Dk, Dv=Dv))
    assert e.reason == "head_dim" and name in e.detail


def test_too_many_ranges_are_declined():
    e = reason_of(*decode_inputs(n=decode.MAX_RANGES + 1))
    assert e.reason == "ranges" and str(decode.MAX_RANGES + 1) in e.detail


def test_no_cuda_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert reason_of(*decode_inputs()).reason == "no_cuda"


def test_cpu_tensors_with_a_cuda_device_present(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    e = reason_of(*decode_inputs())
    assert e.reason == "device" and "cpu" in e.detail


def test_bad_input_is_an_input_error_not_a_fallback():
    q, k, v, r = decode_inputs()
    with pytest.raises(ValueError, match=r"^k: expected \[B=2, G=2"):
        selection_attention_cuda(q, k[:1], v, r)
    with pytest.raises(TypeError, match="^ranges: expected int32 or int64"):
        selection_attention_cuda(q, k, v, r.float())
    with pytest.raises(ValueError, match="^kernel: expected one of"):
        selection_attention_cuda(q, k, v, r, kernel="wgmma")


class FakeExtension:
    """Stands in for the compiled module on CPU: records its arguments, returns the
    reference result computed from exactly those arguments (or raises `error`)."""

    def __init__(self, error=None):
        self.error, self.calls = error, []

    def fwd(self, q, k, v, ranges, positions, scale, use_mma, tune=(), clip=False, counter=None, kv_bytes=0):
        self.calls.append(
            dict(q=q, k=k, v=v, ranges=ranges, positions=positions, scale=scale, use_mma=use_mma, tune=list(tune), clip=clip)
        )
        if self.error:
            raise self.error
        from selgate.reference.golden import gather_attention

        B, G = q.shape[0], q.shape[2]  # k, v arrive as [B*G, S_kv, D]
        ranges = normalize_ranges(ranges, k.shape[1], positions) if clip else ranges  # what the kernel's clipping selects
        o, lse = gather_attention(q, k.view(B, G, *k.shape[1:]), v.view(B, G, *v.shape[1:]), ranges, scale=scale)
        return [o.to(v.dtype), lse.float()]  # as the binding returns them (std::vector)


@pytest.fixture
def runnable(monkeypatch):
    """The wrapper believes the device can run the kernel; returns a setter for the extension."""
    monkeypatch.setattr(decode, "unsupported_reason", lambda q, d: None)

    def use(ext=None, build_error=None):
        def load(device=None):
            if build_error:
                raise build.BuildError(build_error)
            return ext

        monkeypatch.setattr(build, "load_extension", load)
        return ext

    return use


def test_build_failure_is_reason_build(runnable):
    runnable(build_error="nvcc: sel_decode.cu(12): error: identifier undefined")
    e = reason_of(*decode_inputs())
    assert e.reason == "build" and "identifier undefined" in e.detail


def test_launch_failure_is_reason_launch(runnable):
    runnable(FakeExtension(RuntimeError("CUDA error: too many resources requested for launch")))
    e = reason_of(*decode_inputs())
    assert e.reason == "launch" and "too many resources" in e.detail


def test_fp32_on_tensor_cores_is_declined(runnable):
    runnable(FakeExtension())
    e = reason_of(*decode_inputs(dtype=torch.float32), kernel="mma")
    assert e.reason == "dtype"


@pytest.mark.parametrize(
    "dtype, kernel, use_mma",
    [
        (torch.float16, "auto", True),
        (torch.bfloat16, "auto", True),
        (torch.float32, "auto", False),
        (torch.float16, "simt", False),
    ],
)
def test_wrapper_lets_the_kernel_clip_few_ranges_and_picks_the_kernel(runnable, dtype, kernel, use_mma):
    ext = runnable(FakeExtension())
    q, k, v, r = decode_inputs(dtype=torch.float32, seed=3)
    q, k, v, r = q.to(dtype), k.to(dtype), v.to(dtype), r.int()
    positions = torch.tensor([[20], [7]], dtype=torch.int32)
    o, lse = selection_attention_cuda(q, k, v, r, positions=positions, return_lse=True, kernel=kernel)
    call = ext.calls[0]
    assert call["use_mma"] is use_mma
    assert call["scale"] == pytest.approx(16**-0.5)
    # int32 indices reach the kernel as they are (it reads both widths): no conversion launch
    assert call["positions"].dtype == torch.int32 and call["positions"].tolist() == [[20], [7]]
    assert call["ranges"].dtype == torch.int32
    assert call["clip"] is True and torch.equal(call["ranges"], r)  # as given: no normalising launch
    assert o.dtype == dtype and o.shape == (2, 1, 2, 3, 8) and lse.shape == (2, 1, 2, 3)


def test_a_kept_cuda_call_replays_the_clipping_launch_on_fresh_inputs(runnable):
    """What the dispatcher keeps for a CUDA decode signature (kernels/kept.py): the same
    extension call, clipping, on new tensors; `(o, lse)` as the ladder returns them."""
    from selgate.reference import check_inputs

    ext = runnable(FakeExtension())
    q, k, v, r = decode_inputs(dtype=torch.float16)
    replay = decode.cuda_replay(q, k, v, check_inputs(q, k, v, r), scale=None, positions=None, clip=True)
    q, k, v, r = decode_inputs(dtype=torch.float16, seed=4)
    out = replay(q, k, v, r, None)
    assert type(out) is tuple and ext.calls[-1]["clip"] is True and torch.equal(ext.calls[-1]["ranges"], r)
    assert (out[0].double() - selection_attention_ref(q, k, v, r)).abs().max() <= 2e-3


def test_wrapper_normalises_rows_of_more_ranges_than_the_kernel_clips(runnable):
    ext = runnable(FakeExtension())
    q, k, v, r = decode_inputs()
    many = r.repeat_interleave(decode.CLIP_MAX_RANGES // r.shape[3] + 1, dim=3)
    selection_attention_cuda(q, k, v, many)
    assert ext.calls[0]["clip"] is False and torch.equal(ext.calls[0]["ranges"], normalize_ranges(many, k.shape[2]))


def test_normalized_ranges_pass_through_unchanged(runnable):
    ext = runnable(FakeExtension())
    q, k, v, r = decode_inputs()
    norm = normalize_ranges(r, k.shape[2])
    o = selection_attention_cuda(q, k, v, norm, scale=0.5, normalized=True)
    assert torch.equal(ext.calls[0]["ranges"], norm) and ext.calls[0]["scale"] == 0.5
    assert isinstance(o, torch.Tensor)


def test_launch_overrides_reach_the_extension(runnable):
    """The extension takes [stages, split, warps, pdl, slab, schedule, prefetch, occupancy]
    (tune_of in sel_decode_bind.cpp); no launch is all automatic (zeros)."""
    ext = runnable(FakeExtension())
    q, k, v, r = decode_inputs()
    selection_attention_cuda(q, k, v, r)
    selection_attention_cuda(q, k, v, r, launch=DecodeLaunch(stages=3, split=2, warps=4, pdl=Pdl.TRIGGER_AFTER_LOOP))
    selection_attention_cuda(q, k, v, r, launch=DecodeLaunch(schedule=Schedule.SHARED_SLABS, prefetch=Prefetch.NONE, occupancy=5))
    assert [c["tune"] for c in ext.calls] == [[0] * 8, [3, 2, 4, 1, 0, 0, 0, 0], [0, 0, 0, 0, 0, 2, 1, 5]]


@pytest.mark.parametrize("launch", [(3, 2, 4, 1), [0, 0, 0, 2], (), {"stages": 3}, 3])
def test_launch_overrides_by_position_are_refused(runnable, launch):
    ext = runnable(FakeExtension())
    with pytest.raises(TypeError, match="^launch: .*DecodeLaunch"):
        selection_attention_cuda(*decode_inputs(), launch=launch)
    assert ext.calls == []


def test_misaligned_views_are_copied_before_the_kernel(runnable):
    ext = runnable(FakeExtension())
    q, k, v, r = decode_inputs()
    shifted = torch.empty(q.numel() + 1, dtype=q.dtype)[1:].view(q.shape).copy_(q)  # 2-byte offset
    assert shifted.data_ptr() % 16
    selection_attention_cuda(shifted, k, v, r)
    sent = ext.calls[0]["q"]
    assert sent.data_ptr() % 16 == 0 and torch.equal(sent, q)


def kv_views(k, v, layout, fill=float("nan")):
    """k, v with the same values stored as `layout`: "cache" (the first S_kv keys of a longer
    cache whose other keys are `fill`), "packed" (each key's K row then its V row in one buffer)."""
    B, G, S_kv, Dk = k.shape
    Dv = v.shape[3]
    if layout == "cache":
        kc = torch.full((B, G, S_kv + 40, Dk), fill, dtype=k.dtype, device=k.device)
        vc = torch.full((B, G, S_kv + 40, Dv), fill, dtype=v.dtype, device=v.device)
        return kc[:, :, :S_kv].copy_(k), vc[:, :, :S_kv].copy_(v)
    kv = torch.empty(B, G, S_kv, Dk + Dv, dtype=k.dtype, device=k.device)
    return kv[..., :Dk].copy_(k), kv[..., Dk:].copy_(v)


@pytest.mark.parametrize("layout", ["cache", "packed"])
def test_kv_rows_are_read_in_place(runnable, layout):
    """A narrowed KV cache or K and V rows sharing one buffer reach the kernel as they are (a
    copy would move the whole cache on every decode step); rows the 16-byte copies cannot
    address are copied."""
    ext = runnable(FakeExtension())
    q, k, v, r = decode_inputs(Dk=16, Dv=8)
    kk, vv = kv_views(k, v, layout)
    assert not kk.is_contiguous() and not vv.is_contiguous()
    o = selection_attention_cuda(q, kk, vv, r)
    sent = ext.calls[0]
    assert sent["k"].data_ptr() == kk.data_ptr() and sent["v"].data_ptr() == vv.data_ptr()
    assert sent["k"].stride() == kk.flatten(0, 1).stride() and torch.equal(o, selection_attention_cuda(q, k, v, r))
    odd = torch.empty(*k.shape[:3], 20, dtype=k.dtype)[..., :16].copy_(k)  # 40-byte rows
    transposed = k.transpose(-1, -2).contiguous().transpose(-1, -2)
    groups_first = k.transpose(0, 1).contiguous().transpose(0, 1)  # (B, G) do not flatten to one stride
    for bad in (odd, transposed, groups_first):
        selection_attention_cuda(q, bad, v, r)
        assert ext.calls[-1]["k"].is_contiguous() and torch.equal(ext.calls[-1]["k"], k.flatten(0, 1))


def test_key_strides_past_int32_are_copied_not_sent(runnable):
    """The kernel's key offsets are 32-bit: a K/V view whose key stride is 2^31 elements or more
    is copied rather than refused inside the extension (the 4 GiB storage is reserved, not touched)."""
    ext = runnable(FakeExtension())
    q, k, v, r = decode_inputs(B=1, G=1, S_kv=2, n=1, Dk=16, Dv=8)
    kk = torch.empty(2**31 + 16, dtype=k.dtype).as_strided(k.shape, (16, 16, 2**31, 1)).copy_(k)
    o = selection_attention_cuda(q, kk, v, r)
    sent = ext.calls[-1]["k"]
    assert sent.stride() == (32, 16, 1) and torch.equal(sent, k.flatten(0, 1))
    assert torch.equal(o, selection_attention_cuda(q, k, v, r))


def test_failed_build_is_remembered_not_retried(monkeypatch):
    attempts = []
    monkeypatch.setattr(build, "_loaded", {})
    monkeypatch.setattr(build, "device_arch", lambda device=None: "90")
    monkeypatch.setattr(build, "_build", lambda arch: attempts.append(arch) or build.BuildError("ld: cannot find -lcudart"))
    for _ in range(2):
        with pytest.raises(build.BuildError, match="cannot find"):
            build.load_extension()
    assert attempts == ["90"]


def test_cache_dir_is_keyed_by_source_and_arch(tmp_path, monkeypatch):
    monkeypatch.setenv("SELGATE_CUDA_CACHE", str(tmp_path / "cache"))
    src = tmp_path / "src"
    src.mkdir()
    for name in (*build.SOURCES, *build.HEADERS):
        (src / name).write_bytes((build.SOURCE_DIR / name).read_bytes())
    a90, a80 = build.cache_dir("90", src), build.cache_dir("80", src)
    assert a90.parent == tmp_path / "cache" and a90 != a80 and "-sm90-" in a90.name
    assert a90 == build.cache_dir("90", build.SOURCE_DIR)  # same bytes, same key
    (src / "sel_decode.cu").write_text((src / "sel_decode.cu").read_text() + "\n// edited\n")
    assert build.cache_dir("90", src) != a90


def _fake_compiler(monkeypatch, tmp_path, seconds=0.0):
    """Replaces torch's extension `load` with one that records when it ran and whether
    torch's lock file was in its build directory; builds land under tmp_path."""
    import torch.utils.cpp_extension as cpp

    monkeypatch.setenv("SELGATE_CUDA_CACHE", str(tmp_path / "cache"))
    calls, mu = [], threading.Lock()

    def load(*, build_directory, **kw):
        start = time.monotonic()
        saw_lock = os.path.exists(os.path.join(build_directory, "lock"))
        time.sleep(seconds)
        with mu:
            calls.append((start, time.monotonic(), saw_lock))
        return "module"

    monkeypatch.setattr(cpp, "load", load)
    return calls


def _hold_build_lock(out):
    """A separate process that holds the build lock of cache directory `out` until killed."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, sys, time; f = open(sys.argv[1], 'w'); "
            "fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(600)",
            str(out.with_name(out.name + ".lock")),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "held"
    return holder


def _release(holder):
    holder.kill()
    holder.wait(timeout=30)
    holder.stdout.close()


@pytest.mark.timeout(60)
def test_torch_lock_left_by_a_killed_builder_does_not_hang_the_next_build(tmp_path, monkeypatch):
    """A builder killed mid-build (a per-test timeout) leaves torch's `lock` file behind and
    dies holding the build lock; the next build must still run, not wait forever."""
    calls = _fake_compiler(monkeypatch, tmp_path)
    out = build.cache_dir("90")
    out.mkdir(parents=True)
    (out / "lock").write_text("")
    holder = _hold_build_lock(out)
    _release(holder)
    assert build._build("90") == "module"
    assert [saw for *_, saw in calls] == [False]


@pytest.mark.timeout(60)
def test_a_build_that_never_ends_elsewhere_is_a_build_error_not_a_hang(tmp_path, monkeypatch):
    calls = _fake_compiler(monkeypatch, tmp_path)
    monkeypatch.setenv("SELGATE_CUDA_BUILD_WAIT", "0.5")
    out = build.cache_dir("90")
    out.mkdir(parents=True)
    holder = _hold_build_lock(out)
    try:
        err = build._build("90")
    finally:
        _release(holder)
    assert isinstance(err, build.BuildError) and "SELGATE_CUDA_BUILD_WAIT" in str(err)
    assert calls == []


@pytest.mark.timeout(60)
def test_builders_in_one_cache_take_turns(tmp_path, monkeypatch):
    calls = _fake_compiler(monkeypatch, tmp_path, seconds=0.2)
    threads = [threading.Thread(target=build._build, args=("90",), daemon=True) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    spans = sorted((a, b) for a, b, _ in calls)
    assert len(spans) == 3
    assert all(nxt[0] >= prev[1] for prev, nxt in zip(spans, spans[1:])), spans


@pytest.mark.skipif(ON_GPU, reason="checks the no-device path of the eager build")
def test_eager_build_without_a_device_warns_and_imports():
    env = {**os.environ, "SELGATE_CUDA_BUILD": "1"}
    out = subprocess.run(
        [sys.executable, "-c", "import selgate.kernels.cuda"], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert "no CUDA device is visible" in out.stderr


def test_patched_copy_applies_each_edit_once(tmp_path):
    anchor = '#include "sel_decode.h"\n'
    out = build.patched_copy(tmp_path, {"sel_decode.cu": [(anchor, anchor + "// probe\n")]})
    cu = (out / "sel_decode.cu").read_text()
    assert cu.count(anchor + "// probe\n") == 1
    assert cu.replace("// probe\n", "", 1) == (build.SOURCE_DIR / "sel_decode.cu").read_text()
    assert all((out / f).read_text() == (build.SOURCE_DIR / f).read_text() for f in ("sel_decode.h", "sel_decode_bind.cpp"))


@pytest.mark.parametrize(
    "edits, match",
    [
        ({"sel_decode.cu": [("no such text in the kernel", "")]}, "found 0 times, expected once"),
        ({"sel_decode.cu": [("{", "")]}, "expected once"),
        ({"other.cu": [("a", "b")]}, "not sources of the extension"),
    ],
)
def test_patched_copy_refuses_an_anchor_that_moved(tmp_path, edits, match):
    with pytest.raises(ValueError, match=match):
        build.patched_copy(tmp_path, edits)


def _probe(name):
    path = Path(__file__).resolve().parents[2] / "probes" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"probe_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_probes_edits_still_fit_the_kernel(tmp_path):
    """The GPU probes patch the kernel by exact text; CI catches a kernel edit that moved an anchor."""
    timeline, variants = _probe("decode_timeline"), _probe("decode_load_variants")
    out = build.patched_copy(tmp_path / "timeline", {"sel_decode.cu": timeline.PATCHES, "sel_decode_bind.cpp": [timeline.BIND]})
    assert "sel_tl_read" in (out / "sel_decode.cu").read_text() and "timeline" in (out / "sel_decode_bind.cpp").read_text()
    for name, qualifiers in variants.VARIANTS.items():
        edit = (variants.ANCHOR, variants.ANCHOR.replace(variants.BASE, qualifiers))
        cu = (build.patched_copy(tmp_path / name.replace(":", ""), {"sel_decode.cu": [edit]}) / "sel_decode.cu").read_text()
        assert f'"{qualifiers} [%0], [%1], 16, %2;' in cu


@pytest.mark.skipif(not ON_GPU and os.environ.get("TRITON_INTERPRET") != "1", reason="Triton needs a GPU or TRITON_INTERPRET=1")
def test_the_floor_probe_reads_exactly_the_selected_keys():
    """decode_floor's read-only kernels bound the decode kernels only if they read the bytes
    the kernels read: each program sums its 64 selection positions' K and V rows."""
    from selgate.bench.cuda_decode import nsa_inputs

    floor = _probe("decode_floor")
    dev = torch.device("cuda" if ON_GPU else "cpu")
    x = nsa_inputs(3, 2, 16, 4, torch.float32, seed=5, device=dev)
    for dep, pdl in ((True, False), (False, False)) + (((True, True),) if ON_GPU else ()):  # PDL: inline PTX
        keys = [
            torch.cat([torch.arange(int(a), int(b)) for a, b in row]) if dep else torch.arange(256)
            for row in x.ranges.reshape(3, -1, 2).cpu()
        ]
        want = torch.stack(
            [torch.stack([(x.k[r, 0, kk] + x.v[r, 0, kk]).sum() for kk in row.to(dev).split(64)]) for r, row in enumerate(keys)]
        )
        torch.testing.assert_close(floor.read_only(dep, pdl)(x), want, rtol=1e-5, atol=1e-4)


# ------------------------------------------------------------------------------ GPU
gpu = pytest.mark.skipif(not ON_GPU, reason="the CUDA kernel needs a CUDA device")


# The families whose cases a decode kernel variant takes: parity (o, lse), bounds (keys outside
# the selection NaN, outputs poisoned first), empty rows, and repeated runs bitwise equal.
VARIANT_FAMILIES = ("parity", "bounds", "empty_ranges", "determinism")


def cuda_variant(kernel: str, launch: DecodeLaunch | None = None):
    """The registered `cuda` implementation (its declarations) calling one kernel with `launch`."""

    def call(q, k, v, ranges, *, scale=None, want_lse=True):
        return selection_attention_cuda(q, k, v, ranges, scale=scale, return_lse=want_lse, kernel=kernel, launch=launch)

    return dataclasses.replace(REGISTRY["cuda"], name=f"cuda-{kernel}", call=call)


def decode_case(h, Dk, Dv, S_kv, n, pattern, dtype) -> Case:
    """A decode case of the conformance matrix's kind (B=3, G=2) at a shape its declared cases lack."""
    shape = Shape(mode="decode", B=3, S=1, S_kv=S_kv, G=2, h=h, Dk=Dk, Dv=Dv, n=n)
    return Case(shape=shape, pattern=pattern, dtype=dtype, seed=h + n, size="small")


def assert_conforms(impl, case):
    for name in VARIANT_FAMILIES:
        family = FAMILIES[name]
        assert family.applies(case) and family.skip(impl, case, "cuda") is None, f"{name} does not run {case.id}"
        family.check(impl, case, "cuda")


@gpu
@pytest.mark.parametrize(
    "dtype, kernel", [(torch.float16, "mma"), (torch.bfloat16, "mma"), (torch.float32, "simt"), (torch.bfloat16, "simt")]
)
@pytest.mark.parametrize(
    "h, Dk, Dv, S_kv, n, pattern",
    [
        (1, 64, 64, 2051, 4, "full"),  # one head, the whole prefix: a long row
        (4, 128, 128, 4000, 16, "builder"),
        (16, 192, 64, 1332, 16, "mixed"),
        (20, 72, 40, 516, 8, "mixed"),  # odd head dims (pad paths), h > 16 (several blocks per row)
    ],
)
def test_gpu_kernel_variants_conform(dtype, kernel, h, Dk, Dv, S_kv, n, pattern):
    """Both kernels, CUDA cores ("simt") in fp16/bf16 too, which the registered `cuda`
    implementation (tensor cores for fp16/bf16) never runs."""
    assert_conforms(cuda_variant(kernel), decode_case(h, Dk, Dv, S_kv, n, pattern, dtype))


SHARED, PER_WARP = Schedule.SHARED_SLABS, Schedule.PER_WARP_SLABS
AFTER_LOOP, AFTER_WAIT = Pdl.TRIGGER_AFTER_LOOP, Pdl.TRIGGER_AFTER_WAIT


@gpu
@pytest.mark.parametrize(
    "launch",
    [
        DecodeLaunch(stages=2, split=1, warps=1),
        DecodeLaunch(stages=3, split=2, warps=4, pdl=AFTER_LOOP),
        DecodeLaunch(stages=2, split=4, warps=2),
        DecodeLaunch(stages=6, split=3, warps=2),
        DecodeLaunch(split=2),
        DecodeLaunch(split=4),
        DecodeLaunch(stages=2, split=1, warps=2, slab=16),
        DecodeLaunch(stages=3, split=2, warps=4, pdl=AFTER_LOOP, slab=16),
        DecodeLaunch(slab=16),
        DecodeLaunch(pdl=Pdl.OFF, schedule=PER_WARP),
        DecodeLaunch(stages=2, schedule=SHARED),
        DecodeLaunch(stages=6, pdl=Pdl.OFF, schedule=SHARED),
        DecodeLaunch(pdl=AFTER_WAIT),
        DecodeLaunch(stages=2, split=1, warps=2, pdl=AFTER_WAIT, slab=32, schedule=PER_WARP),
        DecodeLaunch(stages=4, pdl=AFTER_LOOP, schedule=SHARED),
    ],
    ids=DecodeLaunch.label,
)
@pytest.mark.parametrize(
    "h, Dk, Dv, S_kv, n, pattern",
    [(4, 64, 64, 4000, 16, "builder"), (20, 72, 40, 516, 8, "mixed"), (2, 256, 256, 1332, 8, "builder")],
)
def test_gpu_launch_overrides_conform(launch, h, Dk, Dv, S_kv, n, pattern):
    """Warps, ring depth, cluster split, PDL, keys per warp step and per-warp or shared slabs change the
    schedule, never the function."""
    if launch.needs_sm90() and torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("clusters and PDL need SM 9.0")
    assert_conforms(cuda_variant("mma", launch), decode_case(h, Dk, Dv, S_kv, n, pattern, torch.bfloat16))


@gpu
@pytest.mark.parametrize("dtype, kernel", [(torch.bfloat16, "mma"), (torch.float32, "simt")])
def test_gpu_positions_before_the_last_key_clamp_every_read(dtype, kernel):
    """Rows decoding at t < S_kv - 1 (explicit positions, int32) whose ranges reach past t give
    the reference's result; every key a row does not select, those past its t included, is NaN."""
    q, k, v, r = (t.cuda() for t in decode_inputs(dtype=dtype, h=8, Dk=64, Dv=64, S_kv=300, n=6, B=3, G=2, seed=9))
    positions = torch.tensor([[299], [261], [40]], dtype=torch.int32, device="cuda")
    norm = normalize_ranges(r, k.shape[2], positions)
    kp, vp = poison_unselected(k, v, norm)
    assert kp[2, :, 41:].isnan().all()
    o, lse = selection_attention_cuda(q, kp, vp, r, positions=positions, return_lse=True, kernel=kernel)
    assert_matches_reference(q, k, v, norm, o, lse, positions=positions)


@gpu
@pytest.mark.parametrize("layout", ["cache", "packed"])
@pytest.mark.parametrize("dtype, kernel", [(torch.bfloat16, "mma"), (torch.float32, "simt")])
def test_gpu_kv_views_give_the_contiguous_result(layout, dtype, kernel):
    """K/V read in place at their strides give bitwise the result of contiguous K/V (the same
    values read in the same order); the cache's keys past S_kv are NaN, so a read past the
    view's keys, or a row addressed as if dense, shows."""
    q, k, v, r = (t.cuda() for t in decode_inputs(dtype=dtype, h=8, Dk=64, Dv=128, S_kv=700, n=12, B=3, G=2, seed=4))
    kk, vv = kv_views(k, v, layout)
    launches = (
        DecodeLaunch(),
        DecodeLaunch(stages=2, split=1, warps=4),
        DecodeLaunch(stages=4, split=1, warps=2, pdl=AFTER_WAIT, slab=32, schedule=SHARED),
    )
    for launch in launches if kernel == "mma" else (DecodeLaunch(),):
        want = selection_attention_cuda(q, k, v, r, return_lse=True, kernel=kernel, launch=launch)
        got = selection_attention_cuda(q, kk, vv, r, return_lse=True, kernel=kernel, launch=launch)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), (layout, launch)
        assert not got[0].isnan().any()


@gpu
@pytest.mark.parametrize("prefetch", [p for p in Prefetch if p != Prefetch.AUTO], ids=lambda p: p.name)
def test_gpu_prefetched_first_keys_are_only_a_hint(prefetch):
    """The tail-landing launch asks L2 for keys [0, 64) before its wait (NSA's block 0); rows that
    select none of them (NaN here, with every other unselected key) still match the reference."""
    q, k, v, _ = (t.cuda() for t in decode_inputs(dtype=torch.bfloat16, h=4, Dk=64, Dv=64, S_kv=700, n=2, B=3, seed=5))
    r = torch.tensor([[100, 300], [400, 451]], dtype=torch.int32, device="cuda").expand(3, 1, 2, 2, 2).contiguous()
    norm = normalize_ranges(r, k.shape[2])
    kp, vp = poison_unselected(k, v, norm)
    assert kp[:, :, :64].isnan().all()
    launch = DecodeLaunch(pdl=AFTER_WAIT, schedule=SHARED, prefetch=prefetch, occupancy=2)
    o, lse = selection_attention_cuda(q, kp, vp, r, return_lse=True, kernel="mma", launch=launch)
    assert_matches_reference(q, k, v, norm, o, lse)


@gpu
def test_gpu_dispatchable_errors_stay_reasons():
    q, k, v, r = (t.cuda() for t in decode_inputs(dtype=torch.float16, Dk=12))
    assert reason_of(q, k, v, r).reason == "head_dim"
    q, k, v, r = (t.cuda() for t in decode_inputs(dtype=torch.float32))
    assert reason_of(q, k, v, r, kernel="mma").reason == "dtype"


def raw_tune(**values) -> list[int]:
    """The extension's tune list with `values` by field name, unchecked: for launches DecodeLaunch
    refuses to build, so the extension's own refusal is still tested."""
    return [values.get(name, 0) for name in EXT_ORDER]


@gpu
@pytest.mark.parametrize(
    "values, D, message",
    [
        (dict(stages=2, split=8, warps=2), 32, "a cluster split is verified only up to 4 blocks of at most 4 warps"),
        (dict(stages=2, split=2, warps=8), 32, "a cluster split is verified only up to 4 blocks of at most 4 warps"),
        (dict(slab=8), 64, "slab \\(keys per warp step\\) must be 16 or 32, got 8"),
        (dict(warps=4, schedule=2), 64, "the shared-slab schedule runs 2 warps, no split and 32-key slabs, got 4 warps"),
        (dict(schedule=3), 64, "schedule must be 1 \\(per-warp slabs\\) or 2 \\(shared slabs\\), got 3"),
        (
            dict(pdl=4),
            64,
            "pdl must be 0 \\(automatic\\), 1 \\(on\\), 2 \\(off\\) or 3 \\(on, next grid triggered right "
            "after the wait\\), got 4",
        ),
        (dict(prefetch=5), 64, "prefetch must be in \\[0, 4\\], got 5"),
    ],
)
def test_unverified_launches_are_refused_by_the_extension(values, D, message):
    """Launches that crashed on the H100, or were never verified, are refused by the extension with
    the reason, behind DecodeLaunch's own checks (tests/kernels/test_cuda_launch.py)."""
    q, k, v, r = (t.cuda() for t in decode_inputs(dtype=torch.bfloat16, Dk=D, Dv=D))
    norm = normalize_ranges(r, k.shape[2]).contiguous()
    ext = build.load_extension()
    with pytest.raises(RuntimeError, match=message):
        ext.fwd(
            q.contiguous(),
            k.flatten(0, 1).contiguous(),
            v.flatten(0, 1).contiguous(),
            norm,
            None,
            D**-0.5,
            True,
            raw_tune(**values),
        )


@gpu
def test_more_than_4_warps_at_wide_heads_are_refused():
    """8 warps crashed the host process on the H100 at Dk = Dv = 128: a shape DecodeLaunch cannot
    see, so the extension refuses it and the wrapper raises it as a reason."""
    q, k, v, r = (t.cuda() for t in decode_inputs(dtype=torch.bfloat16, Dk=128, Dv=128))
    launch = DecodeLaunch(stages=4, split=1, warps=8, pdl=AFTER_LOOP)
    with pytest.raises(BackendUnavailable, match="more than 4 warps are verified only for Dk \\+ Dv <= 128"):
        selection_attention_cuda(q, k, v, r, kernel="mma", launch=launch)


@gpu
def test_keys_beyond_int32_are_refused():
    """The tensor-core kernel counts positions in 32 bits: S_kv >= 2^31 is refused with its reason."""
    with pytest.raises(RuntimeError, match="S_kv must be below 2\\^31 keys, got 2147483648"):
        build.load_extension().plan(1, 1, 1, 4, 2**31, 64, 64, 8, True, DecodeLaunch().ext_tune())


@gpu
@pytest.mark.parametrize(
    "rows_per_sm, Dk, Dv, S_kv, schedule, pdl, bps, prefetch",
    [
        (0.5, 64, 64, 4096, 1, 0, None, 1),  # fewer rows than SMs, long rows: per-warp slabs (shared up to 1.26x slower)
        (0.5, 64, 64, 256, 2, 3, 6, 1),  # every L <= 256: shared slabs (0.66-1.02x of per-warp at N=64 on the H100)
        (8, 128, 64, 4096, 1, 0, None, 1),  # Dk > Dv, long rows: per-warp slabs (shared up to 1.15x slower)
        (8, 128, 64, 64, 2, 3, 5, 1),  # Dk > Dv, L <= 64: shared slabs (0.51-0.52x)
        (8, 128, 128, 4096, 2, 3, 4, 1),  # 4 blocks per SM, at most the even share of 8: early trigger; no
        # prefetch (it only cost at N = 1024)
        (2, 64, 64, 4096, 2, 3, 2, 4),  # one wave, room for 6 per SM: capped at the share of 2 (tail landing)
        (3, 64, 64, 4096, 2, 3, 3, 4),  # the same at a share of 3
        (2, 64, 128, 4096, 2, 3, 2, 4),  # 3 per SM capped at 2: the next grid no longer lands unevenly
        (2, 64, 64, 128, 2, 3, 6, 1),  # S_kv <= 128: no tail landing (the prefetched keys outweigh the rows)
    ],
)
def test_automatic_launch_follows_the_measured_rule(rows_per_sm, Dk, Dv, S_kv, schedule, pdl, bps, prefetch):
    """The automatic launch's schedule (1 per-warp, 2 shared slabs), PDL (0 off, 1 next grid
    triggered after the loop, 3 right after the wait), blocks per SM (capped at the even share for
    tail landing) and L2 prefetch (1 none, 4 ranges, q and first keys) at shapes the H100 sweeps
    decided, with the row count relative to the device's SMs (h = 8: one head group a row). The
    PDL mode of shared slabs depends on the blocks an SM holds (`bps` on the H100), so another
    count skips it."""
    B = int(rows_per_sm * torch.cuda.get_device_properties(0).multi_processor_count)
    plan = build.load_extension().plan(1, B, 1, 8, S_kv, Dk, Dv, 8, True, DecodeLaunch().ext_tune())
    assert plan[10] == schedule
    if torch.cuda.get_device_capability()[0] < 9:
        assert plan[7] == 0 and plan[11] == 1  # PDL needs SM 9.0, the prefetch needs PDL
    elif bps is not None and plan[6] != bps:
        pytest.skip(f"schedule checked; the PDL mode was measured at {bps} blocks per SM, this device holds {plan[6]}")
    else:
        assert (plan[7], plan[11]) == (pdl, prefetch)


def test_keys_past_2_31_are_declined_as_s_kv():
    """The kernel counts keys in int32: 2^31 keys or more are a reason, never a launch."""
    q, k, v, r = decode_inputs(B=1, G=1, S_kv=1, n=1)
    big = (t.expand(1, 1, 2**31, t.shape[3]) for t in (k, v))
    e = reason_of(q, *big, r)
    assert e.reason == "S_kv" and "S_kv=2147483648 > 2^31 - 1" in e.detail


@gpu
@pytest.mark.parametrize("dtype, kernel", [(torch.bfloat16, "mma"), (torch.float32, "simt")])
def test_gpu_the_last_keys_below_2_31(dtype, kernel):
    """A stride-0 K/V of 2^31 - 1 keys (every key the same row, a few bytes): the last keys are
    read, so o = v0 and lse = scale * q.k0 + log(L)."""
    S_kv, D = 2**31 - 1, 64
    g = torch.Generator().manual_seed(7)
    k0, v0 = (torch.randn(1, 1, 1, D, generator=g).to(dtype).cuda() for _ in range(2))
    q = torch.randn(1, 1, 1, 4, D, generator=g).to(dtype).cuda()
    r = torch.tensor([[[[[S_kv - 40, S_kv + 5], [2**30 - 3, 2**30 + 2]]]]], device="cuda")
    o, lse = selection_attention_cuda(q, k0.expand(1, 1, S_kv, D), v0.expand(1, 1, S_kv, D), r, return_lse=True, kernel=kernel)
    score = (q.double()[0, 0, 0] @ k0.double()[0, 0, 0]) / D**0.5
    assert (o.double()[0, 0, 0] - v0.double()[0, 0]).abs().max() <= 1e-2
    assert (lse.double()[0, 0, 0] - (score + math.log(45))).abs().max() <= 1e-3


@gpu
@pytest.mark.parametrize(
    "launch",
    [
        DecodeLaunch(),
        DecodeLaunch(schedule=PER_WARP),
        DecodeLaunch(stages=2, schedule=SHARED),
        DecodeLaunch(stages=3, split=2, warps=4),
    ],
    ids=["auto", "per_warp", "shared", "split2"],
)
@pytest.mark.parametrize("dtype, kernel", [(torch.float16, "mma"), (torch.float32, "simt")])
@pytest.mark.parametrize("kind", ["nan_q", "inf_key"])
def test_gpu_non_finite_rows_have_nan_lse(kind, dtype, kernel, launch):
    """lse = NaN where the row's top score is not finite (the reference's decision), never the
    empty row's -inf; the finite heads keep the reference's values."""
    if kernel == "simt" and launch != DecodeLaunch():
        pytest.skip("launch overrides are the tensor-core kernel's")
    if launch.needs_sm90() and torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("clusters need SM 9.0")
    q, k, v, _ = decode_inputs(dtype=torch.float32, h=4, Dk=64, Dv=64, S_kv=300, n=2, B=1, G=1, seed=8)
    r = torch.tensor([[[[[0, 300], [0, 0]]]]])
    bad = torch.zeros(1, 1, 1, 4, dtype=torch.bool)
    if kind == "nan_q":
        q[0, 0, 0, 2, 5] = float("nan")
        bad[0, 0, 0, 2] = True
    else:
        k[0, 0, 17] = 0.0
        k[0, 0, 17, 0] = float("inf")
        q[..., 0] = q[..., 0].abs() + 0.5
        bad[:] = True
    q, k, v, r, bad = (t.cuda() for t in (q.to(dtype), k.to(dtype), v.to(dtype), r, bad))
    o, lse = selection_attention_cuda(q, k, v, r, return_lse=True, kernel=kernel, launch=launch)
    assert bool(lse[bad].isnan().all()), lse
    if (~bad).any():
        from selgate.reference import selection_attention_ref

        ref_o, ref_lse = selection_attention_ref(q, k, v, r, return_lse=True)
        assert (lse[~bad].double() - ref_lse[~bad]).abs().max() <= 1e-2
        assert (o[~bad].double() - ref_o[~bad]).abs().max() <= 1e-2
