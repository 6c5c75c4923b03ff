"""Every input-validation error names the argument and what was expected."""

import os

import pytest
import torch

from selgate.kernels import selection_attention, selection_attention_varlen
from selgate.kernels.policy import dispatch_policy
from selgate.reference import check_inputs, normalize_ranges, selection_attention_ref
from selgate.kernels.sdpa import selection_attention_sdpa
from tests.helpers import clean_dispatcher, random_inputs  # noqa: F401 (fixture)

ENTRY_POINTS = [selection_attention_ref, selection_attention_sdpa, selection_attention]


def case(**change):
    q, k, v, r = random_inputs()
    args = dict(q=q, k=k, v=v, ranges=r)
    args.update(change)
    return args


q0, k0, v0, r0 = random_inputs()
BAD = [
    (dict(q=q0[0]), ValueError, r"q: expected a 5-D tensor \[B, S, G, h, Dk\], got shape \(5, 2, 3, 8\)"),
    (dict(k=k0[0]), ValueError, r"k: expected a 4-D tensor \[B, G, S_kv, Dk\], got shape \(2, 23, 8\)"),
    (dict(v=v0[..., None]), ValueError, r"v: expected a 4-D tensor \[B, G, S_kv, Dv\]"),
    (dict(ranges=r0[..., 0]), ValueError, r"ranges: expected a 5-D tensor \[B, S, G, n, 2\]"),
    (dict(q=[1.0]), TypeError, r"q: expected a torch.Tensor, got list"),
    (dict(q=q0.long(), k=k0.long(), v=v0.long()), TypeError, r"q: expected one of fp16, bf16, fp32, fp64, got torch.int64"),
    (dict(k=k0.float()), TypeError, r"k: dtype torch.float32 differs from q's torch.float64"),
    (dict(v=v0.half()), TypeError, r"v: dtype torch.float16 differs from q's torch.float64"),
    (dict(ranges=r0.float()), TypeError, r"ranges: expected int32 or int64, got torch.float32"),
    (dict(ranges=r0.to(torch.int16)), TypeError, r"ranges: expected int32 or int64, got torch.int16"),
    (dict(ranges=r0.to("meta")), ValueError, r"ranges: a meta tensor \(2, 5, 2, 4, 2\) holds no data; expected a CPU"),
    (dict(k=k0[:1]), ValueError, r"k: expected \[B=2, G=2, S_kv, Dk\] to match q \(2, 5, 2, 3, 8\), got \(1, 2, 23, 8\)"),
    (dict(k=k0[..., :4]), ValueError, r"k: head dim 4 differs from q's Dk=8"),
    (dict(v=v0[:, :, :7]), ValueError, r"v: expected \[B=2, G=2, S_kv=23, Dv\] to match k \(2, 2, 23, 8\), got \(2, 2, 7, 6\)"),
    (
        dict(ranges=torch.zeros(2, 5, 2, 4, 3, dtype=torch.int64)),
        ValueError,
        r"ranges: trailing dimension must be 2 \(start, end\), got shape \(2, 5, 2, 4, 3\)",
    ),
    (dict(ranges=r0[:, :4]), ValueError, r"ranges: expected \[B=2, S=5, G=2, n, 2\] to match q, got \(2, 4, 2, 4, 2\)"),
    (dict(scale=float("nan")), ValueError, r"scale: expected a finite float > 0, got nan"),
    (dict(scale=float("inf")), ValueError, r"scale: expected a finite float > 0, got inf"),
    (dict(scale=float("-inf")), ValueError, r"scale: expected a finite float > 0, got -inf"),
    (dict(scale=-1.0), ValueError, r"scale: expected a finite float > 0, got -1.0"),
    (dict(scale=0.0), ValueError, r"scale: expected a finite float > 0, got 0.0"),
    (dict(scale=0), ValueError, r"scale: expected a finite float > 0, got 0"),
    (dict(scale=torch.tensor(0.5)), TypeError, r"scale: expected a Python float, got Tensor"),
    (dict(positions=torch.zeros(2, 4, dtype=torch.int64)), ValueError, r"positions: expected shape \[B=2, S=5\], got \(2, 4\)"),
    (dict(positions=torch.zeros(2, 5)), TypeError, r"positions: expected int32 or int64, got torch.float32"),
    (dict(q=q0.to("meta")), ValueError, r"q: a meta tensor \(2, 5, 2, 3, 8\) holds no data; expected a CPU"),
    (
        dict(positions=torch.zeros(2, 5, dtype=torch.int64, device="meta")),
        ValueError,
        r"positions: a meta tensor \(2, 5\) holds no data",
    ),
    (
        dict(positions=torch.full((2, 5), 2**63 - 1)),
        ValueError,
        r"positions: max 9223372036854775807 = 2\^63 - 1 overflows t \+ 1 in int64",
    ),
]


@pytest.mark.parametrize("change, exc, match", BAD, ids=[m.split(":")[0] + str(i) for i, (_, _, m) in enumerate(BAD)])
@pytest.mark.parametrize("entry", ENTRY_POINTS, ids=lambda f: f.__name__)
def test_bad_input_is_refused_with_a_clear_message(entry, change, exc, match):
    with pytest.raises(exc, match=match):
        entry(**case(**change))


def test_dims_are_read_from_valid_inputs():
    d = check_inputs(q0, k0, v0, r0)
    assert (d.B, d.S, d.G, d.h, d.Dk, d.S_kv, d.Dv, d.n) == (2, 5, 2, 3, 8, 23, 6, 4)


@pytest.mark.usefixtures("clean_dispatcher")
@pytest.mark.parametrize("scale", [-1.0, 0.0, float("nan"), float("inf")])
def test_a_bad_scale_is_refused_by_the_varlen_entry_point_and_on_a_repeated_signature(scale):
    """SPEC.md's bad input holds on the packed entry point, and a call signature served before
    (a kept call is keyed by scale) never lets a bad scale through on its repeat."""
    q, k, v, r = random_inputs(B=1)
    cu = torch.tensor([0, 5], dtype=torch.int32)
    cu_k = torch.tensor([0, 23], dtype=torch.int32)
    with pytest.raises(ValueError, match="scale: expected a finite float > 0"):
        selection_attention_varlen(q, k, v, r, cu, cu_k, scale=scale)
    backends = ["auto", "sdpa", "reference"]
    if torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1":
        backends.append("triton")  # the route whose calls are kept
    device = "cuda" if torch.cuda.is_available() else "cpu"
    q, k, v, r = (t.to(device) for t in random_inputs(B=2, S=1, h=2, Dk=16, Dv=16, S_kv=40, dtype=torch.float32))
    norm = normalize_ranges(r, 40)
    for backend in backends:
        for _ in range(2):  # the second call of a signature replays the first one's decision
            selection_attention(q, k, v, norm, backend=backend, scale=0.5, normalized=True)
        assert backend != "triton" or dispatch_policy().kept, "the Triton call is kept"
        for _ in range(2):
            with pytest.raises(ValueError, match="scale: expected a finite float > 0"):
                selection_attention(q, k, v, norm, backend=backend, scale=scale, normalized=True)
