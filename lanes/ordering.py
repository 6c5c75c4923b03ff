"""pytest plugin (`-p selgate.lanes.ordering`): a lane's costly tests start first, spread over
the workers, so that none of them is left to run alone at the end of a parallel run (a 280 s test
started last makes the lane 280 s longer than its workers need).

The costs are a lane's measured durations, committed as `lanes/durations/<lane>.json`
(`python -m selgate.lanes durations <lane>` writes it from the lane's last JUnit) and named to
pytest by the runner through SELGATE_DURATIONS. Tests of at least COSTLY_S are costly; every other
test keeps its place, so a module's tests stay together and its fixtures and compiled kernels are
reused. Under xdist's `worksteal` the workers first take the collection in contiguous chunks, one
each, and an idle worker later steals from the end of the longest queue; so the costly tests are
dealt to the chunks longest first onto the least loaded one (each chunk's costly tests run first,
slowest first, on its own worker) instead of all landing in the first worker's chunk, where they
ran one after another (docs/lanes.md). The order is the same on
every xdist worker (each one collects and sorts the same way, from the same worker count), which
xdist requires; only the order changes, never the selection. A relative SELGATE_DURATIONS is taken
from pytest's rootdir (the checkout, in a lane's image too). A test marked `slow` that the file does
not list counts as costly at COSTLY_S: the CPU lane skips slow tests, so its durations never measure
them, while `bin/test`, ordered by that lane's file, runs them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from selgate import env_vars

DURATIONS_DIR = Path(__file__).resolve().parent / "durations"
DURATIONS_ENV = "SELGATE_DURATIONS"
COSTLY_S = 5.0


def load_durations(path) -> dict:
    """{nodeid: seconds} from a durations file; ValueError names a malformed one."""
    data = json.loads(Path(path).read_text())
    tests = data.get("tests") if isinstance(data, dict) else None
    if not isinstance(tests, dict) or not all(isinstance(v, (int, float)) for v in tests.values()):
        raise ValueError(f'{path}: expected {{"tests": {{nodeid: seconds}}, ...}}, got {str(data)[:200]}')
    return tests


def load_others_mean(path) -> float | None:
    """The mean seconds of the tests a durations file does not list (its `others`: count and
    seconds of the run's tests under min_s), or None where it records none."""
    others = json.loads(Path(path).read_text()).get("others")
    if not isinstance(others, dict) or not others.get("count"):
        return None
    return float(others["seconds"]) / int(others["count"])


def load_min_s(path) -> float | None:
    """The bound under which a durations file leaves tests unlisted (its `min_s`), or None."""
    min_s = json.loads(Path(path).read_text()).get("min_s")
    return float(min_s) if isinstance(min_s, (int, float)) else None


def first_chunks(n: int, workers: int) -> list[int]:
    """The sizes of xdist worksteal's first split of `n` tests over `workers` idle workers: each
    in turn takes the pending tests // the workers still without a chunk."""
    sizes, left = [], n
    for k in range(workers):
        sizes.append(left // (workers - k))
        left -= sizes[-1]
    return sizes


def costly_first(items: list, durations: dict, costly_s: float = COSTLY_S, workers: int = 1) -> list:
    """`items` arranged as `workers` chunks (first_chunks): the tests measured at >= costly_s are
    dealt slowest first to the chunk with the least costly time so far and lead it, slowest
    first; the rest fill the chunks in collection order. One worker: all costly tests first."""
    costly = sorted((i for i in items if durations.get(i.nodeid, 0.0) >= costly_s), key=lambda i: -durations[i.nodeid])
    chosen = {id(i) for i in costly}
    rest = [i for i in items if id(i) not in chosen]
    sizes = first_chunks(len(items), max(1, workers))
    chunks, load = [[] for _ in sizes], [0.0] * len(sizes)
    for item in costly:
        k = min((k for k, size in enumerate(sizes) if len(chunks[k]) < size), key=lambda k: (load[k], k))
        chunks[k].append(item)
        load[k] += durations[item.nodeid]
    out, fill = [], iter(rest)
    for chunk, size in zip(chunks, sizes):
        out += chunk + [next(fill) for _ in range(size - len(chunk))]
    return out


def with_slow_marked(items: list, durations: dict) -> dict:
    """`durations`, and COSTLY_S for each test of `items` marked `slow` that they do not list (slow,
    but by how much no run recorded)."""
    return {**{i.nodeid: COSTLY_S for i in items if i.get_closest_marker("slow")}, **durations}


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    path = env_vars.get(DURATIONS_ENV)
    if path:
        full = Path(config.rootpath) / path
        if not full.is_file():
            raise pytest.UsageError(
                f"{DURATIONS_ENV}: no durations file {full} (relative paths are taken from the rootdir {config.rootpath})"
            )
        workers = getattr(config, "workerinput", {}).get("workercount", 1)  # 1 outside xdist
        items[:] = costly_first(items, with_slow_marked(items, load_durations(full)), workers=workers)


def write_durations(junit: Path, lane: str, dest: Path, min_s: float = COSTLY_S, *, add: bool = False) -> dict:
    """Record the tests of `junit` that took at least `min_s` (pytest's per-test time: setup,
    call and teardown) as `dest`; returns what was written. With `add`, into the file `dest`
    already is: its tests and others stay, those `junit` measured are updated, and `added`
    lists the runs they came from (tests the lane skips, as the CPU lane skips slow tests,
    measured by a run of those tests alone, for bin/test, which runs them too)."""
    from junitparser import JUnitXml, Properties

    tests, others = {}, {"count": 0, "seconds": 0.0}
    for suite in JUnitXml.fromfile(str(junit)):
        for case in suite:
            props = case.child(Properties)
            nodeid = next((p.value for p in props if p.name == "nodeid"), None) if props is not None else None
            if nodeid and (case.time or 0.0) >= min_s:
                tests[nodeid] = round(max(case.time, tests.get(nodeid, 0.0)), 1)
            elif nodeid:
                others["count"] += 1
                others["seconds"] += case.time or 0.0
    env_file = junit.parent / "environment.json"
    env = json.loads(env_file.read_text()) if env_file.exists() else {}
    commit = (env.get("tree") or {}).get("commit") or env.get("commit", "unknown")  # the tree the run started on
    data = {
        "lane": lane,
        "gpu": env.get("gpu", "unknown"),
        "commit": commit,
        "finished": env.get("finished", "unknown"),
        "min_s": min_s,
        "tests": dict(sorted(tests.items(), key=lambda kv: (-kv[1], kv[0]))),
        "others": {"count": others["count"], "seconds": round(others["seconds"], 1)},  # the progress line's first estimate
    }
    if add:
        base = json.loads(dest.read_text())
        merged = {**base["tests"], **data["tests"]}
        data = {
            **base,
            "tests": dict(sorted(merged.items(), key=lambda kv: (-kv[1], kv[0]))),
            "added": [*base.get("added", []), {"commit": commit, "finished": data["finished"], "tests": len(tests)}],
        }
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(data, indent=1) + "\n")
    return data
