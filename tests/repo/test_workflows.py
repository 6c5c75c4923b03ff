"""The GitHub workflows' gate logic: the gate job runs whatever its needs did (`if:
always()`) and then fails unless every lane this event needs succeeded; a failed,
cancelled or skipped lane is never a pass (.github/scripts/check_needs.py). And their
trust properties: no fork's code on a GPU runner without an environment approval, caches
kept apart by trust level, actions pinned by commit, no persisted checkout credentials,
superseded runs cancelled, images that run unprivileged."""

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

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"
CHECK_NEEDS = ROOT / ".github" / "scripts" / "check_needs.py"

spec = importlib.util.spec_from_file_location("check_needs", CHECK_NEEDS)
check_needs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check_needs)


def workflow(name: str) -> dict:
    doc = yaml.safe_load((WORKFLOWS / name).read_text())
    doc["on"] = doc.pop(True)  # YAML 1.1 reads the key `on` as a boolean
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
    assert blocked.stderr.splitlines() == [
        "gate blocked: cpu: cancelled (a cancelled lane is not a pass)",
        "gate blocked: gpu: skipped (a skipped lane is not a pass)",
        "gate blocked: sm89: skipped (a skipped lane is not a pass)",
    ]
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
    # The approval job is skipped whenever the code is trusted; its failure (a rejection) still blocks.
    assert requested["gpu"] == "true" and requested["may_skip"] == "approve"
    assert not_requested["gpu"] == "false" and set(not_requested["may_skip"].split(",")) == conditional
    assert conditional == {"approve", "gpu", "sm89"}
    for branch in (requested, not_requested):
        assert set(branch["lanes"].split(",")) <= set(lane_names()) and "cpu" in branch["lanes"]


def test_every_lane_the_workflows_run_exists_and_uploads_its_results():
    gpu_lanes = workflow("conformance-gpu.yml")["jobs"]["lane"]["strategy"]["matrix"]["lane"]
    sm89 = workflow("conformance-sm89.yml")["jobs"]["lane"]["with"]["lane"]
    assert set(plan_outputs()[0]["lanes"].split(",")) == {"cpu", *gpu_lanes, sm89}
    lane_job = workflow("lane-in-docker.yml")["jobs"]["lane"]
    assert lane_job["runs-on"] == ["self-hosted", "linux", "x64", "gpu", "${{ inputs.lane }}"]
    assert any("--gpus all" in s.get("run", "") for s in lane_job["steps"])
    uploads = [
        s["with"]["name"]
        for s in lane_job["steps"] + MERGE["jobs"]["cpu"]["steps"]
        if s.get("uses", "").startswith("actions/upload-artifact")
    ]
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


# --- Trust properties ----------------------------------------------------------------------

ALL = sorted(p.name for p in WORKFLOWS.glob("*.yml"))
DOCKERFILES = sorted((ROOT / "docker").glob("*.Dockerfile"))
REPO = "owner/selgate"


def evaluate(expr, ctx: dict, results: dict | None = None):
    """A GitHub expression (the subset these workflows use) under `ctx`: dotted context names
    to values, missing names are null; `needs.<job>.result` comes from `results`."""
    expr = str(expr).strip()
    if expr.startswith("${{") and expr.endswith("}}"):
        expr = expr[3:-2]
    lookup = {**ctx, **{f"needs.{j}.result": r for j, r in (results or {}).items()}}
    out = []
    for m in re.finditer(r"\s+|'(?:[^']|'')*'|&&|\|\||==|!=|!|\(|\)|,|[A-Za-z_][\w.*-]*", expr):
        tok = m.group()
        if tok.isspace():
            out.append(" ")
        elif tok.startswith("'"):
            out.append(repr(tok[1:-1].replace("''", "'")))
        elif tok in ("&&", "||", "!"):
            out.append({"&&": " and ", "||": " or ", "!": " not "}[tok])
        elif tok in ("true", "false", "null"):
            out.append({"true": "True", "false": "False", "null": "None"}[tok])
        elif re.fullmatch(r"[A-Za-z_][\w.*-]*", tok) and expr[m.end() :].lstrip().startswith("("):
            out.append(f"fn_{tok}")
        elif re.fullmatch(r"[A-Za-z_][\w.*-]*", tok):
            out.append(f"ctx({tok!r})")
        else:
            out.append(tok)
    consumed = "".join(m.group() for m in re.finditer(r"\s+|'(?:[^']|'')*'|&&|\|\||==|!=|!|\(|\)|,|[A-Za-z_][\w.*-]*", expr))
    assert consumed == expr, f"expression outside the evaluator's subset: {expr!r}"
    funcs = {
        "fn_cancelled": lambda: False,
        "fn_always": lambda: True,
        "fn_success": lambda: all(r == "success" for r in (results or {}).values()),
        "fn_startsWith": lambda a, b: str(a or "").lower().startswith(str(b).lower()),
        "fn_contains": lambda a, b: b in (a or []),
        "fn_format": lambda f, *a: re.sub(r"\{(\d+)\}", lambda g: str(a[int(g.group(1))] or ""), f),
    }
    return eval("".join(out), {"__builtins__": {}}, {"ctx": lookup.get, **funcs})  # noqa: S307 (test-only subset)


def event(name="pull_request", *, fork=False, ref=None, gpu="true", labels=("gpu-lanes",)) -> dict:
    """The contexts of an event on REPO; a pull request from a fork when `fork`."""
    ctx = {
        "github.event_name": name,
        "github.repository": REPO,
        "needs.plan.outputs.gpu": gpu,
        "github.ref": ref or ("refs/pull/7/merge" if name == "pull_request" else "refs/heads/main"),
    }
    ctx["github.ref_name"] = ctx["github.ref"].split("/", 2)[-1]
    if name == "pull_request":
        ctx.update(
            {
                "github.event.pull_request.number": 7,
                "github.event.pull_request.labels.*.name": list(labels),
                "github.event.pull_request.head.repo.full_name": "fork/selgate" if fork else REPO,
            }
        )
    return ctx


def local_workflow(uses: str) -> str | None:
    prefix = "./.github/workflows/"
    return uses[len(prefix) :] if uses.startswith(prefix) else None


def reaches_self_hosted(job: dict) -> bool:
    """The job runs on a self-hosted runner, itself or through the reusable workflows it calls."""
    if "self-hosted" in json.dumps(job.get("runs-on", "")):
        return True
    called = local_workflow(job.get("uses", ""))
    return bool(called) and any(reaches_self_hosted(j) for j in workflow(called)["jobs"].values())


def pr_triggered() -> list[str]:
    return [n for n in ALL if {"pull_request", "pull_request_target"} & set(workflow(n)["on"] or {})]


def test_no_workflow_runs_pull_request_code_with_the_base_repositorys_privileges():
    for name in ALL:
        assert "pull_request_target" not in (workflow(name)["on"] or {}), name
        assert "workflow_run" not in (workflow(name)["on"] or {}), name


def gpu_jobs(name: str) -> dict:
    return {j: spec for j, spec in workflow(name)["jobs"].items() if reaches_self_hosted(spec)}


def approval_jobs(jobs: dict) -> dict:
    """Jobs behind an environment (a fixed name: its required reviewers approve each run)."""
    return {
        j: spec
        for j, spec in jobs.items()
        if isinstance(spec.get("environment"), (str, dict)) and "${{" not in json.dumps(spec["environment"])
    }


@pytest.mark.parametrize("name", pr_triggered())
def test_a_forks_pull_request_reaches_a_gpu_runner_only_after_an_environment_approval(name):
    jobs = workflow(name)["jobs"]
    gpu, approvals = gpu_jobs(name), approval_jobs(jobs)
    assert gpu, f"{name}: expected its GPU jobs to be found"
    for job, spec in gpu.items():
        gates = [a for a in needs_of(spec) if a in approvals]
        assert gates, f"{name}: {job} runs on a GPU runner but needs no job behind an environment"
        cond = spec.get("if", "success()")
        assert "label" not in cond, f"{name}: {job}: a label must not decide whether code is trusted"
        others = {j: "success" for j in needs_of(spec)}
        for refused in ("skipped", "failure", "cancelled"):
            # a fork, labelled, with the approval not given: never
            assert not evaluate(cond, event(fork=True), {**others, **dict.fromkeys(gates, refused)}), (job, refused)
        assert evaluate(cond, event(fork=True), {**others, **dict.fromkeys(gates, "success")}), job
        # this repository's own branches, and code already in it, need no approval
        for ctx in (
            event(fork=False),
            event("push"),
            event("merge_group", ref="refs/heads/gh-readonly-queue/main/x"),
            event("workflow_dispatch"),
        ):
            assert evaluate(cond, ctx, {**others, **dict.fromkeys(gates, "skipped")}), (job, ctx["github.event_name"])
        assert not evaluate(cond, event(fork=False, gpu="false"), others), job
    for job, spec in approvals.items():
        assert not reaches_self_hosted(spec), job
        assert evaluate(spec["if"], event(fork=True), {}) and not evaluate(spec["if"], event(fork=False), {}), job


def test_the_gpu_workflows_have_no_trigger_of_their_own_that_a_pull_request_can_fire():
    for name in ("conformance-gpu.yml", "conformance-sm89.yml", "lane-in-docker.yml"):
        assert set(workflow(name)["on"]) <= {"workflow_call", "workflow_dispatch", "schedule"}, name


def uses_lines(name: str) -> list[tuple[str, str]]:
    """(action reference, the comment after it) for every `uses:` of a workflow's text."""
    return re.findall(r"^\s*(?:-\s+)?uses:\s*([^\s#]+)\s*(?:#\s*(.*))?$", (WORKFLOWS / name).read_text(), re.M)


@pytest.mark.parametrize("name", ALL)
def test_every_action_is_pinned_by_full_commit_with_its_tag_in_a_comment(name):
    parsed = [s["uses"] for job in workflow(name)["jobs"].values() for s in [job, *job.get("steps", [])] if "uses" in s]
    found = uses_lines(name)
    assert sorted(ref for ref, _ in found) == sorted(parsed)
    for ref, comment in found:
        if local_workflow(ref):
            continue
        assert re.fullmatch(r"[\w.-]+/[\w./-]+@[0-9a-f]{40}", ref), f"{name}: {ref} is not pinned by commit"
        assert re.match(r"v\d+(\.\d+)*\b", comment or ""), f"{name}: {ref} has no `# vX.Y.Z` comment"


@pytest.mark.parametrize("name", ALL)
def test_every_checkout_drops_its_credentials(name):
    for job in workflow(name)["jobs"].values():
        for step in job.get("steps", []):
            if step.get("uses", "").startswith("actions/checkout@"):
                assert (step.get("with") or {}).get("persist-credentials") is False, (name, step)


@pytest.mark.parametrize("name", [n for n in ALL if set(workflow(n)["on"]) != {"workflow_call"}])
def test_superseded_runs_are_cancelled(name):
    conc = workflow(name).get("concurrency")
    assert isinstance(conc, dict) and conc.get("group"), f"{name}: no concurrency group"
    # a literal prefix of its own: called from another workflow, the groups stay apart
    assert conc["group"].startswith(name.removesuffix(".yml") + "-"), conc["group"]
    pr = event(fork=True) if name in pr_triggered() else event("workflow_dispatch", ref="refs/heads/topic")
    assert evaluate(conc["cancel-in-progress"], pr) is True, name
    assert evaluate(conc["cancel-in-progress"], event("push", ref="refs/tags/v1.0")) is False, name


def cache_steps() -> list[tuple[str, dict, dict]]:
    return [
        (name, job, step)
        for name in ALL
        for job in workflow(name)["jobs"].values()
        for step in job.get("steps", [])
        if step.get("uses", "").startswith("actions/cache")
    ]


def test_caches_are_kept_apart_by_trust_level():
    steps = cache_steps()
    assert {s["uses"].split("@")[0] for _, _, s in steps} == {"actions/cache/restore", "actions/cache/save"}
    for name, job, step in steps:
        scope_expr = job["env"]["CACHE_SCOPE"]

        def scope(ctx):
            return evaluate(scope_expr, ctx)

        def key(text, ctx):  # the key with its expressions evaluated
            return re.sub(
                r"\$\{\{(.*?)\}\}",
                lambda m: str(
                    evaluate(m.group(1), {**ctx, "inputs.lane": "sm90", "github.sha": "abc", "env.CACHE_SCOPE": scope(ctx)})
                ),
                text,
            )

        main = event("push")
        untrusted = [
            event(fork=True),
            event(fork=False),
            event("merge_group", ref="refs/heads/gh-readonly-queue/main/x"),
            event("push", ref="refs/tags/v1.0"),
            event("workflow_dispatch", ref="refs/heads/topic"),
        ]
        assert scope(main) == "main" and scope(event("schedule")) == "main"
        assert all(scope(ctx) != "main" for ctx in untrusted)
        assert len({scope(ctx) for ctx in untrusted[1:]}) == len(untrusted) - 1
        assert step["with"]["path"].startswith("${{ runner.temp }}/")
        for ctx in untrusted:
            written = key(step["with"]["key"], ctx)
            assert "-main-" not in written, (name, written)  # never writes main's cache
            for prefix in step["with"].get("restore-keys", "").splitlines():
                read = key(prefix, ctx)
                assert read in (f"selgate-sm90-{scope(ctx)}-", "selgate-sm90-main-"), read
    keys = {(s["uses"].split("@")[0], s["with"]["key"]) for _, _, s in steps}
    assert len({k for _, k in keys}) == 1, "save writes under the key that restore looks for first"


def test_no_persistent_runner_directory_is_mounted_into_a_container():
    for name in ALL:
        for job in workflow(name)["jobs"].values():
            for step in job.get("steps", []):
                for src in re.findall(r"-v\s+\"?([^\s:\"]+):", step.get("run", "")):
                    assert src.startswith(("$PWD/", "$RUNNER_TEMP/", "$GITHUB_STEP_SUMMARY")), (name, src)


def final_stage(text: str) -> list[str]:
    lines = re.sub(r"\\\n", " ", text).splitlines()
    start = max(i for i, line in enumerate(lines) if line.upper().startswith("FROM "))
    return [line.strip() for line in lines[start:] if line.strip() and not line.lstrip().startswith("#")]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_images_run_unprivileged_over_a_tree_no_one_else_can_write(dockerfile):
    text = dockerfile.read_text()
    stage = final_stage(text)
    users = [line.split(None, 1)[1] for line in stage if line.upper().startswith("USER ")]
    assert users, f"{dockerfile.name}: the image runs as root"
    assert users[-1].split(":")[0] not in ("root", "0"), users[-1]
    assert not re.search(r"chmod\s[^\n&;|]*(a\+\w*w|o\+\w*w|\b[0-7]?[0-7][0-7][2367]\b)", text), (
        f"{dockerfile.name}: world-writable files"
    )
    # the wheels of .whl/ stay in an earlier stage: the image copies nothing from the context but through stages
    assert all("--from=" in line for line in stage if line.upper().startswith(("COPY ", "ADD "))), dockerfile.name


def test_the_build_context_leaves_results_evidence_and_environments_out():
    ignored = {
        line.strip().rstrip("/")
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {"evidence", "reports/out", "bench/results", ".venv", ".git", "build"} <= ignored
