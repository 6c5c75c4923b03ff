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
    assert variant_of(ordered[0]) == "h2-D256x256-fp32", ordered[0]
    assert variant_of(next(i for i in ordered if "D256x256" not in i)) == "h1-D192x128-fp32"
    assert variant_of(next(i for i in ordered if "D256x256" not in i and "D192x128" not in i)) == "h12-D100x100-fp32"
    assert ordered.index(next(i for i in ordered if i.endswith("-fp16-s0]") and "D192x128" in i)) < ordered.index(
        next(i for i in ordered if "D128x64" in i)
    )
    d192 = [i for i in reversed(ids) if variant_of(i) == "h1-D192x128-fp32"]
    assert [i for i in ordered if variant_of(i) == "h1-D192x128-fp32"] == d192


class _Worker:
    """What the scheduler uses of xdist's WorkerController: the cases it was sent, shutdown."""

    def __init__(self, name):
        self.gateway = SimpleNamespace(id=name)
        self.sent: list = []
        self.shutting_down = False

    def send_runtest_some(self, indices):
        self.sent += indices

    def shutdown(self):
        self.shutting_down = True


def test_a_replacement_handed_single_case_units_is_filled_and_told_to_finish():
    """A worker runs a case only once it knows the next one, or that none comes: a replacement
    given one unit of one pending case (its other case crashed) while another unit waited in
    the queue ran nothing, and the check hung until its caller's timeout."""
    from selgate.conformance.check_plugin import pytest_xdist_make_scheduler

    config = SimpleNamespace(option=SimpleNamespace(), getvalue={"tx": ["2*popen"]}.get)
    ids = [f"t.py::test_parity[k:f-decode-B1S1Skv{t}-G2h{h}-D16x16-n4-single-fp32-s0]" for h in (1, 3) for t in (29, 45)]
    sched = pytest_xdist_make_scheduler(config, None)
    first, second = _Worker("gw0"), _Worker("gw1")
    for w in (first, second):
        sched.add_node(w)
        sched.add_node_collection(w, ids)
    sched.schedule()
    assert sched.remove_node(second) == ids[2]  # the G2h3 unit's first case crashed
    assert sched.remove_node(first) == ids[0]  # and so did the G2h1 unit's
    assert len(sched.workqueue) == 2 and all(sum(not d for d in u.values()) == 1 for u in sched.workqueue.values())
    replacement = _Worker("gw2")
    sched.add_node(replacement)
    sched.add_node_collection(replacement, ids)
    sched.schedule()
    assert sorted(replacement.sent) == [1, 3] and replacement.shutting_down
    assert not sched.workqueue
