"""A lane's inventory: the test ids its own selection collects (`pytest --collect-only`
with the lane's paths, size and markers under the lane's configuration only), recorded
beside the run's results, and how a run's results differ from it, named by family and
implementation.

It is collected on the lane's machine while the run starts, not at gate time: what a lane
collects depends on its device and installed extensions, which the gate's machine (a CPU
runner gating GPU evidence) does not have, and one extra collection is cheap next to a run."""

from __future__ import annotations

import subprocess
from collections import Counter
from pathlib import Path

from selgate.conformance.reported import family_of, names

INVENTORY_FILE = "inventory.json"
SHOWN_GROUPS = 6
TIMEOUT = 3600


def start_inventory(lane: str, xmlpath: str, rootdir) -> subprocess.Popen | None:
    """Start collecting the inventory of `lane` when this run writes that lane's results
    (`reports/out/<lane>/junit.xml`); None for any other run."""
    from selgate.lanes.config import LANE_DIR, load_lane
    from selgate.lanes.runner import inventory_command, run_env

    base = lane.removesuffix("-emulated")
    if not base or not (LANE_DIR / f"{base}.yaml").exists():
        return None
    if Path(xmlpath).resolve().parts[-4:] != ("reports", "out", lane, "junit.xml"):
        return None
    return subprocess.Popen(
        inventory_command(load_lane(base)),
        cwd=rootdir,
        env=run_env({}),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def collect_inventory(proc: subprocess.Popen) -> dict:
    """{command, exitstatus, ids, output}: `output` keeps the tail of a failed collection."""
    try:
        out, _ = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    listing = out.split("\n\n", 1)[0]  # -q lists node ids, then a blank line, then the summary
    ids = [line for line in listing.splitlines() if "::" in line]
    failed = proc.returncode not in (0, 5)
    return {"command": list(proc.args), "exitstatus": proc.returncode, "ids": ids, "output": out[-3000:] if failed else ""}


def group_of(nodeid: str) -> str:
    """`family/implementation` of a conformance test (`parity/triton`), else its family."""
    family = family_of(nodeid)
    if family in names() and "[" in nodeid:
        return f"{family}/{nodeid.split('[', 1)[1].split('-', 1)[0]}"
    return family


def _summary(label: str, ids: list) -> str:
    groups = Counter(group_of(i) for i in ids).most_common()
    shown = ", ".join(f"{g} {n}" for g, n in groups[:SHOWN_GROUPS])
    more = f", {len(groups) - SHOWN_GROUPS} more groups" if len(groups) > SHOWN_GROUPS else ""
    return f"{len(ids)} {label} ({shown}{more}; e.g. {ids[0]})"


def difference(expected: list, ran) -> list[str]:
    """What `ran` (test ids with a result) lacks of the inventory and what it has beyond it."""
    ran, wanted = set(ran), set(expected)
    missing = [i for i in expected if i not in ran]
    extra = sorted(ran - wanted)
    out = []
    if missing:
        out.append(_summary("without a result", missing))
    if extra:
        out.append(_summary("outside the lane's selection", extra))
    return out
