"""What a local lane run prints before pytest starts: one short line of what it runs and where its
results go; the full command (environment and arguments, about 900 characters) goes to a file in
the lane's results folder, which runs exactly what the lane ran."""

from __future__ import annotations

import shlex

from selgate.lanes import runner
from selgate.lanes.config import load_lane


class FakeProc:
    def __init__(self, cmd, **kwargs):
        FakeProc.cmd, FakeProc.env = cmd, kwargs["env"]

    def wait(self):
        return 0

    def send_signal(self, signum):
        pass


def test_a_lane_run_prints_one_short_line_and_writes_its_full_command(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SELGATE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(runner.THREADS_ENV, raising=False)  # set by a lane this suite runs in
    monkeypatch.setattr(runner, "OUT_ROOT", tmp_path / "out")
    monkeypatch.setattr(runner.subprocess, "Popen", FakeProc)
    plan = runner.plan_lane(load_lane("cpu"), capability=None, workers=2)
    assert runner.run_plan(plan) == 0

    out_dir = tmp_path / "out" / "cpu"
    command_file = out_dir / runner.COMMAND_FILE
    printed = capsys.readouterr().out.splitlines()
    assert printed == [
        f"lane cpu: 2 worker(s) of {plan.env[runner.THREADS_ENV]} CPU thread(s), size tiny, markers 'not slow', "
        f"JUnit {out_dir / 'junit.xml'}; full command in {command_file}"
    ]
    words = shlex.split(command_file.read_text())
    env = dict(w.split("=", 1) for w in words[: -len(FakeProc.cmd)])
    assert words[-len(FakeProc.cmd) :] == FakeProc.cmd and FakeProc.cmd[1:3] == ["-m", "pytest"]
    assert env == {**plan.env, **runner.CLEAN_ENV} and all(FakeProc.env[k] == v for k, v in env.items())
    assert "selgate.lanes.progress" in FakeProc.cmd and "reports/out/cpu/junit.xml" in FakeProc.cmd
