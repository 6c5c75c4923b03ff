"""What a check's verdict says it covered, on synthetic results (the end-to-end runs are
tests/reports/test_check_liars.py)."""

from __future__ import annotations

import json
from collections import Counter

import torch

from selgate.reports.check_report import CheckVerdict, uncovered
from selgate.conformance.impl import user_impl
from selgate.reports.results import CaseResult

CASE = "prefill-B2S9Skv33-G2h4-D16x8-n4-mixed-fp16-s0"
CLAIMS = {"parity": None, "determinism": None, "backward": "does not declare backward (backward: false)"}


def _case(test, outcome, case=CASE, family=None, impl="k:fn", sets=""):
    nodeid = f"conformance/test_conformance.py::{test}[{impl}-{case}]"
    return CaseResult("check", nodeid, family or test[5:], outcome, facts={"sets": sets} if sets else {})


def test_a_pass_names_its_size_and_its_declared_expected_failures():
    v = CheckVerdict(claims=CLAIMS, size="tiny", xfails=Counter({"fp16": 57}))
    assert (
        v.headline
        == "CHECK PASSED at size tiny with 57 declared expected failures in fp16: 2 claimed families (parity, determinism)"
    )
    v.xfails = Counter({"fp16": 3, "bad input": 1})
    assert v.headline.startswith("CHECK PASSED at size tiny with 4 declared expected failures (fp16 3, bad input 1): ")
    v.uncovered = ["families backward, gradcheck", "dtype bf16"]
    assert v.headline.endswith("(parity, determinism); never ran (every case skipped): families backward, gradcheck; dtype bf16")
    v.blocking.append("claimed family parity has no passing test")
    assert v.headline == "CHECK BLOCKED: claimed family parity has no passing test"


def test_what_never_ran_is_each_family_and_declared_dtype_and_mode_with_only_skips():
    impl = user_impl("k:fn", {"dtypes": ("fp16", "bf16"), "modes": ("prefill", "decode")}, None)
    cases = [
        _case("test_parity", "pass"),
        _case("test_parity", "skip", CASE.replace("fp16", "bf16")),
        _case("test_backward", "skip"),
        _case("test_parity", "skip", "decode-B2S1Skv37-G2h4-D16x16-n4-mixed-fp16-s0"),
        _case("test_dtype", "xfail"),
    ]
    assert uncovered(impl, cases) == ["family backward", "dtype bf16", "mode decode"]


def test_sizes_a_kernel_declares_out_and_a_tf32_fp32_are_on_the_first_line():
    """`max_size: tiny` under `--size small` skipped every small case while the headline said
    `at size small`; a kernel declaring TF32 had its fp32 judged by the looser rule unsaid."""
    declared = {"dtypes": ("fp16", "fp32"), "modes": ("prefill",), "max_size": "tiny", "fp32_matmul": "tf32"}
    impl = user_impl("k:fn", declared, None)
    cases = [_case("test_parity", "pass"), _case("test_parity", "pass", CASE.replace("fp16", "fp32"))]
    assert uncovered(impl, cases, "small") == ["size small (declared max_size tiny)"]
    assert uncovered(impl, cases, "tiny") == []
    v = CheckVerdict(claims=CLAIMS, size="small", uncovered=uncovered(impl, cases, "small"), tf32=True)
    assert v.headline.startswith("CHECK PASSED at size small with fp32 judged by the TF32 rule (declared): ")
    assert v.headline.endswith("never ran (every case skipped): size small (declared max_size tiny)")


def test_a_run_whose_every_case_skipped_says_so_and_suspects_no_tampering(tmp_path):
    """A kernel declared for CUDA, checked on a CPU machine: pytest exits 1 because no case of
    the kernel ran, and the verdict says that, not that the results were changed."""
    import pytest
    from junitparser import JUnitXml, Skipped, TestCase, TestSuite

    from selgate.reports.check_report import judge

    suite = TestSuite("pytest")
    for test, case in [("test_parity", CASE), ("test_backward", CASE), ("test_parity", CASE.replace("fp16", "bf16"))]:
        tc = TestCase(f"{test}[k:fn-{case}]", "conformance.test_conformance")
        tc.result = [Skipped("k:fn declares devices: cuda (this run's device is cpu)")]
        suite.add_testcase(tc)
    xml = JUnitXml()
    xml.add_testsuite(suite)
    xml.write(str(tmp_path / "junit.xml"))
    impl = user_impl("k:fn", {"dtypes": ("fp16",), "devices": ("cuda",)}, None)
    from selgate.conformance.families import claims

    (tmp_path / "claims.json").write_text(json.dumps(claims(impl)))  # as the run's controller writes them
    v = judge(impl, tmp_path, pytest.ExitCode.TESTS_FAILED, size="tiny")
    assert v.headline == (
        "CHECK BLOCKED: no case ran: all 3 were skipped (3 of them: k:fn declares devices: cuda (this run's device is cpu))"
    ), v.blocking


def test_a_declaration_that_removes_bug_class_case_sets_is_named_on_the_first_line():
    """Head dims of 8 alone left 87 of 777 cases, none with a head dim that is not a power of
    two or a row of 256 keys, under a headline word for word a full pass's; a block size is
    said there too (a block of 2^20 keys made every selection the whole causal prefix)."""
    impl = user_impl("k:fn", {"dtypes": ("fp16",), "modes": ("prefill",)}, None)
    cases = [
        _case("test_parity", "pass", sets="G >= 2"),
        _case("test_parity", "skip", CASE.replace("D16x8", "D72x72"), sets="G >= 2,head dims not a power of two"),
        _case("test_parity", "skip", CASE.replace("Skv33", "Skv290"), sets="G >= 2,Dv != Dk,rows of 256+ keys"),
        _case("test_bad_input", "pass", "scale_nan", family="bad_input", sets="Dv != Dk"),
    ]
    assert uncovered(impl, cases) == ["case sets Dv != Dk, head dims not a power of two, rows of 256+ keys"]
    v = CheckVerdict(claims=CLAIMS, size="tiny", uncovered=uncovered(impl, cases), block_size=64)
    assert v.headline == (
        "CHECK PASSED at size tiny with selections of whole 64-key blocks (declared): 2 claimed families (parity, "
        "determinism); never ran (every case skipped): case sets Dv != Dk, head dims not a power of two, rows of 256+ keys"
    )


def test_every_case_set_has_cases_at_the_default_size():
    """Each bug-class case set has tiny cases in fp32 and in a low precision (what the headline
    can name as never run must be in the default matrix to begin with)."""
    from selgate.conformance.cases import select

    tiny = select("tiny")
    sets = {s for c in tiny for s in c.sets}
    assert sets == {
        "G >= 2",
        "heads or groups not a power of two",
        "head dims not a power of two",
        "Dv != Dk",
        "rows of 256+ keys",
        "large logits",
    }
    for s in sets:
        assert {torch.float32, torch.float16} <= {c.dtype for c in tiny if s in c.sets}, s


def test_declared_limits_are_on_the_first_line_and_only_judged_cases_reach_a_set():
    """Head dims 16 to 64, heads a power of two up to 16 and contiguous inputs left 193 of 501
    cases under a full pass's first line; a case set reached only by declared expected failures
    or by determinism (which compares no value with the reference) was counted as run."""
    from selgate.reports.check_report import declared_limits

    declared = {"heads_power_of_two": True, "max_heads": 16, "min_head_dim": 16, "max_head_dim": 64, "layouts": ("contiguous",)}
    impl = user_impl("k:fn", {"dtypes": ("fp32",), **declared}, None)
    limits = declared_limits(impl)
    assert limits == ["heads a group a power of two, at most 16", "head dims from 16 up to 64", "layouts contiguous"]
    assert declared_limits(user_impl("k:fn", {"modes": ("decode",)}, None)) == ["decode only"]
    assert declared_limits(user_impl("k:fn", {}, None)) == []
    v = CheckVerdict(claims=CLAIMS, size="tiny", limits=limits)
    assert v.headline.startswith(
        "CHECK PASSED at size tiny within declared limits (heads a group a power of two, at most 16; head dims from 16 "
        "up to 64; layouts contiguous): "
    )
    cases = [
        _case("test_parity", "pass", sets="G >= 2"),
        _case("test_parity", "xfail", CASE.replace("-mixed-", "-mixed-vlarge_logits-"), sets="G >= 2,large logits"),
        _case("test_determinism", "pass", CASE.replace("-mixed-", "-full-vlarge_logits-"), sets="G >= 2,large logits"),
    ]
    assert uncovered(impl, cases)[-1] == "case set large logits"


def test_a_run_cut_before_any_worker_ended_lists_the_families_that_ran_with_their_claims_unknown():
    """No worker finished, so no claims were written: the families table was empty. It lists the
    families that ran, says their claims are unknown, and says so where none ran either."""
    from selgate.reports.check_report import _families

    v = CheckVerdict(claims={}, counts={"parity": {"pass": 3, "fail": 1, "error": 0, "skip": 0, "xfail": 0}})
    text = "\n".join(_families(v))
    assert "the run wrote no family claims (no worker finished)" in text
    assert "| parity | unknown | **3/1/0/0/0** |" in text
    assert "| none ran | unknown | - |" in "\n".join(_families(CheckVerdict(claims={})))
    claimed = "\n".join(_families(CheckVerdict(claims=CLAIMS, counts=v.counts)))
    assert "| parity | yes | **3/1/0/0/0** |" in claimed and "| backward | no: does not declare backward" in claimed
    assert "unknown" not in claimed
