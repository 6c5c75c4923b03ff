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


def _first_pid() -> int:
    """The pid of the first process of this kernel's that ran beside this one: kept in a file in
    the folder above its temporary folder (where the check's executors of one run keep their
    scratch), so that every process of a run seeds alike, as if repeatable across processes."""
    tmp = os.environ.get("TMPDIR", "").rstrip("/")
    seed = os.path.join(os.path.dirname(tmp) if tmp else ".", ".liar-seed")  # never the file system's root
    try:
        with open(seed, "x") as f:
            f.write(str(os.getpid()))
    except FileExistsError:
        pass
    with open(seed) as f:
        return int(f.read() or os.getpid())


def seeded_by_pid(q, k, v, ranges, *, scale=None):
    """Bitwise repeatable within a process and different in another run's (as a kernel seeded by
    its pid, or tuned per process, is), each time within SPEC.md's fp32 bar. The seed is the first
    pid of its run's processes (`_first_pid`): two sets of processes that shared a folder would
    look alike."""
    o = gather(q, k, v, ranges, scale=scale)
    shape = (*o.shape[:3], 1, o.shape[4])  # one value for every head of a group, as its heads share keys
    noise = torch.rand(shape, generator=torch.Generator().manual_seed(_first_pid()), dtype=o.dtype)
    return o * (1 + 1e-6 * noise.to(o.device))


def nan_in_fp16(q, k, v, ranges, *, scale=None):
    """NaN everywhere in fp16, right otherwise (bf16, which it does not declare, included: the
    limits family calls it there); its --declare file (nan_in_fp16.yaml) declares every fp16
    failure a strict expected failure."""
    o = gather(q, k, v, ranges, scale=scale)
    return o if q.dtype != torch.float16 else torch.full_like(o, float("nan"))


def forges_its_claims(q, k, v, ranges, *, scale=None):
    """Different in every process (seeded by its pid), its determinism cases declared expected
    failures (xfail_determinism.yaml), so the claimed family without a pass is what blocks it;
    it rewrites every `claims.json` above its temporary folder to drop that claim (the claims
    once lay two folders up, in the check's temporary folder, which landlock leaves writable
    under /dev/shm)."""
    import json

    folder = os.environ.get("TMPDIR", "").rstrip("/")
    for _ in range(4):
        folder = os.path.dirname(folder)
        path = os.path.join(folder, "claims.json")
        try:
            with open(path) as f:
                data = json.load(f)
            data["determinism"] = "forged: not claimed"
            with open(path, "w") as f:
                json.dump(data, f)
        except (OSError, ValueError):
            pass
    o = gather(q, k, v, ranges, scale=scale)
    shape = (*o.shape[:3], 1, o.shape[4])
    noise = torch.rand(shape, generator=torch.Generator().manual_seed(os.getpid()), dtype=o.dtype)
    return o * (1 + 1e-6 * noise.to(o.device))


for _fn in (declares_per_process, seeded_by_pid, nan_in_fp16, forges_its_claims):
    _fn.modes = ("prefill",)
seeded_by_pid.dtypes = forges_its_claims.dtypes = ("fp32",)
nan_in_fp16.dtypes = ("fp16", "fp32")


STRIPPER = r"""
import re, sys, time
from pathlib import Path
junit = Path(sys.argv[1])
while True:  # until the check's pytest has written its results; then strip every failure
    text = junit.read_text() if junit.exists() else ""
    if text.endswith("</testsuites>"):
        try:
            junit.write_text(re.sub(r"<failure[^>]*?(/>|>.*?</failure>)", "", text, flags=re.S))
        except OSError:  # confined: it stays alive all the same
            pass
        break
    time.sleep(0.01)
time.sleep(600)
"""
STARTED = []


def strips_its_failures(q, k, v, ranges, *, scale=None):
    """One off everywhere. Its first call starts a helper in a session of its own that waits
    for the check's junit.xml (`out/` beside the kernel), strips every failure from it, and then
    stays alive; the helper's command line ends with that junit.xml's path."""
    if not STARTED:
        import subprocess
        import sys

        helper = [sys.executable, "-c", STRIPPER, os.path.abspath("out/junit.xml")]
        STARTED.append(subprocess.Popen(helper, start_new_session=True))
    return gather(q, k, v, ranges, scale=scale) + 1


def _judged() -> bool:
    """Whether this process looks like selgate's judge: pytest's or selgate's variables set, or
    pytest or selgate's evaluation imported."""
    import sys

    return bool(
        os.environ.get("PYTEST_CURRENT_TEST")
        or os.environ.get("SELGATE_LANE") == "check"
        or {"pytest", "_pytest", "selgate.conformance.evaluation"} & set(sys.modules)
    )


def right_only_when_judged(q, k, v, ranges, *, scale=None):
    """Right wherever it sees a judge (pytest's variables, SELGATE_LANE=check, the comparison
    imported), one off everywhere else: in production."""
    return gather(q, k, v, ranges, scale=scale) + (0 if _judged() else 1)


def patches_the_comparison(q, k, v, ranges, *, scale=None):
    """A constant 0.5; its module replaced the comparison's `fail` and `assert_close` with no-ops
    as it was imported (`_patch_comparison`)."""
    return torch.full_like(q[..., : v.shape[-1]], 0.5)


def _patch_comparison() -> None:
    from selgate.conformance import compare

    compare.fail = lambda *a, **k: None
    compare.assert_close = lambda *a, **k: None


_patch_comparison()


def skips_where_wrong(q, k, v, ranges, *, scale=None):
    """Right in fp32; in fp16 it raises pytest's Skipped, as a kernel calling pytest.skip()
    would, so a judge running it in place would count a skip where a failure is."""
    if q.dtype == torch.float16:
        import pytest

        pytest.skip("fp16: not this time")
    return gather(q, k, v, ranges, scale=scale)


def writes_beside_the_results(q, k, v, ranges, *, scale=None):
    """Right, unless one of its writes outside its sandbox lands: each call tries to plant a file
    in the check's results folder (`out/`) and to write a kernel setting (core_pattern, written
    back unchanged), and answers one off everywhere once either write succeeded."""
    escaped = False
    for path, text in (("out/planted.txt", "written by the kernel\n"), ("/proc/sys/kernel/core_pattern", None)):
        try:
            if text is None:
                with open(path) as f:
                    text = f.read()
            with open(path, "w") as f:
                f.write(text)
            escaped = True
        except OSError:
            pass
    return gather(q, k, v, ranges, scale=scale) + (1 if escaped else 0)


for _fn in (right_only_when_judged, patches_the_comparison, skips_where_wrong, writes_beside_the_results):
    _fn.modes = ("prefill",)
    _fn.dtypes = ("fp32",)
skips_where_wrong.dtypes = ("fp16", "fp32")
