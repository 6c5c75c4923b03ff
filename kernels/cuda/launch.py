"""Launch overrides of the CUDA tensor-core decode kernel, as one named, validated structure.

Why it exists: the extension takes its overrides as a list of up to 8 ints whose meaning is
their position (`Tune` in sel_decode.h, filled in that order by `tune_of` in
sel_decode_bind.cpp) and whose coded values (PDL mode, schedule, prefetch) are numbers. A list
written by position silently means something else when a value lands one slot off, and a value
the kernel refuses surfaced only at launch, on a GPU. `DecodeLaunch` names every field, spells
the codes as enums, checks every value on construction (on any machine), and is the one place
that knows the positional order (`ext_tune`).

Every field defaults to automatic (0): the host code's measured choice (`run_mma` in
sel_decode.cu, docs/design/cuda-decode.md). The overrides change the schedule, never the
function computed. The SIMT kernel (fp32, `kernel="simt"`) ignores them.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from enum import IntEnum

AUTO = 0  # every field: let the host code choose


class Pdl(IntEnum):
    """Programmatic dependent launch (SM >= 9.0; below it the kernel launches without PDL):
    the grid may start while the previous kernel on the stream finishes, reading nothing
    global before `griddepcontrol.wait`. Automatic: off with per-warp slabs; with shared slabs
    TRIGGER_AFTER_WAIT where the next grid lands evenly, else TRIGGER_AFTER_LOOP."""

    AUTO = 0
    TRIGGER_AFTER_LOOP = 1  # on; the next grid is let in after this block's key loop
    OFF = 2
    TRIGGER_AFTER_WAIT = 3  # on; the next grid is let in right after this block's wait


class Schedule(IntEnum):
    """How a block's warps stream the row's key slabs. Automatic: shared slabs with at least one
    (row, head group) per SM and Dk <= Dv, or when S_kv <= 256; per-warp slabs otherwise."""

    AUTO = 0
    PER_WARP_SLABS = 1  # each warp streams its own slabs through a private ring, merged at the end
    SHARED_SLABS = 2  # the block's 2 warps share each slab (needs 2 warps, no split, 32-key slabs)


class Prefetch(IntEnum):
    """What a block asks L2 for before its `griddepcontrol.wait`. The first keys are prefetched
    only without explicit positions (t = S_kv - 1). Automatic: FIRST_KEYS_BULK where the launch
    lands in the previous grid's tail (run_mma's tail landing: shared slabs, PDL, one wave of at
    least 2 blocks per SM, S_kv >= 256, occupancy automatic), else NONE."""

    AUTO = 0
    NONE = 1
    RANGES_AND_Q = 2  # the row's ranges and its q heads
    FIRST_KEYS_LINES = 3  # ranges, q and keys [0, 64): one prefetch per 128-byte line
    FIRST_KEYS_BULK = 4  # ranges, q and keys [0, 64): bulk prefetches (SM >= 9.0; a no-op below)


# The extension's positional order: `int* fields[]` in `tune_of` (sel_decode_bind.cpp), the
# members of `Tune` (sel_decode.h). DecodeLaunch declares its fields in this order.
EXT_ORDER = ("stages", "split", "warps", "pdl", "slab", "schedule", "prefetch", "occupancy")

_ENUMS = {"pdl": Pdl, "schedule": Schedule, "prefetch": Prefetch}
_INT_MAX = 2**31 - 1  # the binding narrows each value to a C++ int


@dataclass(frozen=True, repr=False)
class DecodeLaunch:
    """Launch overrides of the tensor-core decode kernel; 0 / AUTO = automatic.

    Ranges are those the host code accepts (sel_decode.cu, `run_mma`); a launch can still be
    refused there for the shape or the device (shared memory, more than 4 warps with
    Dk + Dv > 128, a split below SM 9.0), which `selection_attention_cuda` raises as
    `BackendUnavailable("launch")`."""

    stages: int = AUTO  # depth of each warp's cp.async ring: 2..6
    split: int = AUTO  # blocks of one thread-block cluster sharing a row (SM >= 9.0): 1..4 (verified up to 4)
    warps: int = AUTO  # warps per block: 1..8 (more than 4 only with Dk + Dv <= 128)
    pdl: Pdl = Pdl.AUTO
    slab: int = AUTO  # keys per warp step: 16 or 32
    schedule: Schedule = Schedule.AUTO
    prefetch: Prefetch = Prefetch.AUTO
    # at most this many blocks per SM (shared memory padded), >= 1; automatic: capped at the even
    # share under tail landing, else uncapped (a set cap also turns tail landing's prefetch off)
    occupancy: int = AUTO

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            enum = _ENUMS.get(f.name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int)
                or (isinstance(value, IntEnum) and not isinstance(value, enum or ()))
            ):
                want = f"a {enum.__name__} or its int code" if enum else "an int"
                raise TypeError(f"DecodeLaunch.{f.name}: expected {want}, got {value!r} ({type(value).__name__})")
            if enum is not None:
                if value not in set(enum):
                    codes = ", ".join(f"{m.value} ({m.name})" for m in enum)
                    raise ValueError(f"DecodeLaunch.{f.name}: expected one of {codes}, got {value!r}")
                object.__setattr__(self, f.name, enum(value))
        # Ranges of the numeric fields, as sel_decode.cu's run_mma checks them.
        self._check("stages", 2 <= self.stages <= 6, "0 (automatic) or a ring depth in [2, 6]")
        self._check("split", 1 <= self.split <= 4, "0 (automatic) or a cluster of 1 to 4 blocks (verified up to 4)")
        self._check("warps", 1 <= self.warps <= 8, "0 (automatic) or 1 to 8 warps per block")
        self._check("slab", self.slab in (16, 32), "0 (automatic), 16 or 32 keys per warp step")
        self._check("occupancy", 1 <= self.occupancy <= _INT_MAX, "0 (automatic) or a cap in [1, 2^31 - 1] blocks per SM")
        # Combinations run_mma refuses whatever the shape and the device.
        if self.split > 1 and self.warps > 4:
            raise ValueError(
                f"DecodeLaunch.warps: expected at most 4 warps with a cluster split (split={self.split}; "
                f"only those are verified), got {self.warps}"
            )
        if self.schedule == Schedule.SHARED_SLABS:
            for name, ok, want in (
                ("warps", self.warps in (AUTO, 2), "0 (automatic) or 2"),
                ("split", self.split in (AUTO, 1), "0 (automatic) or 1"),
                ("slab", self.slab in (AUTO, 32), "0 (automatic) or 32"),
            ):
                if not ok:
                    raise ValueError(
                        f"DecodeLaunch.{name}: expected {want} with schedule=SHARED_SLABS (the block's 2 "
                        f"warps share each 32-key slab, no split), got {getattr(self, name)}"
                    )

    def _check(self, name: str, ok: bool, want: str) -> None:
        value = getattr(self, name)
        if value != AUTO and not ok:
            raise ValueError(f"DecodeLaunch.{name}: expected {want}, got {value}")

    def ext_tune(self) -> list[int]:
        """The `tune` argument of the extension's `fwd` and `plan`: the fields as plain ints in
        the binding's order (EXT_ORDER)."""
        return [int(getattr(self, name)) for name in EXT_ORDER]

    def needs_sm90(self) -> bool:
        """Whether this launch asks for what only SM >= 9.0 runs: a cluster split (refused below)
        or PDL on (launched without it below)."""
        return self.split > 1 or self.pdl in (Pdl.TRIGGER_AFTER_LOOP, Pdl.TRIGGER_AFTER_WAIT)

    def overrides(self) -> dict:
        """The fields that are not automatic, by name."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) != AUTO}

    def label(self) -> str:
        """`field=value` for every override (enum codes by name), or "auto": a key for tables."""
        return " ".join(f"{k}={getattr(v, 'name', v)}" for k, v in self.overrides().items()) or "auto"

    def __repr__(self) -> str:
        args = ", ".join(
            f"{k}={type(v).__name__}.{v.name}" if isinstance(v, IntEnum) else f"{k}={v}" for k, v in self.overrides().items()
        )
        return f"DecodeLaunch({args})"


if tuple(f.name for f in fields(DecodeLaunch)) != EXT_ORDER:  # ext_tune and the field order must agree
    raise AssertionError(f"DecodeLaunch fields {[f.name for f in fields(DecodeLaunch)]} != EXT_ORDER {EXT_ORDER}")
