"""Outside kernels that each hide one bug from a check, as a hostile reviewer wrote them:
`selgate check` must block each, or its headline must name what the pass leaves out. They
declare prefill alone, fp32 and no backward (but where the bug needs fp16), to keep their
checks short."""

from __future__ import annotations

import os

import torch

from tokenkernels import gather


def declares_per_process(q, k, v, ranges, *, scale=None):
    """1% off in fp16. Declares fp16 and fp32 where it is imported first (the check's probe)
    and fp32 alone in pytest's workers, where the fp16 cases run: skipped, had the workers
    read its declarations again."""
    o = gather(q, k, v, ranges, scale=scale)
    return o if q.dtype == torch.float32 else o * 1.01


declares_per_process.dtypes = ("fp32",) if "PYTEST_XDIST_WORKER" in os.environ else ("fp16", "fp32")


def seeded_by_pid(q, k, v, ranges, *, scale=None):
    """Bitwise repeatable within a process and different in every other one (as a kernel
    seeded by its pid, or tuned per process, is), each time within SPEC.md's fp32 bar."""
    o = gather(q, k, v, ranges, scale=scale)
    shape = (*o.shape[:3], 1, o.shape[4])  # one value for every head of a group, as its heads share keys
    noise = torch.rand(shape, generator=torch.Generator().manual_seed(os.getpid()), dtype=o.dtype)
    return o * (1 + 1e-6 * noise.to(o.device))


def nan_in_fp16(q, k, v, ranges, *, scale=None):
    """NaN everywhere in fp16, right in fp32; its --declare file (nan_in_fp16.yaml) declares
    every fp16 failure a strict expected failure."""
    o = gather(q, k, v, ranges, scale=scale)
    return o if q.dtype == torch.float32 else torch.full_like(o, float("nan"))


for _fn in (declares_per_process, seeded_by_pid, nan_in_fp16):
    _fn.modes = ("prefill",)
seeded_by_pid.dtypes = ("fp32",)
nan_in_fp16.dtypes = ("fp16", "fp32")


STRIPPER = r"""
import re, sys, time
from pathlib import Path
junit, pidfile = Path(sys.argv[1]), Path(sys.argv[2])
pidfile.write_text(str(__import__("os").getpid()))
while True:  # until the check's pytest has written its results; then strip every failure
    text = junit.read_text() if junit.exists() else ""
    if text.endswith("</testsuites>"):
        junit.write_text(re.sub(r"<failure[^>]*?(/>|>.*?</failure>)", "", text, flags=re.S))
        break
    time.sleep(0.01)
time.sleep(600)
"""


def strips_its_failures(q, k, v, ranges, *, scale=None):
    """One off everywhere. Its first call starts a helper in a session of its own that waits
    for the check's junit.xml (`out/` beside the kernel), strips every failure from it, and then
    stays alive; the helper's pid is in `stripper.pid`."""
    if os.environ.get("PYTEST_XDIST_WORKER") and not os.path.exists("stripper.pid"):
        import subprocess
        import sys

        open("stripper.pid", "w").close()
        subprocess.Popen([sys.executable, "-c", STRIPPER, "out/junit.xml", "stripper.pid"], start_new_session=True)
    return gather(q, k, v, ranges, scale=scale) + 1
