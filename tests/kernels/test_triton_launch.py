"""The cached Triton launcher (kernels/triton/launch.py): its key separates every pair of
launches Triton 3.6 compiles differently (checked against Triton's own binder, on CPU), it
hands the compiled launcher the arguments Triton would, and it leaves the launches Triton's
path must see (interpreter, hooks) to that path. On a GPU: fast and plain launches agree bit
for bit, and a warm launch never enters `JITFunction.run`."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import CUDABackend
from triton.runtime.jit import JITFunction, compute_cache_key, create_function_from_signature
from triton.tools.tensor_descriptor import TensorDescriptor

from selgate.kernels import reload_settings
from selgate.kernels.triton import launch as L

ON_GPU = torch.cuda.is_available()
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def _probe(t_ptr, u_ptr, a, b, c, x, flag, BLOCK: tl.constexpr, MODE: tl.constexpr = 2, d=7):
    pass


# Every way Triton specialises: t_ptr and a fully, u_ptr and c without alignment, b not at all.
PROBE = JITFunction(_probe, do_not_specialize=["b"], do_not_specialize_on_alignment=["u_ptr", "c"])
BINDER = create_function_from_signature(PROBE.signature, PROBE.params, CUDABackend(GPUTarget("cuda", 90, 32)))


def unaligned(n=8, dtype=torch.float16):
    return torch.empty(n + 1, dtype=dtype)[1:]  # 2 or 4 bytes past a 16-byte boundary


def ours(args, kw):
    return L._Kernel(PROBE).key(args, kw)


def triton_key(args, kw):
    """The string key `JITFunction.run` finds a compiled kernel by (its options included)."""
    _, spec, options = BINDER(*args, **kw, debug=False, instrumentation_mode="")
    return compute_cache_key({}, spec, options)


def base():
    return [torch.empty(8, dtype=torch.float16), torch.empty(8, dtype=torch.float16), 32, 5, 5, 0.5, True], {"BLOCK": 16}


def variant(i, value=None, **kw):
    args, kwargs = base()
    if i is not None:
        args[i] = value
    return args, {**kwargs, **kw}


# Pairs of launches that Triton 3.6 compiles differently: each pair must key differently.
DIFFERENT = {
    "aligned vs unaligned pointer": (base(), variant(0, unaligned())),
    "pointer dtype": (base(), variant(0, torch.empty(8, dtype=torch.float32))),
    "pointer vs None": (base(), variant(0, None)),
    "no-alignment pointer dtype": (base(), variant(1, torch.empty(8, dtype=torch.bfloat16))),
    "int 1 vs 32": (base(), variant(2, 1)),
    "int 16 vs 17": (variant(2, 16), variant(2, 17)),
    "int 2**31 vs 32": (base(), variant(2, 2**31)),
    "int 2**63 vs 2**63 - 16": (variant(2, 2**63 - 16), variant(2, 2**63)),
    "plain int 2**31 vs 5": (base(), variant(3, 2**31)),
    "no-alignment int 1 vs 5": (base(), variant(4, 1)),
    "int vs float": (base(), variant(3, 5.0)),
    "float vs bool": (base(), variant(5, True)),
    "bool vs int 1": (base(), variant(6, 1)),
    "constexpr value": (base(), variant(None, BLOCK=32)),
    "constexpr True vs 1": (variant(None, BLOCK=1), variant(None, BLOCK=True)),
    "num_warps": (variant(None, num_warps=4), variant(None, num_warps=8)),
    "num_stages 3 vs 3.0": (variant(None, num_stages=3), variant(None, num_stages=3.0)),
}


@pytest.mark.parametrize("case", DIFFERENT)
def test_key_separates_what_triton_specialises(case):
    a, b = DIFFERENT[case]
    assert triton_key(*a) != triton_key(*b)  # a pair Triton tells apart
    assert ours(*a) != ours(*b)


def test_key_is_equal_where_triton_does_not_specialise():
    (t, u, *rest), kw = base()
    again = [torch.empty(8, dtype=torch.float16), torch.empty(8, dtype=torch.float16), *rest]
    assert ours([t, u, *rest], kw) == ours(again, dict(kw))
    for i, x, y in ((1, u, unaligned()), (3, 5, 17), (3, 5, 1), (4, 5, 17), (5, 0.5, 3.0), (6, True, False)):
        a, b = variant(i, x), variant(i, y)
        assert triton_key(*a) == triton_key(*b) and ours(*a) == ours(*b), (i, x, y)


INTS = [0, 1, 2, 16, 17, -16, -(2**31), -(2**31) - 16, 2**31 - 16, 2**31, 2**32, 2**63 - 1, 2**63, 2**64 - 16, 1.0, True]
POOLS = {  # per position of PROBE, the values it is given
    0: [torch.empty(8, dtype=torch.float16), unaligned(), torch.empty(8)[4:], unaligned(8, torch.float32), None, 3],
    1: [torch.empty(8, dtype=torch.float16), unaligned(), torch.empty(8), unaligned(8, torch.float32), None],
    2: INTS,
    3: INTS,
    4: INTS,
    5: [0.5, -0.0, 2, 1, False],
    6: [True, False, 1, 0, 16],
    None: [
        {"BLOCK": 16},
        {"BLOCK": 1},
        {"BLOCK": True},
        {"BLOCK": 16.0},
        {"BLOCK": 16, "num_warps": 8},
        {"BLOCK": 16, "MODE": 1},
    ],
}


def partition(key, i):
    """Which values of POOLS[i] key alike: for each one, the indices of those keying as it does."""
    calls = [variant(i, x) if i is not None else variant(None, **x) for x in POOLS[i]]
    keys = [key(*call) for call in calls]
    return [{j for j, other in enumerate(keys) if other == mine} for mine in keys]


@pytest.mark.parametrize("i", POOLS)
def test_key_tells_apart_exactly_what_triton_does(i):
    """Never coarser (a wrong kernel), and here no finer either (a needless slow launch)."""
    assert partition(ours, i) == partition(triton_key, i)


def test_the_check_catches_a_key_that_ignores_alignment(monkeypatch):
    real = L._part
    monkeypatch.setattr(L, "_part", lambda i, t, mode: real(i, t, L.NO_ALIGN if mode == L.ALIGN else mode))
    assert partition(ours, 0) != partition(triton_key, 0) and partition(ours, 2) != partition(triton_key, 2)


def test_tensor_descriptor_keys_dtype_and_block_shape():
    k = torch.empty(2, 64, 32, dtype=torch.float16)
    desc = lambda x, block: TensorDescriptor(x, list(x.shape), list(x.stride()), block)  # noqa: E731
    (_, *rest), kw = base()
    key = lambda d: ours([d, *rest], kw)  # noqa: E731
    assert key(desc(k, [1, 16, 32])) == key(desc(torch.empty(3, 80, 32, dtype=torch.float16), [1, 16, 32]))
    assert key(desc(k, [1, 16, 32])) != key(desc(k, [1, 32, 32]))
    assert key(desc(k, [1, 16, 32])) != key(desc(k.float(), [1, 16, 32]))


class FakeCompiled:
    """Stands in for a CompiledKernel: records what its launcher is called with."""

    function, packed_metadata = 77, (4, 1, 0)

    def __init__(self):
        self.launches = []

    @property
    def run(self):
        return lambda *a: self.launches.append(a)


@pytest.fixture
def fake_triton(monkeypatch):
    """PROBE launched without a GPU: `JITFunction.run` binds through Triton's real binder and
    records the bound arguments; the driver reports device 0 and stream 123."""
    state = SimpleNamespace(runs=[], ck=FakeCompiled())

    def run(*args, grid, warmup, **kwargs):
        bound, _, _ = BINDER(*args, **kwargs)
        state.runs.append(list(bound.values()))
        return state.ck

    monkeypatch.setattr(PROBE, "run", run)
    fake_driver = SimpleNamespace(
        get_current_device=lambda: 0,
        get_current_stream=lambda dev: 123,
        get_current_target=lambda: GPUTarget("cuda", 90, 32),
    )
    monkeypatch.setattr(L, "driver", SimpleNamespace(active=fake_driver))
    L.clear()
    yield state
    L.clear()


def test_a_warm_launch_passes_the_arguments_triton_binds(fake_triton):
    args, kw = base()
    assert L.launch(PROBE, (3,), *args, **kw) is fake_triton.ck and len(fake_triton.runs) == 1
    args2 = [torch.empty(8, dtype=torch.float16), torch.empty(8, dtype=torch.float16), 48, 9, 6, 0.25, False]
    assert L.launch(PROBE, (3, 2), *args2, **kw) is fake_triton.ck
    assert len(fake_triton.runs) == 1  # the same specialisation: no JITFunction.run
    (launched,) = fake_triton.ck.launches
    bound, _, _ = BINDER(*args2, **kw)
    assert launched[:9] == (3, 2, 1, 123, 77, (4, 1, 0), None, None, None)
    assert list(launched[9:]) == list(bound.values())  # every parameter, defaults filled, in order
    L.launch(PROBE, (3,), unaligned(), *args2[1:], **kw)  # a new specialisation: Triton's path
    assert len(fake_triton.runs) == 2 and len(L._kernels[id(PROBE)].cache) == 2


def test_a_backend_other_than_cuda_takes_tritons_path(fake_triton, monkeypatch):
    """The key mirrors the CUDA backend's specialisation: ROCm's adds a mark the key lacks."""
    monkeypatch.setattr(L.driver.active, "get_current_target", lambda: GPUTarget("hip", "gfx90a", 64))
    args, kw = base()
    for _ in range(3):
        L.launch(PROBE, (1,), *args, **kw)
    assert len(fake_triton.runs) == 3 and not L._kernels


def test_what_must_see_tritons_path_takes_it(fake_triton, monkeypatch):
    args, kw = base()
    L.launch(PROBE, (1,), *args, **kw)
    runs = lambda: len(fake_triton.runs)  # noqa: E731
    L.launch(PROBE, (1,), *args, **kw)
    assert runs() == 1
    with monkeypatch.context() as m:
        m.setattr(triton.knobs.runtime, "launch_enter_hook", lambda metadata: None)
        L.launch(PROBE, (1,), *args, **kw)
    assert runs() == 2
    with monkeypatch.context() as m:
        m.setattr(PROBE, "pre_run_hooks", [lambda *a, **k: None])
        L.launch(PROBE, (1,), *args, **kw)
    assert runs() == 3
    with monkeypatch.context() as m:
        m.setattr(L, "ENABLED", False)
        L.launch(PROBE, (1,), *args, **kw)
    assert runs() == 4
    sub = torch.nn.Parameter(torch.empty(8, dtype=torch.float16))  # a type the key does not know
    L.launch(PROBE, (1,), sub, *args[1:], **kw)
    L.launch(PROBE, (1,), sub, *args[1:], **kw)
    assert runs() == 6
    L.launch(PROBE, (1,), *args, **kw, d=7)  # a non-constexpr parameter by keyword: never kept
    L.launch(PROBE, (1,), *args, **kw, d=7)
    assert runs() == 8
    L.launch(PROBE, (1,), *args, **kw)
    assert runs() == 8
    reload_settings()
    assert L._kernels == {}
    L.launch(PROBE, (1,), *args, **kw)
    assert runs() == 9


# ---- the real kernels ----------------------------------------------------------------------

needs_interpreter = pytest.mark.skipif(
    ON_GPU or not INTERPRET, reason="the interpreter fallback runs on CPU under TRITON_INTERPRET=1"
)
needs_gpu = pytest.mark.skipif(not ON_GPU, reason="the fast path launches compiled kernels: needs a CUDA GPU")
DEVICE = "cuda" if ON_GPU else "cpu"


def forward(q, k, v, norm, *, fast: bool, config=None):
    """`triton_forward` into NaN-poisoned outputs, through the launcher or Triton's path."""
    from selgate.kernels.triton.fwd import triton_forward
    from selgate.reference import resolve_scale

    o = torch.full((*q.shape[:4], v.shape[-1]), float("nan"), dtype=v.dtype, device=q.device)
    lse = torch.full(q.shape[:4], float("nan"), device=q.device)
    old, L.ENABLED = L.ENABLED, fast
    try:
        return triton_forward(q, k, v, norm, scale=resolve_scale(None, q.shape[-1]), out=(o, lse), config=config)
    finally:
        L.ENABLED = old


def inputs(B, S, G, h, Dk, Dv, S_kv, n, dtype, seed=0):
    from selgate.reference import normalize_ranges
    from tests.helpers import random_inputs

    q, k, v, r = random_inputs(B=B, S=S, G=G, h=h, Dk=Dk, Dv=Dv, S_kv=S_kv, n=n, dtype=dtype, seed=seed)
    return [t.to(DEVICE) for t in (q, k, v, normalize_ranges(r, S_kv))]


@needs_interpreter
def test_the_interpreter_takes_tritons_path():
    from selgate.kernels.triton.normalize import normalize_ranges_triton

    L.clear()
    q, k, v, norm = inputs(2, 1, 2, 4, 16, 16, 40, 3, torch.float32)
    fast, plain = forward(q, k, v, norm, fast=True), forward(q, k, v, norm, fast=False)
    assert all(torch.equal(a, b) for a, b in zip(fast, plain))
    r = torch.randint(-3, 45, (2, 1, 2, 3, 2))
    assert torch.equal(normalize_ranges_triton(r, 40), normalize_ranges_triton(r, 40))
    assert L._kernels == {}


GATHER = {"BLOCK_L": 32, "num_warps": 4, "num_stages": 2}
TMA = {"BLOCK_L": 32, "num_warps": 4, "num_stages": 2, "TMA": True, "TAIL_L": 16}
# (B, S, G, h, Dk, Dv, S_kv, n): decode; prefill; S_kv=1; strides not multiples of 16 (Dk=24).
SHAPES = {
    "decode": (1, 1, 8, 16, 128, 128, 4096, 8),
    "prefill": (2, 9, 2, 4, 64, 64, 300, 4),
    "s_kv_1": (2, 1, 2, 4, 32, 32, 1, 2),
    "odd_strides": (1, 3, 2, 3, 24, 40, 37, 3),
}


def variants(q, k, v, norm):
    """The same call in layouts Triton specialises differently: q 2 bytes off 16-byte alignment,
    and K with a batch stride of 1 (an int argument Triton turns into constexpr 1)."""
    q_off = torch.empty(q.numel() + 1, dtype=q.dtype, device=q.device)[1:].view(q.shape).copy_(q)
    out = {"aligned": (q, k, v, norm), "unaligned_q": (q_off, k, v, norm)}
    if k.shape[0] == 1:
        k1 = k.as_strided(k.shape, (1, *k.stride()[1:]))
        out["k_stride_1"] = (q, k1, v, norm)
    return out


@needs_gpu
@pytest.mark.parametrize("config", [GATHER, TMA], ids=["gather", "tma"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES)
def test_fast_and_plain_launches_agree_bitwise(shape, dtype, config):
    from selgate.kernels.triton.fwd import tma_supported

    L.clear()
    calls = variants(*inputs(*SHAPES[shape], dtype))
    if config is TMA and not tma_supported(*calls["aligned"][1:3]):
        pytest.skip("tensor descriptors need SM >= 9.0 and 16-byte K/V rows")
    for _ in range(2):  # the second round runs on kept launches, interleaved across specialisations
        for name, call in calls.items():
            fast, plain = forward(*call, fast=True, config=config), forward(*call, fast=False, config=config)
            assert torch.equal(fast[0], plain[0]) and torch.equal(fast[1], plain[1]), name
    assert len(L._kernels[id(fwd_kernel())].cache) == len(calls)


def fwd_kernel():
    from selgate.kernels.triton.fwd import _sel_fwd_kernel

    return _sel_fwd_kernel


@pytest.fixture
def count_runs(monkeypatch):
    runs = []
    real = JITFunction.run
    monkeypatch.setattr(JITFunction, "run", lambda self, *a, **kw: runs.append(self) or real(self, *a, **kw))
    return runs


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_warm_launch_skips_jit_run_and_matches_the_reference(dtype, count_runs):
    from tests.helpers import assert_matches_reference

    L.clear()
    q, k, v, norm = inputs(*SHAPES["decode"], dtype)
    forward(q, k, v, norm, fast=True, config=GATHER)
    assert len(count_runs) == 1 and len(L._kernels[id(fwd_kernel())].cache) == 1
    o, lse = forward(q, k, v, norm, fast=True, config=GATHER)  # outputs NaN-poisoned before the call
    assert len(count_runs) == 1  # kept: JITFunction.run not entered
    assert_matches_reference(q, k, v, norm, o, lse)
    q1 = q[:, :, :, :1]  # h=1: other sizes and strides, all unspecialised: the same key
    o, lse = forward(q1, k, v, norm, fast=True, config=GATHER)
    assert len(count_runs) == 1
    assert_matches_reference(q1, k, v, norm, o, lse)


@needs_gpu
def test_normalize_kernel_warm_launch_skips_jit_run(count_runs):
    from selgate.kernels.triton.normalize import normalize_ranges_triton
    from selgate.reference import normalize_ranges

    L.clear()
    r = torch.randint(-3, 9000, (1, 1, 8, 8, 2), device="cuda")
    for _ in range(3):
        assert torch.equal(normalize_ranges_triton(r, 8192).cpu(), normalize_ranges(r.cpu(), 8192))
    assert len(count_runs) == 1


@needs_gpu
def test_a_launch_hook_forces_tritons_path(count_runs, monkeypatch):
    L.clear()
    q, k, v, norm = inputs(*SHAPES["decode"], torch.float16)
    first = forward(q, k, v, norm, fast=True, config=GATHER)
    seen = []
    monkeypatch.setattr(triton.knobs.runtime, "launch_enter_hook", lambda metadata: seen.append(metadata.get()["name"]))
    hooked = forward(q, k, v, norm, fast=True, config=GATHER)
    assert len(count_runs) == 2 and seen == ["_sel_fwd_kernel"]
    assert torch.equal(hooked[0], first[0]) and torch.equal(hooked[1], first[1])
