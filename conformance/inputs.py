"""Random inputs of a selection-attention call: `random_qkv` is the one place that samples q,
k and v for a shape, and `Inputs` holds one input set (conformance cases and benchmarks
describe their inputs with it, so both describe inputs one way). Ranges are each caller's own
subject and stay with the caller."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

import torch


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
