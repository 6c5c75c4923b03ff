"""How the matrix judges what comes back: bitwise means the stored bits, a declared lse must come
back, a crash is no refusal of bad input (nor of a call beyond the declared limits), and a shared
K/V buffer reaches a kernel that declares it (each passed a wrong kernel in a hostile review)."""

import pytest
import torch

from selgate.conformance.cases import select
from selgate.conformance.compare import ConformanceFailure, assert_equal
from selgate.conformance.evaluation import impl_fn
from selgate.conformance.families.bad_input import BAD_INPUTS
from selgate.conformance.families.bad_input import check as check_bad_input
from selgate.conformance.families.limits import beyond
from selgate.conformance.families.limits import check as check_limits
from selgate.conformance.impl import Impl
from selgate.conformance.remote import ExecutorDied
from selgate.reference import selection_attention_ref


def test_bitwise_identical_tells_negative_zero_and_nan_payloads_apart():
    with pytest.raises(ConformanceFailure, match=r"1 elements differ \(run to run\); first at index \(0,\): -0.0 vs 0.0"):
        assert_equal("o", torch.tensor([-0.0]), torch.tensor([0.0]), case_id="c", why="run to run", rule="determinism")
    nan = torch.tensor([float("nan")])
    other = nan.view(torch.int32).add(1).view(torch.float32)  # another NaN payload
    with pytest.raises(ConformanceFailure):
        assert_equal("o", other, nan, case_id="c", why="run to run", rule="determinism")
    assert_equal("o", nan.clone(), nan, case_id="c", why="run to run", rule="determinism")


def _impl(call, **declared):
    return Impl("k:fn", call, dtypes=("fp32",), **declared)


def test_a_declared_lse_must_come_back():
    q, k, v = torch.zeros(1, 1, 1, 1, 4), torch.zeros(1, 1, 2, 4), torch.zeros(1, 1, 2, 4)
    impl = _impl(lambda q, k, v, r, *, scale=None, want_lse=True: (torch.zeros(1, 1, 1, 1, 4), None), lse=True)
    with pytest.raises(ConformanceFailure, match="lse: declared .lse: true. but the call returned none"):
        impl_fn(impl, torch.zeros(1, 1, 1, 1, 2, dtype=torch.int64), None)(q, k, v)


def test_a_kernel_whose_process_dies_on_bad_input_has_not_refused_it():
    def dies(q, k, v, ranges, *, scale=None, want_lse=True):
        raise ExecutorDied("the kernel's process was killed by SIGABRT during the call: Assertion `scale > 0' failed")

    bad = next(b for b in BAD_INPUTS if b.name == "scale-negative")
    case = next(c for c in select("tiny") if c.dtype == torch.float32 and c.mode == "prefill")
    with pytest.raises(ConformanceFailure, match="died instead of refusing"):
        check_bad_input(_impl(dies, lse=True), bad, case, "cpu")


@pytest.mark.parametrize("layouts, shared", [(("contiguous", "kv_shared"), True), (("contiguous",), False)])
def test_a_kernel_declaring_kv_shared_gets_the_shared_buffer(layouts, shared):
    seen = {}

    def call(q, k, v, ranges, *, scale=None, want_lse=True):
        seen["shared"] = k.untyped_storage().data_ptr() == v.untyped_storage().data_ptr()
        return selection_attention_ref(q, k, v, ranges, scale=scale, return_lse=True)

    kv = torch.randn(1, 1, 5, 8)
    q, k, v = torch.randn(1, 1, 1, 1, 4), kv[..., :4], kv[..., 4:]
    _impl(call, layouts=layouts, lse=True).forward(q, k, v, torch.tensor([[[[[0, 5]]]]]))
    assert seen["shared"] is shared


def _correct(q, k, v, ranges, *, scale=None, want_lse=True):
    o, lse = selection_attention_ref(q.double(), k.double(), v.double(), ranges, scale=scale, return_lse=True)
    return o.to(v.dtype), lse.float()


def test_beyond_its_limits_a_kernel_may_answer_right_or_refuse():
    """Declared fp32, decode alone, head dims up to 8: past each limit a right answer passes, and so
    does any error; the family finds one case per limit."""
    right = _impl(_correct, lse=True, modes=("decode",), max_head_dim=8)
    found = beyond(right, select("tiny"), "cpu")
    assert {limit for limit, _ in found} == {"dtype fp16", "dtype bf16", "mode prefill", "head dims above the maximum"}, found
    assert ("mode prefill", "full") in found and ("mode prefill", "mixed") in found, found
    for (limit, _), case in found.items():
        check_limits(right, limit, case, "cpu")

    def refuses(q, k, v, ranges, *, scale=None, want_lse=True):
        if q.shape[-1] > 8 or q.shape[1] > 1 or q.dtype != torch.float32:
            raise NotImplementedError("beyond what I declared")  # before touching anything
        return _correct(q, k, v, ranges, scale=scale)

    refusing = _impl(refuses, lse=True, modes=("decode",), max_head_dim=8)
    for (limit, _), case in found.items():
        check_limits(refusing, limit, case, "cpu")


def test_beyond_its_limits_an_error_that_broke_cuda_or_a_dead_process_is_no_refusal():
    """An illegal memory access raises too (the executor marks it `broke_cuda`); so does a kernel
    whose process died. Neither refused."""

    def broke(q, k, v, ranges, *, scale=None, want_lse=True):
        error = RuntimeError("CUDA error: an illegal memory access was encountered")
        error.broke_cuda = True
        raise error

    def dies(q, k, v, ranges, *, scale=None, want_lse=True):
        raise ExecutorDied("the kernel's process was killed by SIGSEGV during the call")

    for call in (broke, dies):
        impl = _impl(call, lse=True, max_head_dim=8)
        limit = "head dims above the maximum"
        case = beyond(impl, select("tiny"), "cpu")[limit, "full"]
        with pytest.raises(ConformanceFailure, match="instead of refusing") as e:
            check_limits(impl, limit, case, "cpu")
        assert e.value.facts["kind"] == "crashed instead of refusing"


def test_beyond_its_limits_the_judges_error_or_a_refusal_that_wrote_its_inputs_is_no_refusal():
    """An error the judge raises on what came back (a bare o where lse is declared) is not the
    kernel refusing; nor is a refusal after the call wrote into its inputs."""
    limit = "head dims above the maximum"

    def bare_o(q, k, v, ranges, *, scale=None, want_lse=True):
        return _correct(q, k, v, ranges, scale=scale)[0]

    impl = _impl(bare_o, lse=True, max_head_dim=8)
    with pytest.raises(TypeError, match="must return"):
        check_limits(impl, limit, beyond(impl, select("tiny"), "cpu")[limit, "full"], "cpu")

    def writes_then_refuses(q, k, v, ranges, *, scale=None, want_lse=True):
        ranges.zero_()
        raise NotImplementedError("beyond what I declared")

    impl = _impl(writes_then_refuses, lse=True, max_head_dim=8)
    with pytest.raises(ConformanceFailure, match="ranges: modified by a call that then refused"):
        check_limits(impl, limit, beyond(impl, select("tiny"), "cpu")[limit, "full"], "cpu")


def test_the_rows_that_select_a_nan_key_are_not_judged_the_others_are():
    """The bounds family puts NaN in K and V at a key some rows select: a kernel that answers those
    rows finite (a split-K combine that leaves out a split whose sum is not positive drops a NaN
    split too) passes; one whose NaN reaches a row that did not select the key fails."""
    from selgate.conformance.badimpls import BAD_IMPLS
    from selgate.conformance.families.bounds import check as check_bounds

    def finite(q, k, v, ranges, *, scale=None, want_lse=True):
        return _correct(q, k.nan_to_num(0.0), v.nan_to_num(0.0), ranges, scale=scale)

    cases = [c for c in select("tiny") if c.dtype == torch.float32 and "prefill" in c.id and c.pattern == "mixed"][:3]
    shared = next(b.impl for b in BAD_IMPLS if b.impl.name == "pv-over-shared-keys")
    for case in cases:
        check_bounds(_impl(finite, lse=True), case, "cpu")
    with pytest.raises(ConformanceFailure, match="non-finite or wrong special values"):
        for case in cases:
            check_bounds(shared, case, "cpu")
