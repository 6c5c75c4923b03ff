"""The pytest plugin as a kernel author meets it: cheap in a run that does not use it, the
kernel imported from the folder pytest runs in (the `pytest` script, not only `python -m
pytest`), and a run of --impl in which none of the kernel's cases ran fails."""

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

OUTSIDE = Path(__file__).resolve().parents[1] / "outside"
# What the `pytest` console script runs; from a file of its own, so that, as with the script,
# the first entry of sys.path is the script's folder and not the one pytest runs in.
SCRIPT = "import sys\nfrom pytest import console_main\nsys.exit(console_main())\n"


def _pytest(cwd: Path, *args, timeout=600):
    script = cwd.parent / f"{cwd.name}-pytest-script.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # the host's plugins stay out; ours is named
    cmd = [sys.executable, str(script), "-p", "selgate.conformance.plugin", "-p", "no:cacheprovider", *args]
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env, timeout=timeout)
    return proc.returncode, proc.stdout + proc.stderr


def test_a_run_that_does_not_use_the_matrix_imports_no_torch(tmp_path):
    (tmp_path / "test_unrelated.py").write_text(
        textwrap.dedent(
            """
            import sys

            def test_nothing_heavy():
                assert "torch" not in sys.modules and "selgate.conformance.families" not in sys.modules
            """
        )
    )
    rc, log = _pytest(tmp_path, "-q")
    assert rc == 0, log


def _kernel_folder(tmp_path: Path, devices: str) -> Path:
    shutil.copy(OUTSIDE / "tokenkernels.py", tmp_path)
    (tmp_path / "mykern.py").write_text(
        textwrap.dedent(
            f"""
            from tokenkernels import gather

            def fn(q, k, v, ranges, *, scale=None):
                return gather(q, k, v, ranges, scale=scale)

            fn.dtypes = ["fp32"]
            fn.devices = {devices}
            fn.backward = True
            fn.lse = False
            """
        )
    )
    return tmp_path


def test_the_kernel_is_imported_from_the_folder_pytest_runs_in(tmp_path):
    folder = _kernel_folder(tmp_path, '["cpu", "cuda"]')
    rc, log = _pytest(folder, "--pyargs", "selgate.conformance", "-m", "conformance and parity", "--impl", "mykern:fn", "-q")
    assert rc == 0, log[-3000:]
    assert " passed" in log


def test_a_run_in_which_none_of_the_kernels_cases_ran_fails(tmp_path):
    folder = _kernel_folder(tmp_path, '["cuda"]')
    cpu_only = "import torch; assert not torch.cuda.is_available()"
    if subprocess.run([sys.executable, "-c", cpu_only]).returncode:
        folder = _kernel_folder(tmp_path, '["cpu"]')  # on a GPU host: a kernel declaring the other device
        (folder / "mykern.py").write_text((folder / "mykern.py").read_text() + "fn.dtypes = ['fp64']\n")
    rc, log = _pytest(folder, "--pyargs", "selgate.conformance", "-m", "conformance and parity", "--impl", "mykern:fn", "-q")
    assert rc == 1, log[-3000:]
    assert "selgate: no case of mykern:fn ran" in log
