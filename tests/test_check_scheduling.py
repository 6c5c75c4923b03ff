"""How `selgate check` hands cases to workers: whole kernel variants, costliest first."""

from types import SimpleNamespace

from selgate.conformance import cases
from selgate.conformance.check_plugin import pytest_collection_modifyitems, variant_of


def _ids():
    return [f"test_parity.py::test_parity[k:f-{c.id}]" for c in cases.select("tiny")]


def test_a_variant_is_packed_or_not_heads_head_dims_and_dtype():
    ids = _ids()
    scopes = {variant_of(i) for i in ids}
    assert "h4-D16x16-fp32" in scopes and "varlen-h2-D16x16-fp32" in scopes
    assert all(variant_of(i) == variant_of(i.replace("-s0]", "-s7]")) for i in ids)
    same = [i for i in ids if variant_of(i) == "h1-D192x128-fp32"]
    assert {i.split("-")[2] for i in same} == {"B1S1Skv45"}, same
    assert variant_of("test_policy.py::test_policy_is_declared") == "test_policy.py::test_policy_is_declared"


def test_costliest_variants_are_handed_out_first():
    """The check's collection hook puts the widest head dims first, then the widest elements;
    cases of one variant keep their declared order."""
    ids = _ids()
    items = [SimpleNamespace(nodeid=i) for i in reversed(ids)]
    pytest_collection_modifyitems(None, items)
    ordered = [i.nodeid for i in items]
    assert sorted(ordered) == sorted(ids)
    assert variant_of(ordered[0]) == "h1-D192x128-fp32", ordered[0]
    assert variant_of(next(i for i in ordered if "D192x128" not in i)) == "h12-D100x100-fp32"
    assert ordered.index(next(i for i in ordered if i.endswith("-fp16-s0]") and "D192x128" in i)) < ordered.index(
        next(i for i in ordered if "D128x64" in i)
    )
    d192 = [i for i in reversed(ids) if variant_of(i) == "h1-D192x128-fp32"]
    assert [i for i in ordered if variant_of(i) == "h1-D192x128-fp32"] == d192
