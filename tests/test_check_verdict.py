"""What a check's verdict says it covered, and how checksums from two processes are compared,
on synthetic results (the end-to-end runs are tests/test_check_liars.py)."""

from __future__ import annotations

from collections import Counter

import torch

from selgate.conformance import triage
from selgate.conformance.check_report import CheckVerdict, across_processes, uncovered
from selgate.conformance.evaluation import Result
from selgate.conformance.families import determinism
from selgate.conformance.registry import user_impl
from selgate.reports.results import CaseResult

CASE = "prefill-B2S9Skv33-G2h4-D16x8-n4-mixed-fp16-s0"
CLAIMS = {"parity": None, "determinism": None, "backward": "does not declare backward (backward: false)"}


def _case(test, outcome, case=CASE, family=None, impl="k:fn"):
    return CaseResult("check", f"conformance/test_conformance.py::{test}[{impl}-{case}]", family or test[5:], outcome)


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
    impl = user_impl("k:fn", {"dtypes": (torch.float16, torch.bfloat16), "modes": ("prefill", "decode")}, None)
    cases = [
        _case("test_parity", "pass"),
        _case("test_parity", "skip", CASE.replace("fp16", "bf16")),
        _case("test_backward", "skip"),
        _case("test_parity", "skip", "decode-B2S1Skv37-G2h4-D16x16-n4-mixed-fp16-s0"),
        _case("test_dtype", "xfail"),
    ]
    assert uncovered(impl, cases) == ["family backward", "dtype bf16", "mode decode"]


def test_checksums_from_two_processes_are_compared(tmp_path, monkeypatch):
    inputs = (torch.ones(3), torch.arange(4))
    o = torch.tensor([1.0, 2.0])

    def write(folder, process, result, made=inputs, key="test_determinism[k:fn-" + CASE + "]"):
        folder.mkdir(exist_ok=True)
        monkeypatch.setitem(determinism.CHECKSUMS, "dir", str(folder))
        monkeypatch.setattr(determinism, "PROCESS", process)
        determinism.record(key, result, made)

    write(tmp_path / "a", "p1", Result(o, torch.zeros(2), None))
    write(tmp_path / "a", "p1", Result(o, None, None), key="test_determinism[k:fn-other]")
    write(tmp_path / "same", "p2", Result(o.clone(), torch.zeros(2), None))
    assert determinism.differences(tmp_path / "a", tmp_path / "same") == determinism.Differences(
        {}, ["test_determinism[k:fn-other]"], []
    )
    write(tmp_path / "b", "p2", Result(o, torch.full((2,), 1e-30), None))
    assert determinism.differences(tmp_path / "a", tmp_path / "b").differ == {f"test_determinism[k:fn-{CASE}]": ["lse"]}
    write(tmp_path / "c", "p2", Result(o + 1, torch.zeros(2), None), made=(torch.zeros(3), torch.arange(4)))
    assert determinism.differences(tmp_path / "a", tmp_path / "c").unlike_inputs == [f"test_determinism[k:fn-{CASE}]"]


def test_a_difference_across_processes_fails_the_case_naming_case_and_tensor():
    cases = [
        _case("test_determinism", "pass"),
        _case("test_determinism", "pass", CASE.replace("s0", "s1")),
        _case("test_parity", "pass"),
    ]
    key = cases[0].nodeid.rpartition("::")[2]
    out, blocking = across_processes(cases, determinism.Differences({key: ["o", "dk"]}, ["test_determinism[k:fn-x]"], []))
    assert [c.outcome for c in out] == ["fail", "pass", "pass"]
    assert f"[{CASE}] o: not bitwise identical across processes" in out[0].message and "so do dk's" in out[0].message
    assert triage.signature(out[0]).startswith("o: not bitwise identical across processes")
    assert blocking and "1 case(s) ran once and never in a second process" in blocking[0]
