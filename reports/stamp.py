"""pytest plugin (`-p selgate.reports.stamp`, loaded by the lane runner): records what the
report needs and JUnit lacks. Each test gets `nodeid`, `family` and, when its parameters
carry one, `seed` as JUnit properties; the controller writes the environment stamp,
pytest's exit status and what the run selected to environment.json beside the JUnit file
(the gate compares that selection with the lane's own, so a narrowed run cannot stand in
for the lane)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from .environment import ENV_FILE, collect_environment
from .families import family_of


def seed_of(item) -> str | None:
    """A `seed` parameter, or the `.seed` of a parameter (a conformance case), if any."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    if "seed" in params:
        return str(params["seed"])
    for value in params.values():
        if getattr(value, "seed", None) is not None:
            return str(value.seed)
    return None


def pytest_collection_modifyitems(items):
    for item in items:
        props = [("nodeid", item.nodeid), ("family", family_of(item.nodeid, [m.name for m in item.iter_markers()]))]
        seed = seed_of(item)
        if seed is not None:
            props.append(("seed", seed))
        item.user_properties.extend(props)


def selection_of(config) -> dict:
    """The run's selection: positional paths, -k, -m, --size, --deselect, --ignore, --lf."""
    def norm(path: str) -> str:
        return path.removeprefix("./").rstrip("/")

    return {"paths": [norm(a) for a in config.args], "k": config.option.keyword or "",
            "m": config.option.markexpr or "", "size": config.getoption("--size", None),
            "deselect": [norm(a) for a in config.getoption("deselect", None) or []],
            "ignore": [norm(a) for a in config.getoption("ignore", None) or []],
            "last_failed": bool(config.getoption("lf", False))}


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    xmlpath = session.config.option.xmlpath
    if hasattr(session.config, "workerinput") or not xmlpath:   # xdist workers leave it to the controller
        return
    env = collect_environment()
    env["pytest_exitstatus"] = int(exitstatus)
    env["selection"] = selection_of(session.config)
    path = Path(xmlpath).parent / ENV_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(env, indent=1, sort_keys=True) + "\n")
