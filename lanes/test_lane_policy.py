"""The running lane's policy checks (`policy:` in lanes/<lane>.yaml) as tests; the lane
runner adds this file to every lane run, with SELGATE_LANE naming the lane."""

import json

import pytest

from selgate import env_vars
from selgate.lanes.config import load_lane
from selgate.lanes.policy import judge, probe_in_subprocess

LANE = env_vars.get("SELGATE_LANE", "").removesuffix("-emulated")
CHECKS = load_lane(LANE)["policy"] if LANE else []


@pytest.mark.policy
@pytest.mark.skipif(not LANE, reason="SELGATE_LANE is unset: run through `python -m selgate.lanes run`")
@pytest.mark.parametrize("check", CHECKS, ids=[c["name"] for c in CHECKS])
def test_lane_policy(check, request):
    stats = probe_in_subprocess(check["env"])
    request.node.user_properties.append(("counters", json.dumps(stats, sort_keys=True)))  # evidence in JUnit
    ok, why = judge(check, stats)
    assert ok, why
