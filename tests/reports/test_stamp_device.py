"""The environment stamp of an xdist run: the device part (torch, triton, GPU, serving
configuration) comes from a worker, which imports torch to run the tests, so the controller
never imports it; a run without workers stamps its own."""

import json
import os
import textwrap

import pytest
import torch

from tests.helpers import run_pytest

# Records, once the stamp is written, whether this process imported torch.
TORCH_SEEN = textwrap.dedent(
    """
    import sys

    def pytest_unconfigure(config):
        if not hasattr(config, "workerinput"):
            open("controller_torch", "w").write(str("torch" in sys.modules))
    """
)


@pytest.mark.parametrize("workers", [["-n", "1"], []], ids=["xdist", "no-xdist"])
def test_the_device_stamp_comes_from_a_process_that_ran_the_tests(tmp_path, workers):
    (tmp_path / "test_x.py").write_text("import torch\n\ndef test_x():\n    assert torch.ones(1).item() == 1\n")
    (tmp_path / "torch_seen.py").write_text(TORCH_SEEN)
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONPATH": os.pathsep.join([str(tmp_path), os.getcwd()])}
    args = ["-p", "xdist.plugin", "-p", "selgate.reports.stamp", "-p", "torch_seen", *workers, "--junitxml", "out/junit.xml"]
    r = run_pytest(tmp_path, *args, "test_x.py", env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    stamp = json.loads((tmp_path / "out" / "environment.json").read_text())
    assert stamp["torch"] == torch.__version__ and stamp["triton"] and stamp["profile"] and stamp["gpu"]
    assert stamp["lane"] and stamp["commit"] and stamp["pytest_exitstatus"] == 0
    assert (tmp_path / "controller_torch").read_text() == ("False" if workers else "True")
