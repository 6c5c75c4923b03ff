"""Random inputs of a selection-attention call: `random_qkv` is the one place that samples q,
k and v for a shape, and `Inputs` holds one input set (conformance cases and benchmarks
describe their inputs with it, so both describe inputs one way). Ranges are each caller's own
subject and stay with the caller."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Union

import torch

LOG2E = 1.4426950408889634
FP32_EXP_OVERFLOW = 88.72  # log(finfo(float32).max): exp of a larger score is inf


@dataclass
class Inputs:
    """Tensors of one case or benchmark input set. Varlen: packed q [1,T_q,G,h,Dk], k/v
    [1,G,T_kv,D], local ranges."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    ranges: torch.Tensor
    scale: Optional[float]
    cu_seqlens_q: Optional[torch.Tensor] = None
    cu_seqlens_k: Optional[torch.Tensor] = None

    def nbytes(self) -> int:
        """Bytes of q, k, v and ranges: what an input set adds to the working set of a timing loop."""
        return sum(t.numel() * t.element_size() for t in (self.q, self.k, self.v, self.ranges))


def random_qkv(
    B: int,
    S: int,
    G: int,
    h: int,
    Dk: int,
    Dv: int,
    S_kv: int,
    *,
    dtype: torch.dtype,
    generator: Union[torch.Generator, int],
    sample_dtype: torch.dtype,
    device=None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Standard normal q [B,S,G,h,Dk], k [B,G,S_kv,Dk], v [B,G,S_kv,Dv] (SPEC.md layout).

    Drawn from `generator` (an int seeds a fresh CPU generator) on the generator's device, in
    `sample_dtype`, in the order q, k, v; each then cast to `dtype` and moved to `device` (the
    generator's device when None). The sampling precision is explicit because it names the
    stream: the conformance cases and unit tests sample fp64 on the CPU and cast, so a seed
    names the same inputs on every machine; the benchmarks sample fp32 on the device, where
    large shapes are cheap to draw. A caller that draws its ranges from the same generator
    draws them after q, k, v."""
    if isinstance(generator, int):
        generator = torch.Generator().manual_seed(generator)
    device = generator.device if device is None else device

    def randn(*shape):
        x = torch.randn(*shape, generator=generator, device=generator.device, dtype=sample_dtype)
        return x.to(device, dtype)

    return randn(B, S, G, h, Dk), randn(B, G, S_kv, Dk), randn(B, G, S_kv, Dv)


def large_logit_scale(Dk: int) -> float:
    """The softmax scale of the large-logit inputs: about 1/sqrt(Dk), chosen so that scale * log2(e)
    is a power of two. With integer-valued q and k every score is then exact in base 2 (the
    exp2 domain of FlashAttention-style kernels) and one rounding from exact in base e, which
    keeps a correct fp32 kernel's lse within SPEC.md's 1e-5 at |lse| ~ 100, where fp32's own
    spacing is 7.6e-6 (measured there: 8.8e-6 for the Triton kernel, 6.6e-6 for sdpa; at scale
    1/4 instead the Triton kernel's lse was 1.25e-5 off)."""
    return 2.0 ** -round(math.log2(math.sqrt(Dk))) / LOG2E


def large_logit_qkv(B, S, G, h, Dk, Dv, S_kv, *, dtype, generator: torch.Generator, scale: float):
    """q [B,S,G,h,Dk], k [B,G,S_kv,Dk] whose scores `scale * q.k` sit around +86 on head 0 of
    group 0 (-120 on every fourth query row): a softmax that does not subtract the row's max
    overflows fp32's exp past 88.72, and one whose running max starts at 0 underflows it below
    -104 (0 / 0). The other heads' q are scaled by -2^-4 to -2^-12 (scores
    from -5 to 0), so heads of one group differ by orders of magnitude and a max shared across
    them underflows the small ones (exp(-5 - 92) is a denormal of ~2 significant digits).
    q and k are small integers times powers of two (a common first component carries the
    size): exact in fp16 and bf16, and every dot product is exact in fp32. One large head per
    row keeps a correct fp32 kernel within SPEC.md's mean bound on lse (1e-6, where fp32's
    spacing at |lse| ~ 90 is 7.6e-6: rounding alone costs ~1.9e-6 on average there; with a
    large head in every group the Triton kernel's lse measured 1.2e-6 mean). v is standard
    normal. Drawn from `generator` in the order k, q, row scales, v."""
    k = torch.randint(-3, 4, (B, G, S_kv, Dk), generator=generator, dtype=torch.float64)
    q = torch.randint(-3, 4, (B, S, G, h, Dk), generator=generator, dtype=torch.float64)
    c = 16.0
    k[..., 0] = c
    negative = torch.arange(B * S).reshape(B, S, 1, 1) % 4 == 3
    q[..., 0] = torch.where(negative, round(120.0 / (scale * c)), round(86.0 / (scale * c)))
    exponent = torch.tensor([4.0, 8.0, 12.0])[torch.randint(0, 3, (B, S, G, h, 1), generator=generator)]
    exponent[:, :, 0, 0] = 0.0
    sign = torch.where(negative[..., None], -1.0, 1.0)
    q = q * torch.where(exponent == 0, sign, -1.0) * 2.0**-exponent
    v = torch.randn(B, G, S_kv, Dv, generator=generator, dtype=torch.float64)
    return q.to(dtype), k.to(dtype), v.to(dtype)
