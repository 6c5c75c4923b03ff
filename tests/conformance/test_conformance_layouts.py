"""The dtype family's batches 2^31 elements apart (`far_apart`): the layout a long context's
int32 offsets overflow at, built on the meta device (no memory) to check its strides, offsets
and the cases it applies to; the GPU lanes run it on real buffers."""

import dataclasses
import re

import pytest
import torch

from selgate.conformance.cases import select
from selgate.conformance.families.dtype import FAR, far_applies, far_apart
from selgate.conformance.registry import REGISTRY


def test_batches_lie_two_to_the_31_elements_apart_and_k_and_v_do_not_overlap():
    k, v = torch.empty(2, 3, 40, 16, device="meta"), torch.empty(2, 3, 40, 8, device="meta")
    fk, fv = far_apart(k.half(), v.half())
    assert FAR == 2**31 and fk.stride() == (FAR, 640, 16, 1) and fv.stride() == (FAR, 320, 8, 1)
    assert (fk.storage_offset(), fv.storage_offset()) == (0, 1920)  # v's batch after k's
    assert fk.untyped_storage().nbytes() == 2 * (FAR + 1920 + 960)  # one batch past 2^31 elements: 4 GiB
    assert fk.shape == k.shape and fv.shape == v.shape


def test_only_gpu_cases_of_two_batches_in_two_bytes_get_the_four_gib_buffer():
    sdpa = REGISTRY["sdpa"]
    case = next(c for c in select("small") if c.shape.B >= 2 and c.pattern == "mixed" and c.dtype == torch.float16)
    assert far_applies(sdpa, case, "cuda") and not far_applies(sdpa, case, "cpu")
    assert not far_applies(sdpa, dataclasses.replace(case, dtype=torch.float32), "cuda")  # 8 GiB
    assert not far_applies(dataclasses.replace(sdpa, layouts=("contiguous",)), case, "cuda")
    four = next(c for c in select("small") if c.shape.B == 4 and c.pattern == "mixed" and c.dtype == torch.float16)
    assert not far_applies(sdpa, four, "cuda")  # 12 GiB


@pytest.mark.parametrize(("bad_name", "caught"), [("int32-batch-offsets", "o"), ("int32-batch-offsets-in-backward", "d[qkv]")])
def test_the_far_case_judges_a_right_kernel_right_and_catches_wrapped_offsets(monkeypatch, bad_name, caught):
    """The GPU-only case run on the CPU with batches 2^16 elements apart (the known-bads wrap their
    offsets at the same FAR): selgate's SDPA passes, forward and backward; offsets computed modulo
    FAR fail, in the forward (o) or only in the backward (a gradient)."""
    from selgate.conformance.badimpls import BAD_IMPLS
    from selgate.conformance.compare import ConformanceFailure
    from selgate.conformance.families import FAMILIES, dtype

    monkeypatch.setattr(dtype, "FAR", 1 << 16)
    monkeypatch.setattr(dtype, "far_applies", lambda impl, case, device: True)
    case = next(c for c in select("tiny") if c.shape.B >= 2 and c.pattern == "mixed" and c.dtype == torch.float32)
    FAMILIES["dtype"].check(REGISTRY["sdpa"], case, "cpu")
    bad = next(b for b in BAD_IMPLS if b.impl.name == bad_name)
    monkeypatch.setattr(dtype, "far_applies", lambda impl, case, device: False)
    FAMILIES["dtype"].check(bad.impl, case, "cpu")  # no tensor of the other layouts spans FAR elements
    monkeypatch.setattr(dtype, "far_applies", lambda impl, case, device: True)
    with pytest.raises(ConformanceFailure, match=r"\[" + re.escape(case.id) + rf"\] {caught}: "):
        FAMILIES["dtype"].check(bad.impl, case, "cpu")
