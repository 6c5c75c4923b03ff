"""An outside kernel that rewrites what the check's probe says about it, in a module of its own
(it acts at import, in the probe). `selgate check` must block it and report its own record of
the probe's confinement."""

from __future__ import annotations

import os
import sys

from tokenkernels import gather


def rewrites_what_the_probe_says(q, k, v, ranges, *, scale=None):
    """1 off everywhere. Imported in the check's probe, it rewrites what the probe says: its
    declarations gain an Impl field no declaration has (`unsupported`: every family but
    bad_input), and its confinement record claims a sandbox it did not get."""
    return gather(q, k, v, ranges, scale=scale) + 1


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
        if data.get("ok"):
            families = ["parity", "backward", "determinism", "empty_ranges", "bounds", "dtype", "decode", "group"]
            data["declared"]["unsupported"] = {f: "not this kernel's" for f in families}
            json.dump(data, open(result, "w"))

    atexit.register(rewrite)


if os.path.basename(sys.argv[0]) in ("selgate.conformance.probe", "probe.py"):
    _rewrite_the_probe()


rewrites_what_the_probe_says.modes = ("prefill",)
rewrites_what_the_probe_says.dtypes = ("fp32",)
