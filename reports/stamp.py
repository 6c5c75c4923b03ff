"""pytest plugin (`-p selgate.reports.stamp`, loaded by the lane runner): records what the
report needs and JUnit lacks. Each test gets `nodeid`, `family` and, when its parameters
carry one, `seed` as JUnit properties; the controller writes beside the JUnit file the
environment stamp with the tree the run started on, pytest's exit status, its effective
arguments and configuration files, what the run selected and, for a run cut short, how far it
got (environment.json), and, in a lane run, the lane's inventory collected apart from the run
(inventory.json). The gate compares all of it with the lane and the tree it gates, so a
narrowed, cut, foreign or differently configured run cannot stand in for the lane."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from selgate.kernels import settings

from .environment import ENV_FILE, collect_environment
from .families import family_of
from .inventory import INVENTORY_FILE, collect_inventory, start_inventory
from .outcome import outcome_known
from .tree import tree_stamp

TREE = pytest.StashKey[dict]()
INVENTORY = pytest.StashKey[subprocess.Popen]()
# Tests whose outcome is known so far, and what interrupted the session: a cut run records how
# far it got. Module state, like pytest's own plugins keep per session; reset as one starts.
_done: set = set()
_interrupt: list = []


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
    """The run's selection: positional paths, -k, -m, --size, --impl, --deselect, --ignore, --lf."""

    def norm(path: str) -> str:
        return path.removeprefix("./").rstrip("/")

    return {
        "paths": [norm(a) for a in config.args],
        "k": config.option.keyword or "",
        "m": config.option.markexpr or "",
        "size": config.getoption("--size", None),
        "impl": config.getoption("--impl", None),
        "deselect": [norm(a) for a in config.getoption("deselect", None) or []],
        "ignore": [norm(a) for a in config.getoption("ignore", None) or []],
        "last_failed": bool(config.getoption("lf", False)),
    }


def configuration_of(config) -> dict:
    """The effective pytest configuration: arguments as invoked, the configuration file and
    its addopts, PYTEST_ADDOPTS, whether plugins were autoloaded, the conftest files and
    plugins loaded."""
    root = Path(config.rootpath)

    def rel(path) -> str:
        path = Path(path)
        return path.relative_to(root).as_posix() if path.is_relative_to(root) else str(path)

    conftests = {
        rel(p.__file__)
        for p in config.pluginmanager.get_plugins()
        if Path(getattr(p, "__file__", None) or "x").name == "conftest.py"
    }
    plugins = {
        name for name, p in config.pluginmanager.list_name_plugin() if p is not None and os.sep not in name and not name.isdigit()
    }
    return {
        "args": list(config.invocation_params.args),
        "inifile": rel(config.inipath) if config.inipath else None,
        "rootdir": str(root),
        "ini_addopts": list(config.getini("addopts")),
        "env_addopts": os.environ.get("PYTEST_ADDOPTS", ""),
        "autoload": os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "") == "",
        "conftests": sorted(conftests),
        "plugins": sorted(plugins),
    }


def _controller_xml(config) -> str | None:
    """The JUnit path on the controller; None on xdist workers and runs without JUnit."""
    return None if hasattr(config, "workerinput") else config.option.xmlpath


def pytest_runtest_logreport(report):
    if outcome_known(report):
        _done.add(report.nodeid)


def pytest_keyboard_interrupt(excinfo):
    """Ctrl-C or SIGINT (KeyboardInterrupt), or xdist stopping the run (its Interrupted, e.g.
    `maximum crashed workers reached: 20`)."""
    _interrupt[:] = [excinfo.type, str(excinfo.value)]


def cut_record(session) -> dict:
    """How far an interrupted run got: the signal as pytest saw it (SIGINT for a plain
    KeyboardInterrupt, None when xdist or a -x/--maxfail stopped it), the reason, the tests
    done and the tests collected (0 when the run was cut during collection)."""
    kind, message = _interrupt or (None, "")
    keyboard = kind is KeyboardInterrupt
    reason = "KeyboardInterrupt" if keyboard else message or str(session.shouldstop or session.shouldfail or "interrupted")
    return {
        "signal": "SIGINT" if keyboard else None,
        "reason": reason,
        "tests_done": len(_done),
        "tests_collected": int(session.testscollected),
    }


def pytest_sessionstart(session):
    """The tree is stamped as the run starts; a lane run collects its inventory meanwhile."""
    _done.clear()
    _interrupt.clear()
    config = session.config
    if not _controller_xml(config):
        return
    config.stash[TREE] = tree_stamp()
    pending = start_inventory(settings.get("SELGATE_LANE", ""), config.option.xmlpath, config.rootpath)
    if pending is not None:
        config.stash[INVENTORY] = pending


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    config = session.config
    xmlpath = _controller_xml(config)
    if not xmlpath:
        return
    env = collect_environment()
    env["pytest_exitstatus"] = int(exitstatus)
    if int(exitstatus) == pytest.ExitCode.INTERRUPTED:
        env["cut"] = cut_record(session)
    env["selection"] = selection_of(config)
    env["pytest"] = configuration_of(config)
    env["tree"] = config.stash.get(TREE, None) or tree_stamp()
    out = Path(xmlpath).parent
    out.mkdir(parents=True, exist_ok=True)
    (out / ENV_FILE).write_text(json.dumps(env, indent=1, sort_keys=True) + "\n")
    pending = config.stash.get(INVENTORY, None)
    if pending is None:
        return
    if "cut" in env:  # the cut blocks the lane on its own; a machine going away gives no time to wait
        pending.kill()
        pending.wait()
        return
    (out / INVENTORY_FILE).write_text(json.dumps(collect_inventory(pending), indent=1) + "\n")
