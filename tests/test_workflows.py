"""The GitHub workflows' gate logic: the gate job runs whatever its needs did (`if:
always()`) and then fails unless every lane this event needs succeeded; a failed,
cancelled or skipped lane is never a pass (.github/scripts/check_needs.py)."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from selgate.lanes.config import lane_names

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = ROOT / ".github" / "workflows"
CHECK_NEEDS = ROOT / ".github" / "scripts" / "check_needs.py"

spec = importlib.util.spec_from_file_location("check_needs", CHECK_NEEDS)
check_needs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check_needs)


def workflow(name: str) -> dict:
    doc = yaml.safe_load((WORKFLOWS / name).read_text())
    doc["on"] = doc.pop(True)   # YAML 1.1 reads the key `on` as a boolean
    return doc


def needs_of(job: dict) -> list:
    needs = job.get("needs", [])
    return [needs] if isinstance(needs, str) else list(needs)


def results(jobs, **overrides) -> dict:
    return {job: {"result": overrides.get(job, "success"), "outputs": {}} for job in jobs}


MERGE = workflow("conformance-cpu.yml")
GATE = MERGE["jobs"]["gate"]


@pytest.mark.parametrize("result", ["failure", "cancelled", "skipped"])
@pytest.mark.parametrize("lane", needs_of(GATE))
def test_a_failed_cancelled_or_skipped_lane_fails_the_gate(lane, result):
    lines = check_needs.blocking(results(needs_of(GATE), **{lane: result}))
    assert len(lines) == 1 and lines[0].startswith(f"{lane}: {result} (")


def test_the_gate_passes_only_when_every_needed_job_succeeded():
    assert check_needs.blocking(results(needs_of(GATE))) == []
    assert check_needs.blocking({}) == ["no jobs in needs: the gate has nothing to vouch for"]


@pytest.mark.parametrize("result, blocks", [("skipped", False), ("failure", True), ("cancelled", True)])
def test_unrequested_lanes_may_be_skipped_but_never_fail_or_cancel(result, blocks):
    needs = results(needs_of(GATE), gpu=result, sm89=result)
    assert bool(check_needs.blocking(needs, may_skip={"gpu", "sm89"})) == blocks


def run_check_needs(needs, *args):
    env = {**os.environ, "NEEDS": json.dumps(needs) if needs is not None else "not json"}
    return subprocess.run([sys.executable, str(CHECK_NEEDS), *args], env=env, capture_output=True, text=True)


def test_check_needs_command_line_as_the_gate_job_runs_it():
    ok = run_check_needs(results(needs_of(GATE), gpu="skipped", sm89="skipped"), "--may-skip", "gpu,sm89")
    assert ok.returncode == 0 and "needs.gpu.result = skipped (may skip)" in ok.stdout
    blocked = run_check_needs(results(needs_of(GATE), cpu="cancelled", gpu="skipped", sm89="skipped"), "--may-skip", "")
    assert blocked.returncode == 1
    assert blocked.stderr.splitlines() == ["gate blocked: cpu: cancelled (a cancelled lane is not a pass)",
                                           "gate blocked: gpu: skipped (a skipped lane is not a pass)",
                                           "gate blocked: sm89: skipped (a skipped lane is not a pass)"]
    assert run_check_needs(None).returncode == 2


def plan_outputs() -> list[dict]:
    """The plan job's two branches: {gpu, lanes, may_skip} as its script writes them."""
    script = MERGE["jobs"]["plan"]["steps"][0]["run"]
    return [dict(re.findall(r"echo (\w+)=([\w,]*)", branch)) for branch in script.split("else")]


@pytest.mark.parametrize("name, job", [("conformance-cpu.yml", "gate"), ("release-gate.yml", "release")])
def test_gate_jobs_run_always_need_every_other_job_and_check_their_results(name, job):
    jobs = workflow(name)["jobs"]
    gate = jobs[job]
    assert gate["if"] == "always()"
    assert sorted(needs_of(gate)) == sorted(j for j in jobs if j != job)
    check = [s for s in gate["steps"] if ".github/scripts/check_needs.py" in s.get("run", "")]
    assert len(check) == 1 and check[0]["env"]["NEEDS"] == "${{ toJSON(needs) }}"


def test_only_the_conditional_gpu_jobs_may_be_skipped_and_only_when_not_requested():
    conditional = {j for j, spec in MERGE["jobs"].items() if "needs.plan.outputs.gpu == 'true'" in spec.get("if", "")}
    requested, not_requested = plan_outputs()
    assert requested["gpu"] == "true" and requested["may_skip"] == ""
    assert not_requested["gpu"] == "false" and set(not_requested["may_skip"].split(",")) == conditional
    assert conditional == {"gpu", "sm89"}
    for branch in (requested, not_requested):
        assert set(branch["lanes"].split(",")) <= set(lane_names()) and "cpu" in branch["lanes"]


def test_every_lane_the_workflows_run_exists_and_uploads_its_results():
    gpu_lanes = workflow("conformance-gpu.yml")["jobs"]["lane"]["strategy"]["matrix"]["lane"]
    sm89 = workflow("conformance-sm89.yml")["jobs"]["lane"]["with"]["lane"]
    assert set(plan_outputs()[0]["lanes"].split(",")) == {"cpu", *gpu_lanes, sm89}
    lane_job = workflow("lane-in-docker.yml")["jobs"]["lane"]
    assert lane_job["runs-on"] == ["self-hosted", "linux", "x64", "gpu", "${{ inputs.lane }}"]
    assert any("--gpus all" in s.get("run", "") for s in lane_job["steps"])
    uploads = [s["with"]["name"] for s in lane_job["steps"] + MERGE["jobs"]["cpu"]["steps"]
               if s.get("uses", "").startswith("actions/upload-artifact")]
    assert uploads == ["lane-${{ inputs.lane }}", "lane-cpu"]
    download = [s for s in GATE["steps"] if s.get("uses", "").startswith("actions/download-artifact")]
    assert download[0]["with"]["pattern"] == "lane-*"


def test_triggers():
    assert {"push", "pull_request", "merge_group"} <= set(MERGE["on"])
    assert "labeled" in MERGE["on"]["pull_request"]["types"]
    for name in ("conformance-gpu.yml", "conformance-sm89.yml"):
        assert {"workflow_dispatch", "schedule", "workflow_call"} <= set(workflow(name)["on"])
    release = workflow("release-gate.yml")
    assert release["on"]["push"]["tags"] == ["v*"] and "workflow_dispatch" in release["on"]
