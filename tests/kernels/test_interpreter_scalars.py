"""The interpreter's scalars as loop bounds (kernels/triton/interpreter_scalars.py): the one loop
form the kernels write runs under TRITON_INTERPRET=1, and the fix earns its place only while the
pinned triton lacks it."""

from __future__ import annotations

import os
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from selgate.kernels.triton import interpreter_scalars

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"


@triton.jit
def _sum_below(n_ptr, out_ptr, STEP: tl.constexpr):
    n = tl.sum(tl.load(n_ptr + tl.arange(0, 2)), 0)  # a reduced scalar, as the kernels' range lengths
    total = 0
    for i in tl.range(0, n, STEP):
        total += i
    tl.store(out_ptr, total)


@pytest.mark.skipif(not INTERPRET, reason="a compiled loop needs no fix: this runs under TRITON_INTERPRET=1")
def test_a_loop_bounded_by_a_reduced_scalar_runs_in_the_interpreter():
    out = torch.full((1,), -1, dtype=torch.int32)
    _sum_below[(1,)](torch.tensor([4, 3], dtype=torch.int32), out, STEP=2)
    assert out.item() == 0 + 2 + 4 + 6


def test_the_fix_is_applied_once():
    interpreter_scalars.apply()
    from triton.runtime import interpreter

    patched = interpreter._patch_lang_tensor
    assert patched.squeezes_scalars and not getattr(patched.original, "squeezes_scalars", False)


@pytest.mark.skipif(np.lib.NumpyVersion(np.__version__) < "2.4.0", reason="numpy < 2.4 still converts 1-element arrays")
def test_the_pinned_triton_still_needs_it():
    """Fails once triton's own interpreter squeezes its scalars: then drop interpreter_scalars.py."""
    from triton.runtime import interpreter

    got = {}
    scope = SimpleNamespace(set_attr=lambda obj, name, value: got.__setitem__(name, value))
    interpreter._patch_lang_tensor.original(tl.tensor, scope)
    scalar = SimpleNamespace(handle=SimpleNamespace(data=np.array([7], dtype=np.int32)))
    with pytest.raises(TypeError, match="0-dimensional"):
        got["__index__"](scalar)
    assert interpreter_scalars._index(scalar) == 7
