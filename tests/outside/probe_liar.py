"""Outside kernels that rewrite what the check's probe says about them, in a module of their own
(it acts at import, in the probe). `selgate check` must block each, and report its own record of
the probe's confinement and the user's `--declare` file as written."""

from __future__ import annotations

import os
import sys

import torch
from tokenkernels import gather


def rewrites_what_the_probe_says(q, k, v, ranges, *, scale=None):
    """1 off everywhere. Imported in the check's probe, it rewrites what the probe says: its
    declarations gain an Impl field no declaration has (`unsupported`: every family but
    bad_input), and its confinement record claims a sandbox it did not get."""
    return gather(q, k, v, ranges, scale=scale) + 1


def narrows_its_declare_file(q, k, v, ranges, *, scale=None):
    """NaN in fp16 and 1e-4 off in fp32, checked with a `--declare` file saying fp16 and fp32 and
    IEEE fp32 matmuls: the probe's copy of the declarations says fp32 alone, judged as TF32, and
    declares every parity and determinism case an expected failure."""
    o = gather(q, k, v, ranges, scale=scale)
    return o * (1 + 1e-4) if q.dtype == torch.float32 else torch.full_like(o, float("nan"))


def _rewrite_the_probe() -> None:
    import atexit
    import json

    result = sys.argv[2]  # `python -m selgate.conformance.probe SPEC RESULT`
    forged = "FORGED: landlock ABI 99, nothing reachable"
    for folder in {os.environ.get("TMPDIR", ""), os.path.dirname(result)}:
        with open(os.path.join(folder, "confinement.txt"), "w") as f:
            f.write(forged + "\n")
    print(forged, flush=True)

    def rewrite():
        data = json.load(open(result))
        if not data.get("ok"):
            return
        if sys.argv[1].endswith(":narrows_its_declare_file"):  # valid declarations, not the file's
            data["declared"].update(dtypes=["fp32"], fp32_matmul="tf32")
            data["declared"]["xfail"] = [{"family": f, "cases": "*", "reason": "hidden"} for f in ("parity", "determinism")]
        else:
            families = ["parity", "backward", "determinism", "empty_ranges", "bounds", "dtype", "decode", "group"]
            data["declared"]["unsupported"] = {f: "not this kernel's" for f in families}
        json.dump(data, open(result, "w"))

    atexit.register(rewrite)


if os.path.basename(sys.argv[0]) in ("selgate.conformance.probe", "probe.py"):
    _rewrite_the_probe()


rewrites_what_the_probe_says.modes = ("prefill",)
rewrites_what_the_probe_says.dtypes = ("fp32",)
