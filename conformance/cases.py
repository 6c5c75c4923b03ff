"""The conformance cases, declared once, with stable readable ids and a size class.

A case fixes everything an input is made from (mode, shapes, range pattern, dtype,
scale, seed); `make_inputs` builds the tensors from the case alone on a seeded CPU
generator, so a failing id reproduces on any machine: `pytest -m conformance -k <id>`.
Size classes are cumulative: a lane asking for `small` also runs every `tiny` case.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from selgate.reference import build_ranges, pack_sequences

from .inputs import Inputs, large_logit_qkv, large_logit_scale, random_qkv
from .sizes import SIZES

PATTERNS = (
    "empty",
    "padding",
    "single",
    "many_small",
    "mixed",
    "overlapping",
    "adjacent",
    "beyond_t",
    "beyond_skv",
    "heavy_reuse",
    "builder",
    "full",
)
# How q, k, v are drawn: "normal" standard normal; "large_logits" `inputs.large_logit_qkv`
# (scores near +-86 on most rows, O(1) on others), for softmaxes without the row's own max.
VALUES = ("normal", "large_logits")
DTYPE_NAMES = {torch.float64: "fp64", torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


@dataclass(frozen=True, kw_only=True)
class Shape:
    """Sizes of one call (SPEC.md layout). Varlen: `seqlens` holds `(len_q, len_k)` per
    sequence, and B, S, S_kv are those of the packed call (1, sum len_q, sum len_k)."""

    mode: str  # "decode" (S == 1), "prefill" or "varlen"
    B: int
    S: int
    S_kv: int
    G: int
    h: int
    Dk: int
    Dv: int
    n: int
    seqlens: tuple = ()

    @property
    def tag(self) -> str:
        heads = f"G{self.G}h{self.h}-D{self.Dk}x{self.Dv}-n{self.n}"
        if self.mode == "varlen":
            lq = ".".join(str(a) for a, _ in self.seqlens)
            lk = ".".join(str(b) for _, b in self.seqlens)
            return f"varlen-q{lq}-k{lk}-{heads}"
        return f"{self.mode}-B{self.B}S{self.S}Skv{self.S_kv}-{heads}"

    @property
    def elements(self) -> int:
        """Elements of q, k and v: how big a case is, for choosing the smallest that fails."""
        return self.B * self.G * (self.S * self.h * self.Dk + self.S_kv * (self.Dk + self.Dv))


def varlen_shape(seqlens, G, h, Dk, Dv, n) -> Shape:
    return Shape(
        mode="varlen",
        B=1,
        S=sum(a for a, _ in seqlens),
        S_kv=sum(b for _, b in seqlens),
        G=G,
        h=h,
        Dk=Dk,
        Dv=Dv,
        n=n,
        seqlens=tuple(seqlens),
    )


@dataclass(frozen=True, kw_only=True)
class Case:
    """One input of the matrix. `smoke` marks the few cases that slow implementations
    (the Triton interpreter on CPU) run."""

    shape: Shape
    pattern: str
    dtype: torch.dtype
    seed: int
    size: str
    scale: Optional[float] = None
    smoke: bool = False
    block_size: Optional[int] = None  # selections of whole blocks (a block-index kernel's granularity)
    gpu_only: bool = False  # a contention case: many rows reduce into the same keys (determinism)
    values: str = "normal"  # one of VALUES

    @property
    def dtype_name(self) -> str:
        """fp16, bf16, fp32 or fp64: as declarations name it."""
        return DTYPE_NAMES[self.dtype]

    @property
    def id(self) -> str:
        sc = "" if self.scale is None else f"-sc{self.scale:g}"
        bs = "" if self.block_size is None else f"-bs{self.block_size}"
        vals = "" if self.values == "normal" else f"-v{self.values}"
        return f"{self.shape.tag}-{self.pattern}{bs}{sc}{vals}-{self.dtype_name}-s{self.seed}"

    @property
    def mode(self) -> str:
        return self.shape.mode

    @property
    def sets(self) -> tuple:
        """The bug-class case sets this case belongs to (docs/validate.md's table): a report names
        each set of which no case ran, so a declaration that narrows the matrix says what it removed."""
        s = self.shape
        named = {
            "G >= 2": s.G >= 2,
            "heads or groups not a power of two": not (_pow2(s.h) and _pow2(s.G)),
            "head dims not a power of two": not (_pow2(s.Dk) and _pow2(s.Dv)),
            "Dv != Dk": s.Dv != s.Dk,
            "rows of 256+ keys": self.pattern == "full" and s.S_kv >= 2 * 128,
            "large logits": self.values == "large_logits",
        }
        return tuple(name for name, has in named.items() if has)


def _pow2(x: int) -> bool:
    return x & (x - 1) == 0


def _randint(gen, lo, hi, shape):
    """Uniform integers in [lo, hi) elementwise; lo and hi broadcast (int64 tensors or ints)."""
    u = torch.rand(shape, generator=gen, dtype=torch.float64)
    lo = torch.as_tensor(lo, dtype=torch.int64)
    hi = torch.maximum(torch.as_tensor(hi, dtype=torch.int64), lo + 1)
    return lo + (u * (hi - lo)).floor().to(torch.int64)


def block_aligned(ranges: torch.Tensor, block_size: int) -> torch.Tensor:
    """Each non-empty range widened to whole blocks of `block_size` keys: what a kernel that
    selects blocks can express. Empty ranges (end <= start) stay as they are; clamping to
    `t + 1` later leaves the block that holds `t` partial, as NSA's selection does."""
    start, end = ranges[..., 0], ranges[..., 1]
    lo = torch.div(start, block_size, rounding_mode="floor") * block_size
    hi = -torch.div(-end, block_size, rounding_mode="floor") * block_size
    keep = end > start
    return torch.stack([torch.where(keep, lo, start), torch.where(keep, hi, end)], -1)


def raw_ranges(
    pattern: str, B: int, S: int, S_kv: int, G: int, h: int, n: int, gen, block_size: Optional[int] = None
) -> torch.Tensor:
    """Raw (unnormalised) int64 ranges [B, S, G, n, 2] of one range pattern (see PATTERNS),
    made of whole blocks when `block_size` is given."""
    if block_size is not None:
        if pattern == "builder":  # NSA's producer at the kernel's own block size
            scores = torch.rand(B, S, G * h, math.ceil(S_kv / block_size), generator=gen)
            return build_ranges(scores, G=G, l_sel=block_size, n=n, S_kv=S_kv, dtype=torch.int64)
        return block_aligned(raw_ranges(pattern, B, S, S_kv, G, h, n, gen), block_size)
    shp = (B, S, G, n)
    t = (torch.arange(S) + S_kv - S)[None, :, None, None]  # query positions, broadcast over rows
    lim = (t + 1).clamp(min=1, max=S_kv)
    slot = torch.arange(n)
    if pattern == "padding":
        return torch.zeros(*shp, 2, dtype=torch.int64)
    if pattern == "empty":  # non-canonical empty ranges: end <= start
        start = _randint(gen, 0, S_kv + 3, shp)
        return torch.stack([start, start - _randint(gen, 0, 4, shp)], -1)
    if pattern == "single":  # one range in the last slot, padding before it
        a = _randint(gen, 0, lim, shp)
        b = a + 1 + _randint(gen, 0, lim - a, shp)
        keep = slot == n - 1
        return torch.stack([torch.where(keep, a, 0), torch.where(keep, b, 0)], -1)
    if pattern == "many_small":  # unsorted ranges of 1-3 keys
        a = _randint(gen, 0, lim, shp)
        return torch.stack([a, a + _randint(gen, 1, 4, shp)], -1)
    if pattern == "mixed":  # overlaps, padding, inverted, out of bounds; a quarter of rows empty
        r = _randint(gen, -3, S_kv + 4, (*shp, 2))
        empty_row = torch.rand((B, S, G, 1, 1), generator=gen) < 0.25
        return torch.where(empty_row, 0, r)
    if pattern == "overlapping":  # each range overlaps the next by half; the last repeats the first
        a = _randint(gen, 0, lim, (B, S, G, 1))
        w = _randint(gen, 2, 9, (B, S, G, 1))
        start = a + slot * (w // 2)
        r = torch.stack([start, start + w], -1)
        r[..., -1, :] = r[..., 0, :]
        return r
    if pattern == "adjacent":  # touching ranges in shuffled order
        a = _randint(gen, 0, lim, (B, S, G, 1))
        ends = a + torch.cumsum(_randint(gen, 1, 7, shp), -1)
        starts = torch.cat([a, ends[..., :-1]], -1)
        order = torch.argsort(torch.rand(shp, generator=gen), -1)
        return torch.stack([starts.gather(-1, order), ends.gather(-1, order)], -1)
    if pattern == "beyond_t":  # ranges that reach past t, and ones that lie wholly beyond it
        a = _randint(gen, 0, lim, shp)
        over = torch.stack([a, t + 1 + _randint(gen, 1, S_kv + 1, shp)], -1)
        after = torch.stack([torch.broadcast_to(t + 1, shp), torch.broadcast_to(t + 6, shp)], -1)
        return torch.where((slot % 2 == 1)[..., None], after, over)
    if pattern == "beyond_skv":  # negative starts, ends past S_kv, ranges wholly outside
        around = torch.stack([-_randint(gen, 1, 6, shp), S_kv + _randint(gen, 0, 6, shp)], -1)
        past = torch.stack([S_kv + _randint(gen, 1, 4, shp), S_kv + _randint(gen, 5, 9, shp)], -1)
        before = torch.stack([-_randint(gen, 5, 9, shp), -_randint(gen, 1, 4, shp)], -1)
        kind = (slot % 3)[:, None]
        return torch.where(kind == 0, around, torch.where(kind == 1, past, before))
    if pattern == "heavy_reuse":  # every row selects the same few keys
        a, b = S_kv // 2, S_kv // 2 + 4
        base = torch.tensor([[0, 8], [a, b]] + [[0, 0]] * max(n - 2, 0), dtype=torch.int64)[:n]
        return base.expand(B, S, G, n, 2).clone()
    if pattern == "builder":  # NSA's own producer: top-n blocks of random scores
        l_sel = 8 if S_kv <= 256 else 64
        scores = torch.rand(B, S, G * h, math.ceil(S_kv / l_sel), generator=gen)
        return build_ranges(scores, G=G, l_sel=l_sel, n=n, S_kv=S_kv, dtype=torch.int64)
    if pattern == "full":  # the whole causal prefix [0, t + 1): long rows, many tiles
        full = torch.stack([torch.zeros_like(lim), lim], -1).expand(B, S, G, n, 2).clone()
        full[..., 1:, :] = 0
        return full
    raise ValueError(f"pattern: expected one of {PATTERNS}, got {pattern!r}")


def make_inputs(case: Case, device="cpu") -> Inputs:
    """Fresh random inputs of `case` (q, k, v drawn as `case.values` says; the case's range pattern)."""
    s = case.shape
    gen = torch.Generator().manual_seed(case.seed)
    if case.values not in VALUES:
        raise ValueError(f"values: expected one of {VALUES}, got {case.values!r}")

    def qkv(B, S, S_kv):
        if case.values == "large_logits":
            return large_logit_qkv(B, S, s.G, s.h, s.Dk, s.Dv, S_kv, dtype=case.dtype, generator=gen, scale=case.scale)
        return random_qkv(B, S, s.G, s.h, s.Dk, s.Dv, S_kv, dtype=case.dtype, generator=gen, sample_dtype=torch.float64)

    if s.mode == "varlen":
        qs, ks, vs, rs = [], [], [], []
        for len_q, len_k in s.seqlens:
            q, k, v = qkv(1, len_q, len_k)
            qs.append(q[0])
            ks.append(k[0])
            vs.append(v[0])
            rs.append(raw_ranges(case.pattern, 1, len_q, len_k, s.G, s.h, s.n, gen, case.block_size)[0])
        q, cu_q = pack_sequences(qs, 0)
        k, cu_k = pack_sequences(ks, 1)
        v, _ = pack_sequences(vs, 1)
        ranges, _ = pack_sequences(rs, 0)
        out = Inputs(q[None], k[None], v[None], ranges[None], case.scale, cu_q, cu_k)
    else:
        q, k, v = qkv(s.B, s.S, s.S_kv)
        out = Inputs(q, k, v, raw_ranges(case.pattern, s.B, s.S, s.S_kv, s.G, s.h, s.n, gen, case.block_size), case.scale)
    for name in ("q", "k", "v", "ranges", "cu_seqlens_q", "cu_seqlens_k"):
        t = getattr(out, name)
        if t is not None:
            setattr(out, name, t.to(device))
    return out


# --- the declared matrix -------------------------------------------------------------------

_FP = (torch.float32,)
_LOW = (torch.float16, torch.bfloat16)
_ALL = _FP + _LOW

TINY_DECODE = Shape(mode="decode", B=2, S=1, S_kv=37, G=2, h=4, Dk=16, Dv=16, n=4)
TINY_PREFILL = Shape(mode="prefill", B=2, S=9, S_kv=33, G=2, h=4, Dk=16, Dv=8, n=4)
TINY_OTHERS = (
    Shape(mode="decode", B=1, S=1, S_kv=70, G=4, h=8, Dk=64, Dv=64, n=3),
    Shape(mode="decode", B=1, S=1, S_kv=29, G=1, h=16, Dk=8, Dv=8, n=5),
    Shape(mode="decode", B=1, S=1, S_kv=45, G=2, h=1, Dk=192, Dv=128, n=3),
    Shape(mode="prefill", B=1, S=6, S_kv=70, G=1, h=1, Dk=8, Dv=16, n=6),
    Shape(mode="prefill", B=1, S=5, S_kv=50, G=4, h=2, Dk=32, Dv=32, n=3),
    Shape(mode="prefill", B=1, S=4, S_kv=21, G=2, h=16, Dk=8, Dv=8, n=5),
    Shape(mode="prefill", B=1, S=3, S_kv=40, G=2, h=1, Dk=128, Dv=64, n=2),
)
# Group counts and heads per group that are not powers of two (3, 5, 6, 7, 12: a multiple-of
# declaration fits 6 and 12 to themselves), with B = 2 where G is odd (a group index that
# assumes a power of two reaches the next batch); head dims of 4 and 8 with G >= 2, so a kernel
# declaring only small head dims still meets several groups; head dims that are not powers of
# two (72 and 40x24 multiples of 8, 100 of 4).
TINY_AWKWARD = (
    Shape(mode="decode", B=2, S=1, S_kv=41, G=3, h=5, Dk=8, Dv=8, n=3),
    Shape(mode="prefill", B=2, S=5, S_kv=38, G=3, h=6, Dk=8, Dv=8, n=3),
    Shape(mode="decode", B=1, S=1, S_kv=30, G=2, h=3, Dk=4, Dv=4, n=3),
    Shape(mode="prefill", B=1, S=4, S_kv=26, G=2, h=7, Dk=4, Dv=4, n=3),
    Shape(mode="decode", B=2, S=1, S_kv=35, G=3, h=12, Dk=72, Dv=72, n=3),
    Shape(mode="prefill", B=1, S=4, S_kv=33, G=2, h=12, Dk=100, Dv=100, n=3),
    Shape(mode="prefill", B=2, S=3, S_kv=29, G=3, h=2, Dk=40, Dv=24, n=3),
)
# Rows of 256 keys and more (two tiles of 128: a tile loop that stops after its first tiles).
TINY_LONG = (
    Shape(mode="decode", B=1, S=1, S_kv=300, G=2, h=2, Dk=16, Dv=16, n=2),
    Shape(mode="prefill", B=1, S=3, S_kv=290, G=2, h=3, Dk=16, Dv=8, n=2),
)
# Past the sizes a kernel's blocks and fast paths assume, each found passing in a hostile review:
# 80 queries (a query block of 64 whose offset is dropped; a backward row loop that stops after
# 64), S_kv = 128 (causality skipped where S_kv is a multiple of 64; rows of exactly 64 and 128
# keys: a last tile masked by L % 64), 16 ranges a row (a fixed buffer of 4 or 8 ranges); a
# decode row of 1030 keys (a tile loop capped at 512, a split-K path past 1024 whose empty split
# divides 0 by 0) with 32 heads a group (one 16-head block); head dims of 256 (chunks of 128).
TINY_BEYOND = (
    Shape(mode="prefill", B=1, S=80, S_kv=128, G=2, h=3, Dk=16, Dv=16, n=16),
    Shape(mode="decode", B=1, S=1, S_kv=1030, G=2, h=32, Dk=16, Dv=16, n=16),
    Shape(mode="decode", B=1, S=1, S_kv=45, G=2, h=2, Dk=256, Dv=256, n=3),
)
TINY_VARLEN = varlen_shape(((3, 20), (1, 33), (5, 5), (4, 17)), 2, 2, 16, 16, 4)
SMALL = (
    Shape(mode="prefill", B=2, S=64, S_kv=300, G=2, h=8, Dk=64, Dv=64, n=8),
    Shape(mode="decode", B=4, S=1, S_kv=1000, G=4, h=16, Dk=128, Dv=128, n=16),
    Shape(mode="prefill", B=1, S=33, S_kv=517, G=1, h=4, Dk=192, Dv=128, n=8),
)
SMALL_VARLEN = varlen_shape(((17, 200), (1, 77), (40, 40)), 2, 4, 64, 64, 8)
LARGE = (
    Shape(mode="prefill", B=2, S=128, S_kv=2085, G=4, h=16, Dk=128, Dv=128, n=32),
    Shape(mode="prefill", B=1, S=64, S_kv=1500, G=2, h=8, Dk=192, Dv=128, n=16),
    Shape(mode="decode", B=8, S=1, S_kv=2051, G=4, h=16, Dk=128, Dv=128, n=32),
    Shape(mode="decode", B=4, S=1, S_kv=4099, G=1, h=8, Dk=64, Dv=64, n=32),
)
LARGE_VARLEN = varlen_shape(((100, 1000), (1, 2051), (255, 300)), 2, 8, 128, 128, 16)
# Every row of a group selects the same keys, thousands of (row, head) terms per key: a backward
# that accumulates dk, dv with atomics sums them in a run-dependent order, which the tiny shapes
# (tens of terms per key) do not show. In the default (tiny) size class, on a GPU only.
CONTENTION = Shape(mode="prefill", B=1, S=256, S_kv=512, G=2, h=8, Dk=64, Dv=64, n=8)
GRADCHECK = (
    Shape(mode="decode", B=1, S=1, S_kv=9, G=2, h=2, Dk=4, Dv=3, n=3),
    Shape(mode="prefill", B=1, S=3, S_kv=9, G=2, h=2, Dk=4, Dv=3, n=3),
)


def _declare():
    cases = []

    def add(shape, patterns, dtypes, size, seeds=(0,), **kw):
        cases.extend(
            Case(shape=shape, pattern=p, dtype=d, seed=s, size=size, **kw) for p in patterns for d in dtypes for s in seeds
        )

    for shape in (TINY_DECODE, TINY_PREFILL):
        add(shape, PATTERNS, _FP, "tiny")
        add(shape, ("mixed",), _FP, "tiny", seeds=(1, 2))
        add(shape, ("mixed", "builder"), _LOW, "tiny")
        add(shape, ("mixed",), _FP, "tiny", scale=0.3)
        add(shape, ("mixed",), _FP, "tiny", seeds=(7,), smoke=True)
    add(TINY_DECODE, ("mixed",), (torch.float16,), "tiny", seeds=(7,), smoke=True)
    for shape in TINY_OTHERS:
        add(shape, ("mixed", "builder", "full"), _FP, "tiny")
        add(shape, ("builder",), _LOW, "tiny")
    add(TINY_OTHERS[2], ("builder",), _FP, "tiny", seeds=(7,), smoke=True)
    for shape in TINY_AWKWARD:
        add(shape, ("mixed",), _FP, "tiny")
        add(shape, ("builder",), _LOW, "tiny")
    add(TINY_AWKWARD[0], ("mixed",), _FP, "tiny", seeds=(7,), smoke=True)
    for shape in TINY_LONG:
        add(shape, ("full", "mixed"), _FP, "tiny")
        add(shape, ("full",), _LOW, "tiny")
    add(TINY_LONG[0], ("full",), _FP, "tiny", seeds=(7,), smoke=True)
    # the patterns their bugs need, no more: full (long rows, 64k keys), many_small (many ranges;
    # splits of 256 keys with none), beyond_t (ranges past the causal limit)
    add(TINY_BEYOND[0], ("full", "many_small", "beyond_t"), _FP, "tiny")
    add(TINY_BEYOND[0], ("builder",), _LOW, "tiny")
    add(TINY_BEYOND[1], ("full", "many_small"), _FP, "tiny")
    add(TINY_BEYOND[1], ("full",), _LOW, "tiny")
    add(TINY_BEYOND[2], ("full",), _FP, "tiny")
    add(TINY_BEYOND[2], ("builder",), _LOW, "tiny")
    for shape in (TINY_DECODE, TINY_PREFILL):
        big = dict(values="large_logits", scale=large_logit_scale(shape.Dk))
        add(shape, ("mixed", "full"), _FP, "tiny", **big)
        add(shape, ("mixed",), _LOW, "tiny", **big)
    # the Triton interpreter runs the decode ones (prefill: on a GPU)
    big = dict(values="large_logits", scale=large_logit_scale(TINY_DECODE.Dk))
    add(TINY_DECODE, ("full",), (torch.float32, torch.float16), "tiny", seeds=(7,), smoke=True, **big)
    add(TINY_VARLEN, ("mixed", "builder", "beyond_t", "full"), _FP, "tiny")
    add(TINY_VARLEN, ("mixed",), _LOW, "tiny")
    add(TINY_VARLEN, ("mixed",), _FP, "tiny", seeds=(7,), smoke=True)
    add(CONTENTION, ("heavy_reuse", "full"), (torch.float32, torch.bfloat16), "tiny", gpu_only=True)
    for shape in GRADCHECK:
        add(shape, ("mixed", "overlapping"), (torch.float64,), "tiny")
    for shape in SMALL:
        add(shape, ("mixed", "builder", "full", "heavy_reuse"), _ALL, "small")
    add(SMALL_VARLEN, ("mixed", "builder"), _ALL, "small")
    for shape in LARGE:
        add(shape, ("builder", "full", "mixed"), _ALL, "large")
    add(LARGE_VARLEN, ("builder", "full"), _ALL, "large")
    ids = [c.id for c in cases]
    assert len(ids) == len(set(ids)), "conformance case ids must be unique"
    return tuple(cases)


CASES = _declare()


def select(size: str = "tiny") -> list:
    """Cases of size class `size` and every smaller one."""
    if size not in SIZES:
        raise ValueError(f"size: expected one of {SIZES}, got {size!r}")
    keep = SIZES[: SIZES.index(size) + 1]
    return [c for c in CASES if c.size in keep]
