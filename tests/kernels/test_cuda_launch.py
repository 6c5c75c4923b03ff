"""DecodeLaunch, the named launch overrides of the CUDA decode kernel (kernels/cuda/launch.py), on
any machine: its defaults, the positions its fields take in the extension's list (read from the
C++ binding's source, not from the Python), its checks, and the wrapper's refusal of tuples."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from selgate.kernels.cuda import DecodeLaunch, Pdl, Prefetch, Schedule, build, selection_attention_cuda
from selgate.errors import BackendUnavailable
from tests.helpers import random_inputs


def binding_order() -> list[str]:
    """The Tune members in the order `tune_of` (sel_decode_bind.cpp) fills them from the list."""
    text = (build.SOURCE_DIR / "sel_decode_bind.cpp").read_text()
    found = re.findall(r"int\* fields\[\] = \{([^}]*)\};", text)
    assert len(found) == 1, "tune_of's field table moved: update this test's pattern"
    return re.findall(r"&t\.(\w+)", found[0])


def tune_members() -> list[str]:
    """The members of `struct Tune` in sel_decode.h, in declaration order."""
    text = (build.SOURCE_DIR / "sel_decode.h").read_text()
    body = re.search(r"struct Tune \{(.*?)\n\};", text, re.S)
    assert body, "struct Tune moved: update this test's pattern"
    return re.findall(r"^\s*int (\w+) = 0;", body.group(1), re.M)


# one valid, non-automatic value per field (valid together too)
SAMPLE = dict(
    stages=5,
    split=2,
    warps=3,
    pdl=Pdl.TRIGGER_AFTER_WAIT,
    slab=16,
    schedule=Schedule.PER_WARP_SLABS,
    prefetch=Prefetch.FIRST_KEYS_BULK,
    occupancy=7,
)


def test_the_binding_fills_every_tune_member_once():
    order = binding_order()
    assert order == ["stages", "split", "warps", "pdl", "slab", "schedule", "prefetch", "occupancy"]
    assert sorted(order) == sorted(tune_members())
    assert [f.name for f in dataclasses.fields(DecodeLaunch)] == order  # one name for each field, both sides


def test_defaults_are_automatic_zeros():
    launch = DecodeLaunch()
    assert launch.ext_tune() == [0] * 8
    assert launch.label() == "auto" and repr(launch) == "DecodeLaunch()" and not launch.needs_sm90()
    assert (launch.pdl, launch.schedule, launch.prefetch) == (Pdl.AUTO, Schedule.AUTO, Prefetch.AUTO)


@pytest.mark.parametrize("name", list(SAMPLE))
def test_each_field_lands_in_its_binding_position(name):
    tune = DecodeLaunch(**{name: SAMPLE[name]}).ext_tune()
    want = [0] * 8
    want[binding_order().index(name)] = int(SAMPLE[name])
    assert tune == want and all(type(x) is int for x in tune)


def test_all_fields_together():
    launch = DecodeLaunch(**SAMPLE)
    assert launch.ext_tune() == [int(SAMPLE[name]) for name in binding_order()] == [5, 2, 3, 3, 16, 1, 4, 7]
    assert launch.label() == (
        "stages=5 split=2 warps=3 pdl=TRIGGER_AFTER_WAIT slab=16 schedule=PER_WARP_SLABS prefetch=FIRST_KEYS_BULK occupancy=7"
    )
    assert eval(repr(launch)) == launch  # the repr names the enums, so it rebuilds the launch


def test_the_codes_are_the_extensions():
    """The codes sel_decode.cu's run_mma reads (its checks and the Tune comments in sel_decode.h)."""
    assert [(m.name, m.value) for m in Pdl] == [("AUTO", 0), ("TRIGGER_AFTER_LOOP", 1), ("OFF", 2), ("TRIGGER_AFTER_WAIT", 3)]
    assert [(m.name, m.value) for m in Schedule] == [("AUTO", 0), ("PER_WARP_SLABS", 1), ("SHARED_SLABS", 2)]
    assert [(m.name, m.value) for m in Prefetch] == [
        ("AUTO", 0),
        ("NONE", 1),
        ("RANGES_AND_Q", 2),
        ("FIRST_KEYS_LINES", 3),
        ("FIRST_KEYS_BULK", 4),
    ]


def test_int_codes_become_the_enums():
    launch = DecodeLaunch(pdl=2, schedule=2, prefetch=1)
    assert (launch.pdl, launch.schedule, launch.prefetch) == (Pdl.OFF, Schedule.SHARED_SLABS, Prefetch.NONE)
    assert type(launch.pdl) is Pdl and launch == DecodeLaunch(pdl=Pdl.OFF, schedule=Schedule.SHARED_SLABS, prefetch=Prefetch.NONE)


@pytest.mark.parametrize(
    "values",
    [
        dict(stages=2),
        dict(stages=6),
        dict(split=1),
        dict(split=4),
        dict(warps=1),
        dict(warps=8),
        dict(slab=32),
        dict(occupancy=1),
        dict(occupancy=2**31 - 1),
        dict(split=4, warps=4),
        dict(schedule=2, warps=2, split=1, slab=32),
    ],
)
def test_edge_values_are_accepted(values):
    assert DecodeLaunch(**values).overrides() == values


@pytest.mark.parametrize(
    "values, field, expected",
    [
        (dict(stages=1), "stages", r"\[2, 6\]"),
        (dict(stages=7), "stages", r"\[2, 6\]"),
        (dict(stages=-1), "stages", r"\[2, 6\]"),
        (dict(split=5), "split", "1 to 4 blocks"),
        (dict(split=8), "split", "1 to 4 blocks"),
        (dict(warps=9), "warps", "1 to 8 warps"),
        (dict(warps=-2), "warps", "1 to 8 warps"),
        (dict(pdl=4), "pdl", r"one of 0 \(AUTO\), 1 \(TRIGGER_AFTER_LOOP\), 2 \(OFF\), 3 \(TRIGGER_AFTER_WAIT\)"),
        (dict(pdl=-1), "pdl", "one of 0 \\(AUTO\\)"),
        (dict(slab=8), "slab", "16 or 32"),
        (dict(slab=64), "slab", "16 or 32"),
        (dict(schedule=3), "schedule", r"2 \(SHARED_SLABS\)"),
        (dict(prefetch=5), "prefetch", r"4 \(FIRST_KEYS_BULK\)"),
        (dict(occupancy=-1), "occupancy", r"\[1, 2\^31 - 1\]"),
        (dict(occupancy=2**31), "occupancy", r"\[1, 2\^31 - 1\]"),
        # combinations sel_decode.cu refuses whatever the shape and the device
        (dict(split=2, warps=8), "warps", "at most 4 warps with a cluster split"),
        (dict(schedule=Schedule.SHARED_SLABS, warps=4), "warps", "with schedule=SHARED_SLABS"),
        (dict(schedule=Schedule.SHARED_SLABS, split=2), "split", "with schedule=SHARED_SLABS"),
        (dict(schedule=Schedule.SHARED_SLABS, slab=16), "slab", "with schedule=SHARED_SLABS"),
    ],
)
def test_bad_values_name_the_field_value_and_expectation(values, field, expected):
    with pytest.raises(ValueError, match=rf"^DecodeLaunch\.{field}: expected .*{expected}.*, got {values[field]}$"):
        DecodeLaunch(**values)


@pytest.mark.parametrize(
    "values, field",
    [
        (dict(stages=2.0), "stages"),
        (dict(warps="2"), "warps"),
        (dict(split=True), "split"),
        (dict(occupancy=None), "occupancy"),
        (dict(pdl=Schedule.SHARED_SLABS), "pdl"),
        (dict(stages=Pdl.OFF), "stages"),
    ],
)
def test_non_integers_and_foreign_codes_are_type_errors(values, field):
    with pytest.raises(TypeError, match=rf"^DecodeLaunch\.{field}: expected "):
        DecodeLaunch(**values)


def test_frozen_and_checked_on_replace():
    launch = DecodeLaunch(stages=3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        launch.stages = 4
    assert dataclasses.replace(launch, pdl=Pdl.OFF).ext_tune() == [3, 0, 0, 2, 0, 0, 0, 0]
    with pytest.raises(ValueError, match="^DecodeLaunch.stages"):
        dataclasses.replace(launch, stages=9)
    assert len({launch, DecodeLaunch(stages=3)}) == 1  # hashable: a key for sweeps


@pytest.mark.parametrize(
    "values, sm90",
    [
        (dict(), False),
        (dict(split=1), False),
        (dict(split=2), True),
        (dict(pdl=Pdl.OFF), False),
        (dict(pdl=Pdl.TRIGGER_AFTER_LOOP), True),
        (dict(pdl=Pdl.TRIGGER_AFTER_WAIT), True),
    ],
)
def test_needs_sm90(values, sm90):
    assert DecodeLaunch(**values).needs_sm90() is sm90


def decode_inputs():
    return random_inputs(B=2, S=1, G=2, h=3, Dk=16, Dv=8, S_kv=23, n=4, dtype=torch.float16, seed=0)


@pytest.mark.parametrize("launch", [(3, 2, 4, 1), [0, 0, 0, 2], ()])
def test_a_positional_launch_is_a_type_error_before_any_other_check(launch):
    """Argument checks come before input and device checks: CPU tensors, even malformed ones,
    get the launch's TypeError."""
    q, k, v, r = decode_inputs()
    with pytest.raises(TypeError, match="^launch: positional overrides are not accepted.*use selgate.kernels.cuda.DecodeLaunch"):
        selection_attention_cuda(q, k, v, r, launch=launch)
    with pytest.raises(TypeError, match="^launch: positional"):
        selection_attention_cuda(q, k[:1], v, r, launch=launch)  # k's batch is wrong too


def test_a_launch_passes_the_argument_checks_on_cpu_tensors():
    """A valid launch reaches the device checks, which decline CPU tensors with a reason."""
    with pytest.raises(BackendUnavailable) as info:
        selection_attention_cuda(*decode_inputs(), launch=DecodeLaunch(stages=3, pdl=Pdl.OFF))
    assert info.value.reason in ("no_cuda", "device")


def test_the_tune_keyword_is_gone():
    with pytest.raises(TypeError, match="tune"):
        selection_attention_cuda(*decode_inputs(), tune=(3, 2, 4, 1))
