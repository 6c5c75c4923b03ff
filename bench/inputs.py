"""Benchmark inputs: decode and prefill problems with NSA-style ranges.

Ranges always come from `selgate.reference.build_ranges` on random block scores, so every
benchmark row has block 0 and the local blocks forced, exactly as a model would produce
them. The distributions change the block size, i.e. how the same `L` is cut into ranges:
`few` long ranges, `many` short ones, and `mixed` rows that mix both layouts and lengths
(so the packed-SDPA buckets and the kernel's tile loops see ragged rows).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from selgate.conformance.inputs import Inputs, random_qkv
from selgate.reference import build_ranges, selected_lengths

DISTS = ("few", "many", "mixed")
PIECES = {"few": 4, "many": 32}  # target number of blocks that make up L


@dataclass(frozen=True)
class Problem:
    """One benchmark configuration (sizes only; `make_inputs` turns it into tensors)."""

    kind: str  # "decode" or "prefill"
    B: int
    S: int
    G: int
    h: int
    D: int
    Dv: int
    S_kv: int
    L: int  # nominal selected length per row
    dist: str
    dtype: str
    l_sel: int = 0  # prefill: selection block size
    n_blocks: int = 0  # prefill: selected blocks per row
    kv_layout: str = "separate"  # how K and V are stored (`with_kv_layout`)

    @property
    def key(self) -> str:
        """Stable one-line name: the join key of result tables and baselines."""
        if self.kind == "decode":
            return (
                f"decode N={self.B} G={self.G} h={self.h} D={self.D} Dv={self.Dv} L={self.L} "
                f"S_kv={self.S_kv} {self.dist} {self.dtype}"
            )
        kv = "" if self.kv_layout == "separate" else f" kv={self.kv_layout}"
        return (
            f"prefill B={self.B} T={self.S} G={self.G} h={self.h} D={self.D} Dv={self.Dv} "
            f"blocks={self.n_blocks}x{self.l_sel} {self.dtype}{kv}"
        )


def block_size_for(L: int, pieces: int) -> int:
    """Block size that cuts `L` into at most `pieces` equal blocks (largest count that divides L)."""
    for p in range(min(pieces, L), 0, -1):
        if L % p == 0:
            return L // p
    return L


def default_S_kv(L: int) -> int:
    """Decode context: four times the selection, so most keys are not selected."""
    return max(4 * L, 64)


def decode_problem(
    N: int, H: int, D: int, Dv: int, L: int, dist: str, dtype: str, *, G: int = 1, S_kv: int | None = None
) -> Problem:
    if dist not in DISTS:
        raise ValueError(f"dist: expected one of {DISTS}, got {dist!r}")
    if L < 1:
        raise ValueError(f"L: expected >= 1, got {L}")
    S_kv = S_kv or default_S_kv(L)
    if S_kv < L:
        raise ValueError(f"S_kv: {S_kv} is smaller than L={L}; a row cannot select more keys than exist")
    return Problem("decode", N, 1, G, H, D, Dv, S_kv, L, dist, dtype)


def prefill_problem(
    T: int, heads: int, groups: int, D: int, Dv: int, l_sel: int, n_blocks: int, dtype: str, *, B: int = 1
) -> Problem:
    if heads % groups:
        raise ValueError(f"heads: {heads} is not a multiple of groups={groups}")
    return Problem(
        "prefill", B, T, groups, heads // groups, D, Dv, T, l_sel * n_blocks, "random", dtype, l_sel=l_sel, n_blocks=n_blocks
    )


def _ranges(p: Problem, l_sel: int, n: int, gen: torch.Generator, device) -> torch.Tensor:
    nb = -(-p.S_kv // l_sel)
    scores = torch.rand(p.B, p.S, p.G, nb, generator=gen, device=device)  # one head per group: Eq. 10 sum is trivial
    return build_ranges(scores, G=p.G, l_sel=l_sel, n=n, S_kv=p.S_kv)


def _pad_n(r: torch.Tensor, n: int) -> torch.Tensor:
    return torch.nn.functional.pad(r, (0, 0, 0, n - r.shape[3]))


def with_block_ranges(p: Problem, x: Inputs, block_size: int, *, seed: int) -> Inputs:
    """`x` with ranges rebuilt by NSA's builder at `block_size` (as many blocks as cover the
    nominal L): the selection a kernel that selects whole blocks of that size can take."""
    gen = torch.Generator(device=x.q.device).manual_seed(seed)
    return replace(x, ranges=_ranges(p, block_size, max(-(-p.L // block_size), 1), gen, x.q.device))


def make_ranges(p: Problem, gen: torch.Generator, device) -> torch.Tensor:
    """Normalised int32 ranges [B, S, G, n, 2] of problem `p`."""
    if p.kind == "prefill":
        return _ranges(p, p.l_sel, p.n_blocks, gen, device)
    if p.dist != "mixed":
        l_sel = block_size_for(p.L, PIECES[p.dist])
        return _ranges(p, l_sel, p.L // l_sel, gen, device)
    layouts = [make_ranges(replace(p, dist=d), gen, device) for d in ("few", "many")]
    half = max(p.L // 2, 1)
    layouts.append(make_ranges(replace(p, dist="many", L=half), gen, device))
    n = max(r.shape[3] for r in layouts)
    stacked = torch.stack([_pad_n(r, n) for r in layouts])
    pick = torch.randint(0, len(layouts), (p.B, p.S, p.G), generator=gen, device=device)
    pick.view(-1)[0] = 0  # one full-length row, so the max L is the nominal L
    return torch.gather(stacked, 0, pick[None, ..., None, None].expand(1, *stacked.shape[1:]))[0]


def make_inputs(p: Problem, *, seed: int, device) -> Inputs:
    """Fresh random q, k, v and normalised ranges (what a kernel receives) for `p`: one rotating input set."""
    dtype = getattr(torch, p.dtype)
    gen = torch.Generator(device=device).manual_seed(seed)
    q, k, v = random_qkv(p.B, p.S, p.G, p.h, p.D, p.Dv, p.S_kv, dtype=dtype, generator=gen, sample_dtype=torch.float32)
    return with_kv_layout(Inputs(q, k, v, make_ranges(p, gen, device), scale=p.D**-0.5), p.kv_layout)


KV_LAYOUTS = ("separate", "group", "key")


def with_kv_layout(x: Inputs, layout: str) -> Inputs:
    """The same values with K and V stored as `layout`, still passed as k, v views of the SPEC
    shapes: "separate" (as allocated), "group" (one [B, G, 2, S_kv, D] buffer: each group's K
    then its V), "key" (one [B, G, S_kv, 2, D] buffer: each key's K and V rows adjacent).
    Why: on the H100 the prefill forward's speed depends on where V sits relative to K
    (docs/design/triton-forward.md)."""
    if layout == "separate":
        return x
    if layout not in KV_LAYOUTS:
        raise ValueError(f"layout: expected one of {KV_LAYOUTS}, got {layout!r}")
    if x.k.shape != x.v.shape:
        raise ValueError(f"layout {layout!r}: k {tuple(x.k.shape)} and v {tuple(x.v.shape)} must have one shape")
    dim = 2 if layout == "group" else 3
    kv = torch.stack((x.k, x.v), dim)
    return replace(x, k=kv.select(dim, 0), v=kv.select(dim, 1))


def selected_key_count(ranges: torch.Tensor) -> int:
    """Total selected keys over all rows (each row reads `L` keys of K and of V)."""
    return int(selected_lengths(ranges).sum())
