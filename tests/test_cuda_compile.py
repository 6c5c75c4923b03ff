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
device's own architecture (tests/test_cuda_decode.py). A GPU lane lists it as a skip."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from torch.utils import cpp_extension

from selgate.kernels.cuda.build import CUDA_FLAGS, SOURCE_DIR
from tests.helpers import running_lane_device

# (virtual architecture, real architectures built from it)
BUILDS = {"sm80-sm89": ("80", ("80", "89")), "sm90": ("90", ("90",))}
NVCC = shutil.which("nvcc")


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed on this machine")
@pytest.mark.skipif(
    running_lane_device() == "cuda",
    reason="cross-architecture compile runs in the CPU lane; a GPU lane builds and runs the decode "
    "kernel for its own device (tests/test_cuda_decode.py)",
)
@pytest.mark.timeout(600)
@pytest.mark.parametrize("build", BUILDS)
def test_decode_kernel_compiles_for(build, tmp_path):
    virtual, archs = BUILDS[build]
    obj = tmp_path / "sel_decode.o"
    cmd = [
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
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, f"nvcc failed:\n{out.stderr[-4000:]}"
    log = out.stdout + out.stderr
    for arch in archs:
        assert f"for 'sm_{arch}'" in log, f"no sm_{arch} code was compiled"
    spills = [int(n) for n in re.findall(r"(\d+) bytes spill stores", log)]
    assert spills and not any(spills), f"register spills: {spills}"
    if shutil.which("cuobjdump"):
        elf = subprocess.run(["cuobjdump", "--list-elf", str(obj)], capture_output=True, text=True).stdout
        for arch in archs:
            assert f"sm_{arch}" in elf, elf
