"""Triton launches without Triton's per-call binding: `launch(kernel, grid, *args, **kw)`.

Triton 3.6's `kernel[grid](...)` (`JITFunction.run`) binds and specialises every argument
and builds a string key on each call: tens of microseconds of host time for the forward
kernel's ~50 arguments, more than a decode step's kernel takes. `launch` takes that path
once per specialisation, keeps the `CompiledKernel`, then calls its launcher (`ck.run`,
where `JITFunction.run` ends) directly. Its key is at least as fine as Triton's, so a kernel
compiled for one specialisation never serves another; what it cannot key, and launches that
Triton's path must see (hooks, autotuners, the interpreter), take Triton's path."""

from __future__ import annotations

import functools

import torch
from triton import knobs
from triton.knobs import HookChain
from triton.runtime import driver
from triton.runtime.jit import JITFunction
from triton.tools.tensor_descriptor import TensorDescriptor

ENABLED = True  # False: every launch takes Triton's path (tests and the launch probe compare both)
CONSTEXPR, PLAIN, NO_ALIGN, ALIGN = range(4)  # how Triton specialises a parameter (`_part`)
_kernels: dict = {}  # id(kernel) -> _Kernel
_backends: dict = {}  # id(driver) -> its target's backend ("cuda", "hip", ...)


class _Unkeyable(Exception):
    """An argument the key cannot hold: the launch takes Triton's path."""


def _widths(*xs: int) -> tuple:
    """Ints not all within int32, typed as Triton 3.6 types each: i32, i64, u64 (>= 2^63)."""
    if not all(-(2**63) <= x < 2**64 for x in xs):
        raise _Unkeyable("an int beyond 64 bits")  # Triton raises OverflowError
    return tuple(32 if -(2**31) <= x < 2**31 else 64 if x < 2**63 else -64 for x in xs)


def _unkeyable(t: type):
    raise _Unkeyable(f"an argument of type {t.__name__}")


def _mode(p) -> int:
    if p.is_constexpr:
        return CONSTEXPR
    return PLAIN if p.do_not_specialize else NO_ALIGN if p.do_not_specialize_on_alignment else ALIGN


def _part(i: int, t: type, mode: int) -> str:
    """The key's part for positional argument `a{i}` of type `t` in a parameter of `mode`
    (CONSTEXPR; PLAIN: do_not_specialize; NO_ALIGN: do_not_specialize_on_alignment; ALIGN):
    what Triton 3.6's `native_specialize_impl` (C++) makes of it, or finer. Argument types
    are in the key, so a part only separates values of one type; int widths: `_keyfn`."""
    a = f"a{i}"
    if mode == CONSTEXPR:
        return a  # by value, as Triton's key compares it
    if t is torch.Tensor:  # '*<dtype>', plus 'D' when data_ptr() % 16 == 0
        return f"{a}.dtype, {a}.data_ptr() % 16 == 0" if mode == ALIGN else f"{a}.dtype"
    if t is int:  # if specialised: ('constexpr', 1) for 1, else 'D' when divisible by 16
        return {PLAIN: "", NO_ALIGN: f"{a} == 1", ALIGN: f"{a} % 16 == 0 if {a} != 1 else None"}[mode]
    if t in (float, bool, type(None)):  # 'fp32', 'u1', ('constexpr', None) whatever the value
        return ""
    if t is TensorDescriptor:  # 'tensordesc<dtype[block_shape]>'; padding too, to be safe
        return f"{a}.base.dtype, tuple({a}.block_shape), {a}.padding"
    return f"_unkeyable({a}.__class__)"  # anything else: Triton's path, every call


def _keyfn(types: tuple, modes: tuple):
    """The function of positional arguments of these types that returns their key parts:
    generated code, as a Python call per argument would cost what Triton's binder does.
    Given more arguments than there are parameters, it raises TypeError."""
    n = min(len(types), len(modes))
    parts = [p for p in map(_part, range(n), types, modes) if p]
    ints = [f"a{i}" for i in range(n) if types[i] is int and modes[i] != CONSTEXPR]
    if ints:  # True when all fit int32 (one comparison each), else each one's width
        parts.append(" and ".join(f"-2147483648 <= {a} <= 2147483647" for a in ints) + f" or _widths({', '.join(ints)})")
    scope = {"_widths": _widths, "_unkeyable": _unkeyable}
    exec(f"def keyfn({', '.join(f'a{i}' for i in range(n))}):\n    return ({''.join(p + ', ' for p in parts)})", scope)
    return scope["keyfn"]


class _Kernel:
    """One JITFunction's key functions (by argument types) and kept launches (by key)."""

    def __init__(self, fn: JITFunction):
        self.fn, self.keyfns, self.cache = fn, {}, {}
        self.modes = tuple(map(_mode, fn.params))

    def key(self, args: tuple, kwargs: dict) -> tuple:
        """What `JITFunction.run` finds its kernel by (specialisations, options), or finer.
        Raises _Unkeyable, or TypeError for an unhashable keyword value."""
        types = tuple(map(type, args))
        fn = self.keyfns.get(types) or self.keyfns.setdefault(types, _keyfn(types, self.modes))
        options = (self.fn.debug, knobs.runtime.debug, knobs.compilation.instrumentation_mode)  # run() adds them
        return types, fn(*args), tuple(kwargs.items()), tuple(map(type, kwargs.values())), options

    def keep(self, key, ck, n_args: int, kwargs: dict) -> None:
        """Keep `ck` unless a keyword is a parameter that is not constexpr (the key holds it by
        value); the parameters after the positional ones follow in Triton's order."""
        params = self.fn.params
        if ck is not None and not any(p.name in kwargs and not p.is_constexpr for p in params):
            tail = tuple(kwargs[p.name] if p.name in kwargs else p.default for p in params[n_args:])
            self.cache[key] = (ck, ck.run, ck.function, ck.packed_metadata, tail)


def _hook_set(hook) -> bool:
    return hook is not None and not (type(hook) is HookChain and not hook.calls)


def launch(kernel, grid: tuple, *args, **kwargs):
    """`kernel[grid](*args, **kwargs)`, returning what it returns; `grid` a tuple of 1-3 ints.
    Triton's path whenever the fast one could differ: not a plain JITFunction (autotuners,
    TRITON_INTERPRET=1's InterpretedFunction, test spies), pre-run hooks, launch hooks
    (profilers), globals that Triton re-checks per call, arguments the key cannot hold."""
    if (
        not ENABLED
        or type(kernel) is not JITFunction
        or kernel.pre_run_hooks
        or kernel.used_global_vals
        or _hook_set(knobs.runtime.launch_enter_hook)
        or _hook_set(knobs.runtime.launch_exit_hook)
    ):
        return kernel[grid](*args, **kwargs)
    drv = driver.active
    if _backends.get(id(drv)) is None:  # the key mirrors the CUDA backend's specialisation; ROCm's
        _backends[id(drv)] = drv.get_current_target().backend  # adds a "tensor under 2 GB" mark
    if _backends[id(drv)] != "cuda":
        return kernel[grid](*args, **kwargs)
    k = _kernels.get(id(kernel))
    if k is None or k.fn is not kernel:
        k = _kernels[id(kernel)] = _Kernel(kernel)
    dev = drv.get_current_device()  # Triton keeps compiled kernels per current device
    try:
        key = (dev, k.key(args, kwargs))
        hit = k.cache.get(key)
    except (_Unkeyable, TypeError):
        return kernel[grid](*args, **kwargs)
    if hit is None:
        ck = kernel[grid](*args, **kwargs)
        k.keep(key, ck, len(args), kwargs)
        return ck
    ck, run, function, metadata, tail = hit
    n = len(grid)
    stream = drv.get_current_stream(dev)
    # No launch metadata nor enter/exit hooks: only hooks read the metadata, and none is set.
    run(grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1, stream, function, metadata, None, None, None, *args, *tail)
    return ck


def bind(kernel, grid: tuple, args: tuple, kwargs: dict):
    """A function of positional arguments that launches as `launch(kernel, grid, *args,
    **kwargs)` would, skipping the key: for a caller that keys the arguments itself and calls
    it only with arguments Triton specialises as it does `args` (same types, tensor dtypes and
    16-byte alignment, ints alike in width, in being 1 and in divisibility by 16), as the
    dispatcher's kept calls do (kernels/kept.py). The launch of `args` must have been made
    through `launch` before; without it kept, or whenever `launch` would take Triton's path
    (a hook set, the switch off, another current device), the function calls `launch`."""
    plain = functools.partial(launch, kernel, grid, **kwargs)
    k = _kernels.get(id(kernel))
    if (
        not ENABLED
        or type(kernel) is not JITFunction
        or k is None
        or k.fn is not kernel
        or kernel.pre_run_hooks
        or kernel.used_global_vals
    ):
        return plain
    drv = driver.active
    dev = drv.get_current_device()
    try:
        key = (dev, k.key(args, kwargs))
        hit = k.cache.get(key)
    except (_Unkeyable, TypeError):
        return plain
    if hit is None:
        return plain
    _, run, function, metadata, tail = hit
    n = len(grid)
    g0, g1, g2 = grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1
    options = key[1][-1]
    runtime, compilation = knobs.runtime, knobs.compilation

    def bound(*args):
        if (
            not ENABLED
            or kernel.pre_run_hooks
            or driver.active is not drv
            or drv.get_current_device() != dev
            or _hook_set(runtime.launch_enter_hook)
            or _hook_set(runtime.launch_exit_hook)
            or (kernel.debug, runtime.debug, compilation.instrumentation_mode) != options
        ):
            return plain(*args)
        run(g0, g1, g2, drv.get_current_stream(dev), function, metadata, None, None, None, *args, *tail)

    return bound


def clear() -> None:
    """Forget every kept launch (`selgate.kernels.reload_settings()` calls this)."""
    _kernels.clear()
    _backends.clear()
