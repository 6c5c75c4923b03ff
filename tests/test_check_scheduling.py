"""How `selgate check` hands cases to workers: whole kernel variants, costliest first."""

from selgate.conformance import cases
from selgate.conformance.check_plugin import compile_cost, variant_of


def _ids():
    return [f"test_parity.py::test_parity[k:f-{c.id}]" for c in cases.select("tiny")]


def test_a_variant_is_packed_or_not_heads_head_dims_and_dtype():
    ids = _ids()
    scopes = {variant_of(i) for i in ids}
    assert "h4-D16x16-fp32" in scopes and "varlen-h2-D16x16-fp32" in scopes
    assert all(variant_of(i) == variant_of(i.replace("-s0]", "-s7]")) for i in ids)
    same = [i for i in ids if variant_of(i) == "h2-D192x128-fp32"]
    assert {i.split("-")[2] for i in same} == {"B1S1Skv45"}, same
    assert variant_of("test_policy.py::test_policy_is_declared") == "test_policy.py::test_policy_is_declared"


def test_costliest_variants_are_handed_out_first():
    ordered = sorted(_ids(), key=compile_cost, reverse=True)
    first = variant_of(ordered[0])
    assert first == "h2-D192x128-fp32", first
    widths = [sum(compile_cost(i)[:1]) for i in ordered]
    assert widths == sorted(widths, reverse=True)
    # within a variant, cases keep their declared order (a stable sort)
    d192 = [i for i in _ids() if variant_of(i) == first]
    assert [i for i in ordered if variant_of(i) == first] == d192
