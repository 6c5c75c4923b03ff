"""How a lane spends its wall time: workers per GPU from its memory and the CPUs, costly tests
first from the committed durations, persistent Triton and CUDA extension caches, and the
cross-architecture compile kept out of GPU lanes; the selection itself never changes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from selgate.lanes import __main__ as lanes_main
from selgate.lanes import ordering, runner
from selgate.lanes.config import load_lane
from selgate.lanes.runner import plan_lane, workers_per_gpu
from tests.helpers import run_pytest

H100 = 85_045_526_528  # total_memory torch reports for an 80 GB H100 (HBM3)
H200 = 150_117_466_112


def n_of(plan) -> int:
    return int(plan.pytest_args[plan.pytest_args.index("-n") + 1])


@pytest.mark.parametrize(
    "memory, cpus, gpus, expected",
    [
        (H100, 16, 1, 8),
        (H200, 16, 1, 15),
        (H100, 4, 1, 4),
        (H100, 16, 2, 8),
        (24e9, 8, 1, 2),
        (8e9, 16, 1, 1),
        (H100, 1, 2, 1),
    ],
)
def test_workers_per_gpu_follow_its_memory_and_the_cpus(memory, cpus, gpus, expected):
    assert workers_per_gpu(memory, cpus, gpus) == expected


def test_the_sm90_lane_runs_eight_workers_on_one_h100_and_sixteen_on_two():
    lane = load_lane("sm90")
    assert lane["workers"] == "per_gpu"
    assert n_of(plan_lane(lane, capability="9.0", gpus=1, gpu_memory=H100, cpus=16)) == 8
    assert n_of(plan_lane(lane, capability="9.0", gpus=2, gpu_memory=H100, cpus=32)) == 16
    assert n_of(plan_lane(lane, capability="9.0", gpus=1, gpu_memory=H100, cpus=16, workers=3)) == 3
    with pytest.raises(ValueError, match="workers 'per_gpu' but CUDA_VISIBLE_DEVICES leaves no GPU visible"):
        plan_lane(lane, capability="9.0", gpus=0)


def test_each_worker_gets_its_share_of_the_cores_as_cpu_threads(monkeypatch):
    monkeypatch.delenv(runner.THREADS_ENV, raising=False)

    def threads(lane, cpus):
        plan = plan_lane(load_lane(lane), capability="9.0" if lane == "sm90" else None, gpus=1, gpu_memory=H100, cpus=cpus)
        return plan.env.get(runner.THREADS_ENV), runner.run_env(plan.env)

    assert [threads(*case)[0] for case in (("sm90", 16), ("cpu", 2), ("cpu", 4))] == ["2", "1", "2"]
    probe = "import torch; print(torch.get_num_threads())"  # torch's intra-op pool follows it
    out = subprocess.run([sys.executable, "-c", probe], env=threads("cpu", 2)[1], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "1"
    monkeypatch.setenv(runner.THREADS_ENV, "3")  # the caller's own choice wins: the plan leaves it alone
    kept, env = threads("sm90", 16)
    assert kept is None and env[runner.THREADS_ENV] == "3"


def test_per_gpu_workers_on_a_cpu_lane_are_rejected(tmp_path):
    import yaml

    cfg = {k: v for k, v in load_lane("cpu").items() if k != "name"}
    (tmp_path / "x.yaml").write_text(yaml.safe_dump({**cfg, "workers": "per_gpu"}))
    with pytest.raises(ValueError, match="workers: 'per_gpu' needs device cuda"):
        load_lane("x", tmp_path)


def test_triton_and_extension_caches_persist_under_one_root(tmp_path, monkeypatch):
    monkeypatch.setenv("SELGATE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("SELGATE_CUDA_CACHE", raising=False)
    plan = plan_lane(load_lane("sm90"), capability="9.0", gpus=1, gpu_memory=H100, cpus=16)
    assert plan.env["TRITON_CACHE_DIR"] == str(tmp_path / "cache" / "triton" / "sm90-sm90")
    assert plan.env["SELGATE_CUDA_CACHE"] == str(tmp_path / "cache" / "cuda") == str(plan.extension_cache_dir)
    monkeypatch.setenv("SELGATE_CUDA_CACHE", str(tmp_path / "mine"))  # the caller's own place wins
    assert plan_lane(load_lane("cpu"), capability=None).env["SELGATE_CUDA_CACHE"] == str(tmp_path / "mine")


def test_a_lane_with_committed_durations_names_them_to_its_run(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "DURATIONS_DIR", tmp_path)
    assert ordering.DURATIONS_ENV not in plan_lane(load_lane("cpu"), capability=None).env
    (tmp_path / "cpu.json").write_text('{"tests": {}}')
    named = plan_lane(load_lane("cpu"), capability=None).env[ordering.DURATIONS_ENV]
    assert not os.path.isabs(named) and (runner.ROOT / named).resolve() == (tmp_path / "cpu.json").resolve()


def test_costly_tests_go_first_slowest_first_and_the_rest_keep_their_place():
    items = [SimpleNamespace(nodeid=n) for n in ("a", "b", "c", "d", "e")]
    ordered = ordering.costly_first(items, {"b": 1.0, "d": 30.0, "e": 6.0, "zz": 99.0})
    assert [i.nodeid for i in ordered] == ["d", "e", "a", "b", "c"]
    assert sorted(map(id, ordered)) == sorted(map(id, items))


def test_costly_tests_are_dealt_to_the_workers_first_chunks_slowest_onto_the_least_loaded():
    items = [SimpleNamespace(nodeid=n) for n in "abcdefghij"]
    assert ordering.first_chunks(10, 3) == [3, 3, 4]  # xdist worksteal: 10 // 3, then 7 // 2, then 4
    ordered = ordering.costly_first(items, {"j": 50.0, "b": 30.0, "h": 25.0, "c": 6.0}, workers=3)
    chunks = ["".join(i.nodeid for i in ordered[a:b]) for a, b in ((0, 3), (3, 6), (6, 10))]
    assert chunks == ["jad", "bef", "hcgi"]  # c joins h's chunk, the least loaded (25 s) when c is dealt
    assert sorted(map(id, ordered)) == sorted(map(id, items))


def test_under_xdist_the_costly_tests_start_on_different_workers(tmp_path):
    (tmp_path / "test_mod.py").write_text(
        "import os, pytest\n\n@pytest.mark.parametrize('i', range(8))\ndef test_x(i):\n"
        "    open(f'{i}.worker', 'w').write(os.environ['PYTEST_XDIST_WORKER'])\n"
    )
    durations = tmp_path / "durations.json"
    durations.write_text(json.dumps({"tests": {"test_mod.py::test_x[0]": 40.0, "test_mod.py::test_x[1]": 30.0}}))
    env = {**os.environ, ordering.DURATIONS_ENV: durations.name, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    out = run_pytest(
        tmp_path,
        "-p",
        "xdist.plugin",
        "-p",
        "selgate.lanes.ordering",
        "-p",
        "no:cacheprovider",
        "-n",
        "2",
        "--dist",
        "worksteal",
        "test_mod.py",
        env=env,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert (tmp_path / "0.worker").read_text() != (tmp_path / "1.worker").read_text()


def test_a_malformed_durations_file_is_named(tmp_path):
    path = tmp_path / "sm90.json"
    path.write_text('{"tests": {"a": "slow"}}')
    with pytest.raises(ValueError, match="sm90.json: expected"):
        ordering.load_durations(path)


def test_the_plugin_orders_a_real_collection_the_same_way(tmp_path):
    (tmp_path / "test_mod.py").write_text("import pytest\n\n@pytest.mark.parametrize('i', range(6))\ndef test_x(i):\n    pass\n")
    durations = tmp_path / "durations.json"
    durations.write_text(json.dumps({"tests": {"test_mod.py::test_x[4]": 12.0, "test_mod.py::test_x[2]": 40.0}}))
    env = {**os.environ, ordering.DURATIONS_ENV: durations.name, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}  # from rootdir
    out = run_pytest(
        tmp_path, "--collect-only", "-q", "-p", "selgate.lanes.ordering", "-p", "no:cacheprovider", "test_mod.py", env=env
    )
    ids = [line.split("::")[1] for line in out.stdout.splitlines() if "::" in line]
    assert ids == ["test_x[2]", "test_x[4]", "test_x[0]", "test_x[1]", "test_x[3]", "test_x[5]"], out.stdout + out.stderr


def test_a_slow_marked_test_the_durations_do_not_list_starts_among_the_costly_ones(tmp_path):
    """A lane that skips slow tests records no duration for them; a run that selects them starts
    them after the recorded costly tests, before the rest."""
    (tmp_path / "test_mod.py").write_text(
        "import pytest\n\n@pytest.mark.parametrize('i', range(4))\ndef test_x(i):\n    pass\n\n"
        "@pytest.mark.slow\ndef test_slow():\n    pass\n"
    )
    durations = tmp_path / "durations.json"
    durations.write_text(json.dumps({"tests": {"test_mod.py::test_x[3]": 12.0}}))
    env = {**os.environ, ordering.DURATIONS_ENV: durations.name, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    out = run_pytest(
        tmp_path, "--collect-only", "-q", "-p", "selgate.lanes.ordering", "-p", "no:cacheprovider", "test_mod.py", env=env
    )
    ids = [line.split("::")[1] for line in out.stdout.splitlines() if "::" in line]
    assert ids == ["test_x[3]", "test_slow", "test_x[0]", "test_x[1]", "test_x[2]"], out.stdout + out.stderr


def test_a_missing_durations_file_is_a_usage_error_naming_it(tmp_path):
    (tmp_path / "test_mod.py").write_text("def test_x():\n    pass\n")
    env = {**os.environ, ordering.DURATIONS_ENV: "lanes/durations/cpu.json", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    out = run_pytest(
        tmp_path, "--collect-only", "-q", "-p", "selgate.lanes.ordering", "-p", "no:cacheprovider", "test_mod.py", env=env
    )
    assert out.returncode == 4 and "SELGATE_DURATIONS: no durations file" in out.stderr, out.stdout + out.stderr


def test_durations_are_recorded_from_a_lanes_junit(tmp_path, monkeypatch, capsys):
    out = tmp_path / "out" / "cpu"
    out.mkdir(parents=True)
    cases = [
        ("tests/test_a.py::test_slow", 283.2),
        ("tests/test_a.py::test_fast", 0.2),
        ("conformance/test_conformance.py::test_parity[triton-case1]", 7.04),
    ]
    body = "".join(
        f'<testcase classname="x" name="y" time="{t}"><properties><property name="nodeid" value="{n}" /></properties></testcase>'
        for n, t in cases
    )
    (out / "junit.xml").write_text(f'<testsuites><testsuite name="pytest" tests="3">{body}</testsuite></testsuites>')
    (out / "environment.json").write_text(
        json.dumps(
            {"gpu": "NVIDIA H100 80GB HBM3", "commit": "c" * 40, "tree": {"commit": "a" * 40}, "finished": "2026-11-26T12:00:00Z"}
        )
    )
    monkeypatch.setattr(lanes_main, "OUT_ROOT", tmp_path / "out")
    monkeypatch.setattr(lanes_main, "DURATIONS_DIR", tmp_path / "durations")
    assert lanes_main.main(["durations", "cpu"]) == 0
    data = json.loads((tmp_path / "durations" / "cpu.json").read_text())
    assert list(data["tests"].items()) == [
        ("tests/test_a.py::test_slow", 283.2),
        ("conformance/test_conformance.py::test_parity[triton-case1]", 7.0),
    ]
    assert data["gpu"] == "NVIDIA H100 80GB HBM3" and data["lane"] == "cpu" and data["commit"] == "a" * 40
    assert "2 tests of >= 5.0 s (290 s in all)" in capsys.readouterr().out
    assert lanes_main.main(["durations", "sm77"]) == 2
    # a run of the tests the lane skips, added: the lane's own entries and others stay
    body = (
        '<testcase classname="x" name="y" time="61.5">'
        '<properties><property name="nodeid" value="tests/test_b.py::test_s" /></properties></testcase>'
    )
    (out / "junit.xml").write_text(f'<testsuites><testsuite name="pytest" tests="1">{body}</testsuite></testsuites>')
    assert lanes_main.main(["durations", "cpu", "--add"]) == 0
    added = json.loads((tmp_path / "durations" / "cpu.json").read_text())
    assert list(added["tests"]) == [
        "tests/test_a.py::test_slow",
        "tests/test_b.py::test_s",
        "conformance/test_conformance.py::test_parity[triton-case1]",
    ]
    assert added["others"] == data["others"] and added["commit"] == "a" * 40 and [a["tests"] for a in added["added"]] == [1]


@pytest.mark.parametrize("lane, device", [("sm90", "cuda"), ("sm89-emulated", "cuda"), ("cpu", "cpu"), ("", None)])
def test_the_cross_architecture_compile_is_a_skip_in_gpu_lanes_only(monkeypatch, lane, device):
    from tests.helpers import running_lane_device

    monkeypatch.setenv("SELGATE_LANE", lane)
    assert running_lane_device() == device


def test_the_lanes_processes_write_their_bytecode_into_its_cache(monkeypatch, tmp_path):
    """With PYTHONDONTWRITEBYTECODE=1 in the caller's environment (docker images, CI machines),
    the lane's bytecode prefix stayed empty and every process of the lane compiled torch from
    source; the lane's processes write it there, and the checkout gets none."""
    monkeypatch.setenv(runner.NO_BYTECODE_ENV, "1")
    monkeypatch.setenv("SELGATE_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "lane_module.py").write_text("X = 1\n")
    plan = plan_lane(load_lane("cpu"), capability=None, gpus=0, cpus=2)
    env = runner.run_env(plan.env)
    subprocess.run([sys.executable, "-c", "import lane_module"], cwd=tmp_path / "src", env=env, check=True)
    written = list(Path(env[runner.PYCACHE_ENV]).rglob("lane_module*.pyc"))
    assert len(written) == 1 and written[0].is_relative_to(tmp_path / "cache"), written
    assert not list((tmp_path / "src").rglob("*.pyc"))
