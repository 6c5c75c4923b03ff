"""The CUDA decode backend's Python entry point: input checks, the reasons it declines a
call (`BackendUnavailable`), range normalisation, and the call into the extension."""

from __future__ import annotations

import torch

from selgate.errors import BackendUnavailable
from selgate.device import device_capability
from selgate.reference.ranges import normalize_ranges
from selgate.reference.validation import check_inputs, resolve_scale

from . import build
from .launch import DecodeLaunch

_AUTOMATIC = DecodeLaunch()
_AUTO_TUNE = _AUTOMATIC.ext_tune()

# What the kernel takes; the conformance registry declares the `cuda` entry from these.
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
HEAD_DIM_MULTIPLE = 8  # 16-byte vectors of fp16/bf16
MAX_HEAD_DIM = 256
MAX_RANGES = 1024  # per row; the row's prefix sums live in shared memory
CLIP_MAX_RANGES = 64  # ranges per row the kernel clips itself (n^2 / 32 loads a row); more are normalised first
MAX_S_KV = 2**31 - 1  # key indices and row lengths are int32 in the kernel
MIN_CAPABILITY = (8, 0)  # cp.async and bf16 tensor cores
KERNELS = ("auto", "mma", "simt")


def aligned(t: torch.Tensor) -> torch.Tensor:
    """Contiguous, starting on a 16-byte boundary (the kernels move 16-byte vectors); a view
    with an odd storage offset is copied."""
    t = t.contiguous()
    return t if t.data_ptr() % 16 == 0 else t.clone()


def rows_view(t: torch.Tensor) -> torch.Tensor:
    """K or V [B, G, S_kv, D] as the kernel reads them, [B*G, S_kv, D] at any row and key
    strides of 16-byte multiples: a KV cache narrowed to its first S_kv keys, or K and V rows
    sharing one buffer, are read in place rather than copied whole on every decode step.
    Layouts whose (B, G) do not flatten to one stride, whose rows are not 16-byte aligned, or
    whose key stride reaches 2^31 elements (the kernel's key offsets are 32-bit) are copied."""
    t = t.flatten(0, 1)  # a view where B and G collapse, else a copy
    item = t.element_size()
    if t.stride(-1) == 1 and t.data_ptr() % 16 == 0 and t.stride(1) < 2**31 and all(st * item % 16 == 0 for st in t.stride()[:2]):
        return t
    return aligned(t)


def unsupported_reason(q, d) -> BackendUnavailable | None:
    """Why this validated call cannot run on the CUDA decode kernel, or None.

    Shape and dtype reasons come first so they are the same on every machine."""
    if d.S != 1:
        return BackendUnavailable("not_decode", f"the CUDA kernel serves decode (S == 1), got S={d.S} (q {tuple(q.shape)})")
    if q.dtype not in DTYPES:
        return BackendUnavailable("dtype", f"expected fp16, bf16 or fp32, got {q.dtype}")
    for name, dim in (("Dk", d.Dk), ("Dv", d.Dv)):
        if dim % HEAD_DIM_MULTIPLE or dim > MAX_HEAD_DIM:
            return BackendUnavailable(
                "head_dim", f"{name}={dim}: expected a multiple of {HEAD_DIM_MULTIPLE} up to {MAX_HEAD_DIM}"
            )
    if d.n > MAX_RANGES:
        return BackendUnavailable("ranges", f"n={d.n} ranges per row: at most {MAX_RANGES}")
    if d.S_kv > MAX_S_KV:
        return BackendUnavailable("S_kv", f"k: S_kv={d.S_kv} > 2^31 - 1; the kernel counts keys in int32")
    if q.device.type != "cuda":
        if not torch.cuda.is_available():
            return BackendUnavailable("no_cuda", "no CUDA device is visible")
        return BackendUnavailable("device", f"inputs are on {q.device}, not on a CUDA device")
    cap = device_capability(q.device)
    if cap < MIN_CAPABILITY:
        return BackendUnavailable("capability", f"compute capability {cap[0]}.{cap[1]} < {MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]}")
    return None


def launch_tune(launch) -> list[int]:
    """The extension's `tune` list for `launch` (None: automatic); anything but a DecodeLaunch
    is a TypeError, a positional tuple or list most of all."""
    if launch is None:
        launch = _AUTOMATIC
    elif isinstance(launch, (tuple, list)):
        raise TypeError(
            f"launch: positional overrides are not accepted, got {type(launch).__name__} {launch!r}; use "
            "selgate.kernels.cuda.DecodeLaunch, whose fields are named (e.g. DecodeLaunch(stages=3, pdl=Pdl.OFF))"
        )
    elif not isinstance(launch, DecodeLaunch):
        raise TypeError(f"launch: expected a DecodeLaunch or None, got {type(launch).__name__} {launch!r}")
    return launch.ext_tune()


def selection_attention_cuda(
    q,
    k,
    v,
    ranges,
    *,
    scale=None,
    positions=None,
    return_lse=False,
    normalized=False,
    kernel: str = "auto",
    launch: DecodeLaunch | None = None,
):
    """Selection attention for decode (S == 1) on the CUDA kernel; same contract as the reference.

    q [B,1,G,h,Dk], k [B,G,S_kv,Dk], v [B,G,S_kv,Dv], ranges [B,1,G,n,2] -> o [B,1,G,h,Dv]
    (dtype of v), and lse fp32 [B,1,G,h] with `return_lse`. Ranges are taken as given
    (any order, overlapping, unclamped) and made disjoint by the kernel itself, or normalised
    first where a row holds more than CLIP_MAX_RANGES; `normalized=True` skips both (the kernel
    still clamps every read to `<= t`). `kernel`:
    "auto" (tensor cores for fp16/bf16, CUDA cores for fp32), "mma" or "simt". `launch`: a
    `DecodeLaunch` of launch overrides for the tensor-core kernel (launch.py; None or its defaults:
    automatic; benchmarks sweep them; results do not depend on them beyond rounding). A tuple or
    list is refused with a TypeError: the overrides are named fields, never positions.

    Raises ValueError/TypeError for bad input and `BackendUnavailable` (reason "not_decode",
    "dtype", "head_dim", "ranges", "no_cuda", "device", "capability", "build" or "launch")
    when this backend cannot serve the call."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel: expected one of {KERNELS}, got {kernel!r}")
    tune = launch_tune(launch)
    d = check_inputs(q, k, v, ranges, scale=scale, positions=positions)
    reason = unsupported_reason(q, d)
    if reason is not None:
        raise reason
    clip = not normalized and d.n <= CLIP_MAX_RANGES
    norm = ranges if normalized or clip else normalize_ranges(ranges, d.S_kv, positions)
    o, lse = run_cuda(q, k, v, norm, d, scale=scale, positions=positions, kernel=kernel, tune=tune, clip=clip)
    return (o, lse) if return_lse else o


def run_cuda(
    q, k, v, norm, d, *, scale, positions, kernel: str = "auto", tune=None, clip=False, counter=None, kv_bytes_per_key=0
):
    """`(o, lse)` on inputs the caller checked (`d`, from `check_inputs`) and ranges it
    normalised, or, with `clip`, ranges as given (at most CLIP_MAX_RANGES a row), which the
    kernel makes disjoint: the dispatcher's CUDA rung, so a decode step pays for its checks
    once. `counter` (int64 [2]) gets the call's selected keys and `kv_bytes_per_key` times
    them added, as the normaliser adds them.
    Raises `BackendUnavailable` like `selection_attention_cuda`, and ("grad") for inputs that
    require grad: the kernel has no backward, and a detached output would drop them silently."""
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        raise BackendUnavailable("grad", "inputs require grad and the CUDA decode kernel has no backward")
    reason = unsupported_reason(q, d)
    if reason is not None:
        raise reason
    use_mma = q.dtype != torch.float32 if kernel == "auto" else kernel == "mma"
    if use_mma and q.dtype == torch.float32:
        raise BackendUnavailable("dtype", "the tensor-core kernel takes fp16/bf16; fp32 runs on kernel='simt'")
    try:
        ext = build.load_extension(q.device)
    except build.BuildError as exc:
        raise BackendUnavailable("build", str(exc)) from exc
    args = (resolve_scale(scale, d.Dk), use_mma, tune or _AUTO_TUNE, clip, counter, int(kv_bytes_per_key))
    return _fwd(ext, aligned(q), rows_view(k), rows_view(v), norm, positions, args)


def _fwd(ext, q, k_rows, v_rows, ranges, positions, args: tuple):
    """The extension's forward as `(o, lse)`; `args`: its arguments after the tensors. A launch
    the extension refuses is `BackendUnavailable("launch")`."""
    pos = None if positions is None else positions.contiguous()
    try:
        o, lse = ext.fwd(q, k_rows, v_rows, ranges.contiguous(), pos, *args)
    except RuntimeError as exc:
        raise BackendUnavailable("launch", str(exc)) from exc
    return o, lse  # the binding returns a list


def cuda_replay(q, k, v, d, *, scale, positions, clip=False, counter=None, kv_bytes_per_key=0):
    """`run_cuda`'s call kept for its repeats: a function of `(q, k, v, ranges, positions)`
    returning `(o, lse)` for inputs of this call's shapes, strides, dtypes, devices and 16-byte
    alignment (the dispatcher keys them: kernels/kept.py), with this call's checks, extension
    and launch settings resolved once (`clip`, `counter`, `kv_bytes_per_key`: `run_cuda`'s).
    None (nothing to keep) where `run_cuda` would copy q, K or V, or cannot take the call."""
    if unsupported_reason(q, d) is not None or aligned(q) is not q:
        return None
    if any(rows_view(x).data_ptr() != x.data_ptr() for x in (k, v)):  # a copy on every call
        return None
    try:
        ext = build.load_extension(q.device)
    except build.BuildError:
        return None
    args = (resolve_scale(scale, d.Dk), q.dtype != torch.float32, _AUTO_TUNE, clip, counter, int(kv_bytes_per_key))

    def replay(q, k, v, ranges, positions):
        return _fwd(ext, q, k.flatten(0, 1), v.flatten(0, 1), ranges, positions, args)

    return replay
