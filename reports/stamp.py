"""pytest plugin (`-p selgate.reports.stamp`, loaded by the lane runner): records what the
report needs and JUnit lacks. Each test gets `nodeid`, `family` and, when its parameters
carry one, `seed` as JUnit properties; the controller writes the environment stamp and
pytest's exit status to environment.json beside the JUnit file."""
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


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    xmlpath = session.config.option.xmlpath
    if hasattr(session.config, "workerinput") or not xmlpath:   # xdist workers leave it to the controller
        return
    env = collect_environment()
    env["pytest_exitstatus"] = int(exitstatus)
    path = Path(xmlpath).parent / ENV_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(env, indent=1, sort_keys=True) + "\n")
