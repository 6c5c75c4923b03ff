"""The Docker backend of the lane runner: its logic against a fake docker-py client, and
the CPU lane end to end on a real engine (the one .ci/docker_engine.sh starts) with the
JUnit that comes out of the container fed through the gate."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import tarfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from selgate.lanes import docker_backend, runner
from selgate.lanes.config import lane_names, load_lane
from selgate.reports import gate

DeviceRequest = pytest.importorskip("docker.types", reason="docker-py is not installed (only --docker needs it)").DeviceRequest
ROOT = Path(__file__).resolve().parents[2]
ENGINE_ENV = ROOT / "build" / "docker-engine.env"  # written by .ci/docker_engine.sh
TRANSCRIPT = ROOT / "build" / "docker-engine-test.log"


class FakeContainer:
    """`interrupt`: the first log stream ends in KeyboardInterrupt; after a SIGINT the logs go
    on with `after_kill` (pytest writing its results) and the status becomes `status_after_kill`."""

    def __init__(self, chunks, status, interrupt=False, after_kill=(), status_after_kill=2):
        self.chunks, self.status, self.interrupt, self.removed = chunks, status, interrupt, False
        self.after_kill, self.status_after_kill, self.killed = list(after_kill), status_after_kill, []

    def logs(self, stream, follow):
        assert stream and follow
        if self.killed:
            yield from self.after_kill
            return
        yield from self.chunks
        if self.interrupt:
            raise KeyboardInterrupt

    def kill(self, signal):
        self.killed.append(signal)
        self.status = self.status_after_kill

    def wait(self):
        return {"StatusCode": self.status}

    def remove(self, force):
        self.removed = force


class FakeClient:
    """The slice of docker.DockerClient the backend uses, recording each call."""

    def __init__(self, container=None, build_chunks=(), images=()):
        self.container = container or FakeContainer([b"1 passed\n"], 0)
        self.build_chunks, self.images_present = list(build_chunks), set(images)
        self.builds, self.runs, self.pulls = [], [], []
        self.api = SimpleNamespace(build=self._build)
        self.containers = SimpleNamespace(run=self._run)
        self.images = SimpleNamespace(get=self._get, pull=self._pull)

    def _build(self, **kw):
        self.builds.append(kw)
        yield from self.build_chunks or [{"stream": "Step 1/1 : FROM base\n"}]

    def _run(self, image, command, **kw):
        self.runs.append((image, command, kw))
        return self.container

    def _get(self, tag):
        import docker

        if tag not in self.images_present:
            raise docker.errors.ImageNotFound(f"No such image: {tag}")

    def _pull(self, tag):
        import docker

        self.pulls.append(tag)
        raise docker.errors.APIError("pull access denied", explanation=f"pull access denied for {tag}")


def run(lane, client, tmp_path, env=None, args=("tests",)):
    out = io.StringIO()
    status = docker_backend.run_lane_in_docker(
        lane,
        pytest_args=list(args),
        env=env or {"SELGATE_LANE": lane["name"]},
        reports_dir=tmp_path / "out" / lane["name"],
        cache_dir=tmp_path / "cache",
        extension_cache_dir=tmp_path / "cuda",
        client=client,
        out=out,
    )
    return status, out.getvalue()


def test_cpu_lane_builds_its_image_mounts_reports_and_cache_and_returns_pytest_status(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("SELGATE_DOCKER_BUILD_ARGS", raising=False)
    # a multi-byte character split across two log chunks must survive the streaming
    client = FakeClient(FakeContainer([b"collected 2 items\n\xe2\x9c", b"\x93 1 failed\n"], 1))
    status, out = run(load_lane("cpu"), client, tmp_path, args=["tests", "-k", "x"])
    assert status == 1
    assert "Step 1/1 : FROM base" in out and "collected 2 items\n\u2713 1 failed" in out
    (build,) = client.builds
    assert build["dockerfile"] == "docker/cpu.Dockerfile" and build["tag"] == "selgate:cpu"
    assert build["buildargs"] == {"BASE_IMAGE": "python:3.11-slim"} and build["network_mode"] == "host"
    assert build["path"] == str(ROOT)
    ((image, command, kw),) = client.runs
    assert image == "selgate:cpu" and command == ["python", "-m", "pytest", "-p", "no:cacheprovider", "tests", "-k", "x"]
    assert kw["user"] == f"{os.getuid()}:{os.getgid()}"  # root too: the image's own user is not
    assert kw["device_requests"] is None and kw["working_dir"] == "/opt/selgate" and kw["detach"]
    assert kw["volumes"] == {
        str(tmp_path / "out" / "cpu"): {"bind": "/opt/selgate/reports/out/cpu", "mode": "rw"},
        str(tmp_path / "cache"): {"bind": "/cache/triton", "mode": "rw"},
        str(tmp_path / "cuda"): {"bind": "/cache/cuda", "mode": "rw"},
    }
    assert kw["environment"]["TRITON_CACHE_DIR"] == "/cache/triton" and kw["environment"]["SELGATE_LANE"] == "cpu"
    assert kw["environment"]["SELGATE_CUDA_CACHE"] == "/cache/cuda"
    assert kw["environment"]["SELGATE_COMMIT"]  # the image holds no .git for the stamp to read
    assert client.container.removed and (tmp_path / "out" / "cpu").is_dir()


def test_gpu_lane_requests_every_gpu(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    client = FakeClient()
    assert run(load_lane("sm90"), client, tmp_path)[0] == 0
    assert client.builds[0]["dockerfile"] == "docker/gpu.Dockerfile"
    assert client.runs[0][2]["device_requests"] == [DeviceRequest(count=-1, capabilities=[["gpu"]])]


def test_gpu_lane_gets_only_the_visible_gpus_renumbered_inside(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1, GPU-8d5e")
    client = FakeClient()
    run(load_lane("sm89"), client, tmp_path, env={"SELGATE_LANE": "sm89", "CUDA_VISIBLE_DEVICES": "1,GPU-8d5e"})
    kw = client.runs[0][2]
    assert kw["device_requests"] == [DeviceRequest(device_ids=["1", "GPU-8d5e"], capabilities=[["gpu"]])]
    assert "CUDA_VISIBLE_DEVICES" not in kw["environment"]


def test_gpu_lane_with_no_visible_gpu_stops_with_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    client = FakeClient()
    assert run(load_lane("sm90"), client, tmp_path)[0] == docker_backend.ENGINE_ERROR
    assert capsys.readouterr().err == "error: lane sm90 needs a GPU, but CUDA_VISIBLE_DEVICES='' names none\n"
    assert not client.runs


def test_an_interrupted_container_gets_sigint_and_is_followed_until_pytest_wrote_its_results(tmp_path):
    client = FakeClient(FakeContainer([b"running\n"], 0, interrupt=True, after_kill=[b"generated xml file: junit.xml\n"]))
    status, out = run(load_lane("cpu"), client, tmp_path)
    assert status == 2 and client.container.killed == ["SIGINT"] and client.container.removed
    assert out.index("interrupted: SIGINT to pytest") < out.index("generated xml file")


def test_failed_build_stops_before_any_container_with_one_line(tmp_path, capsys):
    client = FakeClient(
        build_chunks=[
            {"stream": "Step 1/9 : FROM x\n"},
            {"error": "The command '/bin/sh -c pip install' returned a non-zero code: 1\n"},
        ]
    )
    assert run(load_lane("cpu"), client, tmp_path)[0] == docker_backend.ENGINE_ERROR
    assert capsys.readouterr().err == (
        "error: docker build of selgate:cpu from docker/cpu.Dockerfile failed: "
        "The command '/bin/sh -c pip install' returned a non-zero code: 1\n"
    )
    assert not client.runs


def test_lane_without_dockerfile_reuses_its_tag_or_says_it_is_missing(tmp_path, capsys):
    lane = {**load_lane("cpu"), "image": "selgate:prebuilt"}
    client = FakeClient(images={"selgate:prebuilt"})
    assert run(lane, client, tmp_path)[0] == 0
    assert not client.builds and client.runs[0][0] == "selgate:prebuilt"

    client = FakeClient()
    assert run(lane, client, tmp_path)[0] == docker_backend.ENGINE_ERROR
    assert client.pulls == ["selgate:prebuilt"] and not client.runs
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "image selgate:prebuilt is neither on the engine nor pullable" in err


def test_no_reachable_engine_is_one_clear_line_and_a_nonzero_exit(tmp_path, monkeypatch, capsys):
    sock = tmp_path / "no-engine.sock"
    monkeypatch.setenv("DOCKER_HOST", f"unix://{sock}")
    status = docker_backend.run_lane_in_docker(
        load_lane("cpu"), pytest_args=["tests"], env={}, reports_dir=tmp_path / "out", cache_dir=tmp_path / "cache"
    )
    assert status == docker_backend.ENGINE_ERROR
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert captured.err.startswith(f"error: no Docker engine reachable at unix://{sock} (")


def test_build_args_from_the_environment_override_the_lane(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SELGATE_DOCKER_BUILD_ARGS", "BASE_IMAGE=local/debian:12 PIP_NO_INDEX=1")
    client = FakeClient()
    run(load_lane("cpu"), client, tmp_path)
    assert client.builds[0]["buildargs"] == {"BASE_IMAGE": "local/debian:12", "PIP_NO_INDEX": "1"}

    monkeypatch.setenv("SELGATE_DOCKER_BUILD_ARGS", "BASE_IMAGE")
    client = FakeClient()
    assert run(load_lane("cpu"), client, tmp_path)[0] == docker_backend.ENGINE_ERROR
    assert capsys.readouterr().err == (
        "error: SELGATE_DOCKER_BUILD_ARGS: expected space-separated KEY=VALUE items, got 'BASE_IMAGE'\n"
    )
    assert not client.builds and not client.runs


@pytest.mark.parametrize("lane", lane_names())
def test_every_lane_image_builds_from_a_dockerfile_taking_base_image(lane):
    tag, dockerfile, build_args = docker_backend.image_spec(load_lane(lane))
    text = (ROOT / dockerfile).read_text()
    assert re.search(r"^ARG BASE_IMAGE=\S+", text, re.M) and "FROM ${BASE_IMAGE}" in text
    assert tag == f"selgate:{lane}" and build_args["BASE_IMAGE"]


def engine_settings() -> dict:
    """What .ci/docker_engine.sh left in build/docker-engine.env, or a skip with its reason."""
    if not ENGINE_ENV.exists():
        pytest.skip(
            f"no Docker engine prepared: {ENGINE_ENV.relative_to(ROOT)} is absent "
            "(`bash .ci/docker_engine.sh`, as root, starts one and writes it)"
        )
    settings = dict(line.split("=", 1) for line in ENGINE_ENV.read_text().splitlines() if "=" in line)
    if "DOCKER_UNAVAILABLE" in settings:
        pytest.skip(f"no Docker engine: {settings['DOCKER_UNAVAILABLE']} (from .ci/docker_engine.sh)")
    return settings


def image_tree(client, tag: str, dest: Path) -> Path:
    """The image's copy of the sources (its WORKDIR), extracted under `dest`."""
    container = client.containers.create(tag)
    try:
        stream, _ = container.get_archive(docker_backend.WORKDIR)
        archive = dest.with_suffix(".tar")
        with archive.open("wb") as f:
            for chunk in stream:
                f.write(chunk)
    finally:
        container.remove(force=True)
    dest.mkdir(parents=True)
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")
    return dest / Path(docker_backend.WORKDIR).name


@pytest.mark.timeout(900)
def test_cpu_lane_runs_in_a_real_container_and_its_junit_passes_the_gate(tmp_path, monkeypatch, capsys):
    settings = engine_settings()
    from selgate.reports.__main__ import main as reports_main

    monkeypatch.setenv("DOCKER_HOST", settings["DOCKER_HOST"])
    monkeypatch.setenv("SELGATE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(runner, "OUT_ROOT", tmp_path / "out")
    offline = " PIP_NO_INDEX=1" if settings.get("SELGATE_DOCKER_OFFLINE") == "1" else ""
    monkeypatch.setenv("SELGATE_DOCKER_BUILD_ARGS", f"BASE_IMAGE={settings['SELGATE_DOCKER_BASE_IMAGE']}{offline}")
    lane = load_lane("cpu")
    lane["image"] = {**lane["image"], "tag": "selgate:cpu-ci"}  # leaves a user's selgate:cpu alone
    # The CPU lane's own selection, narrowed to its policy checks (three subprocess probes).
    plan = runner.plan_lane(lane, capability=None, workers=1, policy_only=True)
    assert runner.run_plan(plan, docker=True) == 0
    junit = tmp_path / "out" / "cpu" / "junit.xml"
    assert junit.exists() and (junit.parent / "environment.json").exists()

    # The gate on that JUnit, as a lane of its own: cpu.yaml's required families need the
    # whole matrix, which this test does not run; every other rule of the gate applies. The
    # copy's environment.json is renamed with it (the gate blocks results of another lane).
    shutil.copytree(junit.parent, tmp_path / "results" / "docker-cpu")
    env_file = tmp_path / "results" / "docker-cpu" / "environment.json"
    env_file.write_text(json.dumps({**json.loads(env_file.read_text()), "lane": "docker-cpu"}))
    policy = tmp_path / "gate.yaml"
    policy.write_text(
        yaml.safe_dump(
            {
                "default_profile": "merge",
                "required_families": ["policy"],
                "profiles": {"merge": {"required_lanes": ["docker-cpu"]}},
                "quarantine": [],
            }
        )
    )
    # The gated tree is the one the image was built from (the build context less .dockerignore),
    # copied out of the image, under the commit the run named: the stamps must then agree.
    tree = image_tree(docker_backend.connect(), "selgate:cpu-ci", tmp_path / "image")
    # the renamed lane has no lane YAML by construction; that rule has its own tests
    monkeypatch.setattr(gate, "lane_yaml_missing", lambda name, cfg: [])
    monkeypatch.setenv("SELGATE_COMMIT", json.loads(env_file.read_text())["tree"]["commit"])
    gate_status = reports_main(
        [
            "gate",
            "--policy",
            str(policy),
            "--results",
            str(tmp_path / "results"),
            "--out",
            str(tmp_path / "gate"),
            "--tree",
            str(tree),
        ]
    )

    # A failing run inside the container comes back as its exit status (pytest: 4, no such file).
    assert runner.run_plan(runner.LanePlan(lane, "cpu", ["tests/no_such_file.py"], {}, tmp_path / "cache"), docker=True) == 4

    transcript = capsys.readouterr().out
    TRANSCRIPT.write_text(transcript)
    assert gate_status == 0, transcript[-3000:]
    assert "Successfully tagged selgate:cpu-ci" in transcript and "3 passed" in transcript
    assert "GATE PASSED: required lanes docker-cpu" in transcript
