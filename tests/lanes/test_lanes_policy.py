"""The lanes' policy checks, run for real: SM 8.9 emulated through the capability override
in the Triton interpreter on CPU tensors, so the counters prove the ADR here too."""

import pytest

from selgate.lanes.config import load_lane
from selgate.lanes.policy import judge, probe_in_subprocess

INTERPRET = {"TRITON_INTERPRET": "1"}


@pytest.fixture(scope="module")
def sm89_checks():
    """The sm89 lane's checks with the counters each produced."""
    return [(c, probe_in_subprocess({**INTERPRET, **c["env"]})) for c in load_lane("sm89")["policy"]]


def test_sm89_policy_holds_both_ways(sm89_checks):
    for check, stats in sm89_checks:
        ok, why = judge(check, stats)
        assert ok, why
    default, forced = (stats for _, stats in sm89_checks)
    assert default["fallback_reasons"] == {"triton:adr_policy": 1} and default["capability"] == "8.9"
    assert forced["launches"].get("triton_fwd", 0) >= 1


def test_a_violated_policy_fails_and_says_why(sm89_checks):
    check, stats = sm89_checks[1]  # forced: Triton launched
    ok, why = judge({**check, "triton_launches": False}, stats)
    assert not ok
    assert "Triton must never launch" in why and "counted 1 Triton launches" in why
