"""Runtime loop bounds under TRITON_INTERPRET=1 on numpy >= 2.4.

The interpreter holds every scalar as a 1-element array, and numpy 2.4 refuses `int()` of an
array with ndim > 0, so `tl.range(0, n)` with a loaded or reduced `n` raises there
(triton-lang/triton#9171). Triton fixed the interpreter's `tensor.__index__` upstream
(triton-lang/triton#9172: squeeze, then convert); the pinned triton 3.6.0 predates it. With
this fix applied the kernels write each loop once, as `tl.range`, for the compiler and the
interpreter alike, so the interpreter runs the loops the GPU compiles. Compiled kernels never
see it: the interpreter alone calls `_patch_lang_tensor`. Drop the module when the pinned triton
carries the fix (tests/kernels/test_interpreter_scalars.py says so).
"""

from __future__ import annotations

from triton.runtime import interpreter


def _index(self) -> int:
    return int(self.handle.data.squeeze())


def apply() -> None:
    """Give the interpreter's tensors upstream's `__index__` (idempotent)."""
    patch = getattr(interpreter, "_patch_lang_tensor", None)
    if patch is None or getattr(patch, "squeezes_scalars", False):
        return

    def patched(tensor, scope):
        patch(tensor, scope)
        scope.set_attr(tensor, "__index__", _index)

    patched.squeezes_scalars = True
    patched.original = patch
    interpreter._patch_lang_tensor = patched
