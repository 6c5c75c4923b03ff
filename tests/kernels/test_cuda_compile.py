"""The CUDA decode source compiles for every GPU class the lanes cover (compile only, no GPU).

nvcc builds sm_80, sm_89 and sm_90 machine code with the flags torch's extension builder uses;
the object must hold each architecture's code, and ptxas must report no register spills (a
spill in the p*V accumulators would silently cost the kernel its bandwidth). The source
branches on the architecture only at 9.0 (`__CUDA_ARCH__ >= 900`), so sm_80 and sm_89 share one
front end: their PTX (compute_80, compute_89) differs only in its `.target` line (20.6 MB
each, nvcc 13.0), and one call builds both from compute_80, running ptxas twice, while sm_90
gets its own (two tests, so a lane's two workers compile them side by side: one call for
the three took 330-587 s on one core of the CPU lane; on one idle core the front end takes
58 s and ptxas 54 s per architecture).

It runs in the CPU lane: three architectures of nvcc take minutes (283 s on the H100's host),
which would be the longest test of a GPU lane, where the kernel is built and run for the
device's own architecture (tests/kernels/test_cuda_decode.py). A GPU lane lists it as a skip.

What ptxas reported is committed (tests/data/cuda_ptxas.json), keyed by everything the build
reads: the CUDA sources, the nvcc command line, nvcc's and torch's versions. While the key holds,
the test judges that report and compiles nothing (the two builds took 131 of the CPU suite's
1065 worker-seconds on CI's two cores); when any of it changes, it compiles and judges what
ptxas says, on every run until the report is recorded again (`SELGATE_PTXAS_RECORD=1`) and
committed."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from filelock import FileLock
from torch.utils import cpp_extension

from selgate.kernels.cuda.build import CUDA_FLAGS, SOURCE_DIR
from tests.helpers import running_lane_device

# (virtual architecture, real architectures built from it)
BUILDS = {"sm80-sm89": ("80", ("80", "89")), "sm90": ("90", ("90",))}
NVCC = shutil.which("nvcc")


REPORT = Path(__file__).resolve().parents[1] / "data" / "cuda_ptxas.json"
RECORD_ENV = "SELGATE_PTXAS_RECORD"


def command(build: str, obj: Path) -> list:
    virtual, archs = BUILDS[build]
    return [
        NVCC,
        "-c",
        str(SOURCE_DIR / "sel_decode.cu"),
        "-o",
        str(obj),
        *CUDA_FLAGS,
        *cpp_extension.COMMON_NVCC_FLAGS,
        "-Xptxas",
        "-v",
        # CPU wheels of torch ship c10/cuda headers without their generated config header
        "-DC10_CUDA_NO_CMAKE_CONFIGURE_FILE",
        *(f"-I{p}" for p in cpp_extension.include_paths()),
        f"-gencode=arch=compute_{virtual},code=[{','.join(f'sm_{a}' for a in archs)}]",
    ]


def build_key(build: str) -> str:
    """Everything a build reads: the sources, the command line (the object's path aside), nvcc's
    and torch's versions."""
    digest = hashlib.sha256()
    for path in sorted(SOURCE_DIR.glob("sel_decode*")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    version = subprocess.run([NVCC, "--version"], capture_output=True, text=True).stdout
    # the command without what depends on the checkout's or the venv's place (source, object, includes)
    cmd = [a.replace(str(SOURCE_DIR), "") for a in command(build, Path("OBJ")) if a != "OBJ" and not a.startswith("-I")]
    digest.update("\0".join([*cmd, version, torch.__version__]).encode())
    return digest.hexdigest()


def judge(build: str, log: str) -> None:
    """Every architecture of the build compiled, with no register spill."""
    for arch in BUILDS[build][1]:
        assert f"for 'sm_{arch}'" in log, f"no sm_{arch} code was compiled"
    spills = [int(n) for n in re.findall(r"(\d+) bytes spill stores", log)]
    assert spills and not any(spills), f"register spills: {spills}"


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed on this machine")
@pytest.mark.skipif(
    running_lane_device() == "cuda",
    reason="cross-architecture compile runs in the CPU lane; a GPU lane builds and runs the decode "
    "kernel for its own device (tests/kernels/test_cuda_decode.py)",
)
@pytest.mark.timeout(600)
@pytest.mark.parametrize("build", BUILDS)
def test_decode_kernel_compiles_for(build, tmp_path):
    key = build_key(build)
    recorded = json.loads(REPORT.read_text()) if REPORT.exists() else {}
    if recorded.get(build, {}).get("key") == key and not os.environ.get(RECORD_ENV):
        judge(build, recorded[build]["ptxas"])  # this very build, compiled when the report was recorded
        return
    obj = tmp_path / "sel_decode.o"
    out = subprocess.run(command(build, obj), capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, f"nvcc failed:\n{out.stderr[-4000:]}"
    log = out.stdout + out.stderr
    judge(build, log)
    if shutil.which("cuobjdump"):
        elf = subprocess.run(["cuobjdump", "--list-elf", str(obj)], capture_output=True, text=True).stdout
        for arch in BUILDS[build][1]:
            assert f"sm_{arch}" in elf, elf
    ptxas = "\n".join(
        line for line in log.splitlines() if (line.startswith("ptxas") or "bytes spill" in line) and "Compile time" not in line
    )
    if os.environ.get(RECORD_ENV):
        with FileLock(os.path.join(tempfile.gettempdir(), "selgate-cuda-ptxas.lock")):  # both builds write it
            current = json.loads(REPORT.read_text()) if REPORT.exists() else {}
            current[build] = {"key": key, "ptxas": ptxas}
            REPORT.write_text(json.dumps(current, indent=1, sort_keys=True) + "\n")
    else:  # judged by compiling, as every run will until the report is recorded again
        print(f"{build}: {REPORT.name} is stale; `{RECORD_ENV}=1 bash bin/test tests/kernels/test_cuda_compile.py` records it")


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed on this machine")
def test_the_recorded_report_stands_only_for_the_sources_it_was_built_from(tmp_path, monkeypatch):
    """An edit of any CUDA source changes the key, so the next run compiles again."""
    for path in SOURCE_DIR.glob("sel_decode*"):
        (tmp_path / path.name).write_bytes(path.read_bytes())
    monkeypatch.setattr(sys.modules[__name__], "SOURCE_DIR", tmp_path)
    before = build_key("sm90")
    (tmp_path / "sel_decode.h").write_text((tmp_path / "sel_decode.h").read_text() + "\n// edited\n")
    assert build_key("sm90") != before
