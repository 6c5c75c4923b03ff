"""The methods a benchmark compares, each built from the same inputs the tests use.

Every method turns an `Inputs` set (normalised ranges included) into a zero-argument call
that returns `o` [B, S, G, h, Dv]; whatever a method derives from the ranges (mask,
gather indices) is computed inside the call, so it is timed. Layout changes a dense
model would not pay for (head-major copies for the dense causal run) happen outside it.
A method says when it does not apply (`skip_reason`). Dense causal attention computes
other attention than selection attention: it is only a yardstick. Whether a method computes
the right result is the conformance matrix's question, not the benchmark's.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import re
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from selgate import env_vars
from selgate.kernels.sdpa import selection_attention_sdpa
from selgate.reference import expand_ranges, selected_lengths, selection_attention_ref

from . import outside
from .inputs import Inputs, Problem

# Dense baselines above this many bytes of mask or gathered K/V are skipped, not run to OOM.
DENSE_BUDGET_BYTES = env_vars.get("SELGATE_BENCH_DENSE_BUDGET_MB") << 20


@dataclass(frozen=True)
class Method:
    name: str
    ours: bool  # an implementation under test (regressions block), not a reference point
    build: Callable[[Problem, Inputs], Callable[[], torch.Tensor]]
    skip_reason: Callable[[Problem, torch.device], str | None] = lambda p, dev: None
    graphable: bool = False  # no host synchronisation: decode rows also get CUDA-graph timing
    block_size: int | None = None  # selects whole blocks of this many keys: rows get block-aligned ranges


def _rows(t: torch.Tensor, p: Problem) -> torch.Tensor:
    return t.reshape(p.B, p.S, p.G, p.h, -1)


def _build_sdpa(p, x):
    return lambda: selection_attention_sdpa(x.q, x.k, x.v, x.ranges, scale=x.scale, normalized=True)


def _build_reference(p, x):
    return lambda: selection_attention_ref(x.q, x.k, x.v, x.ranges, scale=x.scale)


def _masked_bytes(p: Problem) -> int:
    return p.B * p.G * p.S * (p.h if p.S > 1 else 1) * p.S_kv * 4


def _build_masked(p, x):
    """Dense SDPA over all S_kv keys with a boolean mask of the selection (queries: (s, head) pairs)."""

    def call():
        key = torch.arange(p.S_kv, device=x.q.device)
        r = x.ranges.to(torch.int64)
        mask = ((key >= r[..., 0:1]) & (key < r[..., 1:2])).any(3)  # [B, S, G, S_kv]
        mask = mask.permute(0, 2, 1, 3)[:, :, :, None, :].expand(p.B, p.G, p.S, p.h, p.S_kv)
        mask = mask.reshape(p.B, p.G, p.S * p.h, p.S_kv) if p.S > 1 else mask[:, :, 0, :1]
        q = x.q.permute(0, 2, 1, 3, 4).reshape(p.B, p.G, p.S * p.h, p.D)
        o = F.scaled_dot_product_attention(q, x.k, x.v, attn_mask=mask, scale=x.scale)
        return o.reshape(p.B, p.G, p.S, p.h, p.Dv).permute(0, 2, 1, 3, 4)

    return call


def _gather_bytes(p: Problem) -> int:
    return p.B * p.S * p.G * p.L * ((p.D + p.Dv) * torch.finfo(getattr(torch, p.dtype)).bits // 8 + 16)


def _build_gather(p, x):
    """The plain approach: gather every row's keys padded to the longest row, one masked SDPA."""

    def call():
        L_max = max(int(selected_lengths(x.ranges).max()), 1)
        idx, valid = expand_ranges(x.ranges, L_max)  # [B, S, G, L_max]
        bi = torch.arange(p.B, device=x.q.device)[:, None, None, None]
        gi = torch.arange(p.G, device=x.q.device)[None, None, :, None]
        k_sel, v_sel = x.k[bi, gi, idx], x.v[bi, gi, idx]  # [B, S, G, L_max, D]
        rows = p.B * p.S * p.G
        o = F.scaled_dot_product_attention(
            x.q.reshape(rows, 1, p.h, p.D),
            k_sel.reshape(rows, 1, L_max, p.D),
            v_sel.reshape(rows, 1, L_max, p.Dv),
            attn_mask=valid.reshape(rows, 1, 1, L_max),
            scale=x.scale,
        )
        return _rows(o, p)

    return call


def _build_dense_causal(p, x):
    """Dense causal attention over every key (FlashAttention through SDPA); K/V expanded to the query heads."""
    q = x.q.permute(0, 2, 3, 1, 4).reshape(p.B, p.G * p.h, p.S, p.D).contiguous()
    k = x.k.repeat_interleave(p.h, dim=1)
    v = x.v.repeat_interleave(p.h, dim=1)

    def call():
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=x.scale)
        return o.reshape(p.B, p.G, p.h, p.S, p.Dv).permute(0, 3, 1, 2, 4)

    return call


def block_indices(ranges: torch.Tensor, l_sel: int, n_blocks: int, S_kv: int) -> torch.Tensor:
    """Selected block ids [B, S, G, n_blocks] of block-aligned ranges, ascending; absent
    blocks get an id past the sequence (never eligible for any query)."""
    nb = -(-S_kv // l_sel)
    first = torch.arange(nb, device=ranges.device) * l_sel
    r = ranges.to(torch.int64)[..., None, :]  # [B, S, G, n, 1, 2]
    hit = ((first >= r[..., 0]) & (first < r[..., 1])).any(3)  # [B, S, G, nb]
    ids = torch.where(hit, torch.arange(nb, device=ranges.device), nb + 1)
    return ids.sort(-1).values[..., :n_blocks]


def _build_fla(p, x):
    """fla-core's `parallel_nsa`, selection branch only (no compression or window gates)."""
    from fla.ops.nsa import parallel_nsa

    q = x.q.reshape(p.B, p.S, p.G * p.h, p.D)
    k = x.k.transpose(1, 2).contiguous()
    v = x.v.transpose(1, 2).contiguous()
    idx = block_indices(x.ranges, p.l_sel, p.n_blocks, p.S_kv)
    return lambda: _rows(parallel_nsa(q, k, v, block_indices=idx, block_counts=p.n_blocks, block_size=p.l_sel, scale=x.scale), p)


def triton_config(p: Problem, device: torch.device) -> dict:
    """The launch parameters the Triton forward picks for `p` on `device` (env, tuned file or configs/)."""
    from selgate.kernels.triton import tuning
    from selgate.kernels.triton.fwd import launch_config

    from .tune import range_slots

    kind = tuning.kind_of(device, p.S)
    dtype = getattr(torch, p.dtype)
    return launch_config(p.D, p.Dv, dtype.itemsize, kind, dtype=dtype, S_kv=p.S_kv, n=range_slots(p))


def _build_triton(p, x):
    """The strict Triton entry on normalised ranges, as the dispatcher calls it."""
    from selgate.kernels.triton import selection_attention_triton

    return lambda: selection_attention_triton(x.q, x.k, x.v, x.ranges, scale=x.scale, normalized=True)


def _build_kv_outer(p, x):
    """The KV-outer forward on its own (kernels/triton/kv_outer.py), whatever the profile routes,
    on normalised ranges as `triton` takes them."""
    from selgate.kernels.triton import selection_attention_kernel

    return lambda: selection_attention_kernel("kv_outer", x.q, x.k, x.v, x.ranges, scale=x.scale, normalized=True)


def _build_pairs(p, x):
    """The Gluon pairs forward on its own (kernels/triton/pairs.py): the row kernel the sm90
    class serves prefill with where the KV-outer route does not take it."""
    from selgate.kernels.triton import selection_attention_kernel

    return lambda: selection_attention_kernel("pairs", x.q, x.k, x.v, x.ranges, scale=x.scale, normalized=True)


def _pairs_skip(p, dev) -> str | None:
    """Why the pairs kernel cannot take `p` on `dev`: its own predicate, on a two-token call of
    the problem's heads, head dims and dtype."""
    why = _needs(kind="prefill", cuda=True)(p, dev)
    if why:
        return why
    from selgate.kernels.triton import forward_kernel_unsupported

    dtype = getattr(torch, p.dtype)
    q = torch.empty(1, 2, p.G, p.h, p.D, dtype=dtype, device=dev)
    k, v = (torch.empty(1, p.G, 2, d, dtype=dtype, device=dev) for d in (p.D, p.Dv))
    return forward_kernel_unsupported("pairs", q, k, v)


def _build_triton_launch(p, x, config):
    """The raw forward with explicit launch parameters (variants are compared with each other)."""
    from selgate.kernels.triton.fwd import triton_forward

    return lambda: triton_forward(x.q, x.k, x.v, x.ranges, scale=x.scale, config=config)[0]


def _build_cuda(p, x):
    from selgate.kernels.cuda import selection_attention_cuda

    return lambda: selection_attention_cuda(x.q, x.k, x.v, x.ranges, scale=x.scale, normalized=True)


def _build_auto(p, x):
    from selgate.kernels import selection_attention

    return lambda: selection_attention(x.q, x.k, x.v, x.ranges, scale=x.scale)


def _needs(kind=None, cuda=False, budget=None, triton=False, module=None, gqa16=False):
    def reason(p: Problem, dev: torch.device):
        if kind and p.kind != kind:
            return f"{kind} only"
        if cuda and dev.type != "cuda":
            return "needs a CUDA device"
        if triton and dev.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            return "needs a CUDA device or TRITON_INTERPRET=1"
        if budget and budget(p) > DENSE_BUDGET_BYTES:
            return f"needs ~{budget(p) / 2**30:.1f} GiB > SELGATE_BENCH_DENSE_BUDGET_MB={DENSE_BUDGET_BYTES >> 20}"
        if gqa16 and (p.h < 16 or p.h & (p.h - 1)):
            return f"h={p.h}: parallel_nsa needs a power of two >= 16 heads per group"
        if module and importlib.util.find_spec(module.split(".")[0]) is None:
            return f"{module} not installed"
        return None

    return reason


METHODS = {
    m.name: m
    for m in (
        Method("sdpa", True, _build_sdpa),
        Method("triton", True, _build_triton, _needs(triton=True), graphable=True),
        Method("cuda", True, _build_cuda, _needs(kind="decode", cuda=True), graphable=True),
        Method("triton_kv_outer", True, _build_kv_outer, _needs(kind="prefill", triton=True)),
        Method("triton_pairs", True, _build_pairs, _pairs_skip),
        Method("auto", True, _build_auto, graphable=True),
        Method("masked_sdpa", False, _build_masked, _needs(budget=_masked_bytes)),
        Method("gather_sdpa", False, _build_gather, _needs(budget=_gather_bytes)),
        Method("dense_causal", False, _build_dense_causal, _needs(kind="prefill")),
        Method("fla_nsa", False, _build_fla, _needs(kind="prefill", cuda=True, module="fla.ops.nsa", gqa16=True)),
        Method("reference", False, _build_reference),
    )
}


VARIANT = re.compile(r"triton@(\d+)x(\d+)x(\d+)$")


def variant_config(name: str) -> dict | None:
    """'triton@64x4x3' -> {'BLOCK_L': 64, 'num_warps': 4, 'num_stages': 3}; None for other names."""
    m = VARIANT.match(name)
    return m and {"BLOCK_L": int(m[1]), "num_warps": int(m[2]), "num_stages": int(m[3])}


def get_method(name: str) -> Method:
    """A method by name: one of METHODS, a Triton launch variant `triton@<BLOCK_L>x<warps>x<stages>`,
    or an outside kernel `package.module:callable` (outside.py)."""
    if name in METHODS:
        return METHODS[name]
    if outside.is_outside(name):
        return outside.get(name)
    cfg = variant_config(name)
    if cfg is None:
        raise ValueError(
            f"backend: expected one of {sorted(METHODS)}, triton@<BLOCK_L>x<warps>x<stages> "
            f"or package.module:callable, got {name!r}"
        )
    return Method(name, True, functools.partial(_build_triton_launch, config=cfg), METHODS["triton"].skip_reason, graphable=True)


def default_methods(device: torch.device) -> list[str]:
    """What a plain run compares: everything on a GPU; the torch paths and the reference on CPU."""
    if device.type == "cuda":
        return ["sdpa", "triton", "cuda", "masked_sdpa", "gather_sdpa", "dense_causal", "fla_nsa"]
    return ["sdpa", "masked_sdpa", "gather_sdpa", "reference"]
