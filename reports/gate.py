"""The gate: the policy in gate.yaml applied to the lanes' results, giving a verdict whose
first blocking line names what blocks."""

from __future__ import annotations

import datetime
import fnmatch
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from .families import FAMILIES
from .inventory import difference
from .results import LaneResult
from .sanitizer import sanitizer_blocking
from .tree import FULL_COMMIT, untracked_config

POLICY_FILE = Path(__file__).resolve().parent / "gate.yaml"
QUARANTINE_KEYS = ("test", "owner", "reason", "expires", "lanes")
MAX_QUARANTINE_DAYS = 30
ABORTED = {2: "interrupted", 3: "internal error", 4: "usage error"}
LINK = re.compile(r"https?://\S+|(?:[\w.-]+/[\w.-]+)?#\d+")
# A wildcard entry may cover no more than one family's tests of one implementation: the
# module, the test function and the implementation are literal, wildcards come after.
PATTERN = re.compile(r"conformance/test_(?P<family>\w+)\.py::test_\w+\[(?P<impl>[\w.:]+)-[^\[\]]*\]")
WILDCARDS = ("*", "?")


@dataclass
class Verdict:
    required_lanes: list
    blocking: list = field(default_factory=list)
    quarantined: list = field(default_factory=list)  # (CaseResult, entry)
    notes: list = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.blocking

    def headline(self) -> str:
        if self.passed:
            return f"GATE PASSED: required lanes {', '.join(self.required_lanes)}"
        more = f" (and {len(self.blocking) - 1} more)" if len(self.blocking) > 1 else ""
        return f"GATE BLOCKED: {self.blocking[0]}{more}"


def known_lanes() -> list:
    """Lanes a policy may name: each lane YAML, run natively or emulated."""
    from selgate.lanes.config import lane_names

    return [n for name in lane_names() for n in (name, f"{name}-emulated")]


def load_policy(path: Path = POLICY_FILE, today: datetime.date | None = None) -> dict:
    """gate.yaml, validated: ValueError names the bad key or entry."""
    today = today or utc_today()
    policy = yaml.safe_load(Path(path).read_text()) or {}
    if not isinstance(policy, dict):
        raise ValueError(f"{path}: expected a mapping, got {type(policy).__name__}")
    for key in ("default_profile", "profiles", "required_families", "quarantine"):
        if key not in policy:
            raise ValueError(f"{path}: missing key {key!r}")
    profiles = policy["profiles"]
    if not isinstance(profiles, dict) or policy["default_profile"] not in profiles:
        raise ValueError(
            f"{path}: profiles: expected a mapping holding default_profile {policy['default_profile']!r}, got {profiles!r}"
        )
    for name, profile in profiles.items():
        lanes = profile.get("required_lanes") if isinstance(profile, dict) else None
        if not isinstance(lanes, list) or not lanes or not all(isinstance(n, str) and n for n in lanes):
            raise ValueError(
                f"{path}: profiles.{name}.required_lanes: expected a non-empty list of lane "
                f"names (a gate that requires no lane passes on no results), got {lanes!r}"
            )
        for flag in ("same_commit", "sanitizer"):
            if not isinstance(profile.get(flag, False), bool):
                raise ValueError(f"{path}: profiles.{name}.{flag}: expected true or false, got {profile[flag]!r}")
    families = policy["required_families"]
    if not isinstance(families, list) or set(families) - set(FAMILIES):
        raise ValueError(f"{path}: required_families: expected a list of {list(FAMILIES)}, got {families!r}")
    entries = policy["quarantine"] or []
    if not isinstance(entries, list):
        raise ValueError(f"{path}: quarantine: expected a list of entries, got {entries!r}")
    policy["quarantine"] = [_quarantine(entry, f"{path}: quarantine[{i}]", today) for i, entry in enumerate(entries)]
    return policy


def _quarantine(entry, where: str, today: datetime.date) -> dict:
    """One quarantine entry, validated: a narrow, owned, linked, expiring exception."""
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: expected a mapping with {list(QUARANTINE_KEYS)}, got {entry!r}")
    where = f"{where} ({entry.get('test', '?')!r})"
    missing = [k for k in QUARANTINE_KEYS if entry.get(k) in (None, "", [])]
    unknown = sorted(set(entry) - set(QUARANTINE_KEYS))
    if missing or unknown:
        raise ValueError(f"{where}: missing {missing}, unknown {unknown}; every entry needs exactly {list(QUARANTINE_KEYS)}")
    test = entry["test"]
    if not isinstance(test, str) or "::" not in test:
        raise ValueError(f"{where}: test: expected a pytest node id (path::name), got {test!r}")
    if any(w in test for w in WILDCARDS):
        match = PATTERN.fullmatch(test)
        if not match or match["family"] not in FAMILIES or any(w in test.split("[", 1)[0] for w in WILDCARDS):
            raise ValueError(
                f"{where}: test: a pattern may cover one family and one implementation only, "
                "e.g. conformance/test_parity.py::test_parity[triton-*fp16*] (module, function "
                f"and implementation literal), got {test!r}"
            )
    for key in ("owner", "reason"):
        if not isinstance(entry[key], str):
            raise ValueError(f"{where}: {key}: expected text, got {entry[key]!r}")
    if not LINK.search(entry["reason"]):
        raise ValueError(
            f"{where}: reason: expected a link to the tracked problem (a URL or an issue "
            f"reference such as #12), got {entry['reason']!r}"
        )
    lanes, known = entry["lanes"], known_lanes()
    if not isinstance(lanes, list) or not all(isinstance(n, str) and n in known for n in lanes):
        raise ValueError(f"{where}: lanes: expected a list of lanes among {known}, got {lanes!r}")
    expires = _date(entry["expires"], f"{where}: expires")
    if expires > today + datetime.timedelta(days=MAX_QUARANTINE_DAYS):
        raise ValueError(
            f"{where}: expires: at most {MAX_QUARANTINE_DAYS} days ahead "
            f"({today + datetime.timedelta(days=MAX_QUARANTINE_DAYS)}), got {expires}"
        )
    return {**entry, "expires": expires}


def utc_today() -> datetime.date:
    return datetime.datetime.now(datetime.timezone.utc).date()


def _date(value, where: str) -> datetime.date:
    if isinstance(value, datetime.date):
        return value
    try:
        return datetime.date.fromisoformat(str(value))
    except ValueError:
        raise ValueError(f"{where}: expected a date YYYY-MM-DD, got {value!r}") from None


def profile_of(policy: dict, profile: str | None) -> dict:
    """The named profile (default: the policy's default_profile)."""
    name = profile or policy["default_profile"]
    if name not in policy["profiles"]:
        raise ValueError(f"--profile: expected one of {sorted(policy['profiles'])}, got {name!r}")
    return policy["profiles"][name]


def required_lanes(policy: dict, profile: str | None, lanes: list | None) -> list:
    if lanes:
        return list(lanes)
    return list(profile_of(policy, profile)["required_lanes"])


def _lane_config(lane: str) -> dict | None:
    from selgate.lanes.config import LANE_DIR, load_lane

    base = lane.removesuffix("-emulated")
    return load_lane(base) if (LANE_DIR / f"{base}.yaml").exists() else None


def lane_families(policy: dict, lane: str) -> list:
    """Families a lane must pass: gate.yaml's plus its lane YAML's (an emulated run counts
    as its lane)."""
    cfg = _lane_config(lane)
    extra = cfg["required_families"] if cfg else []
    return list(dict.fromkeys([*policy["required_families"], *extra]))


def narrowing(lane: str, selection: dict) -> list:
    """How a run's recorded selection falls short of its lane's own (lanes/<lane>.yaml): a
    missing path, a -k, an --impl, another -m, a smaller --size, --deselect, --ignore or --lf. A lane
    without a YAML (an ad-hoc result) has nothing to fall short of."""
    from selgate.conformance.cases import SIZES
    from selgate.lanes.runner import POLICY_TESTS

    cfg = _lane_config(lane)
    if cfg is None:
        return []
    short = []
    ran = selection.get("paths", [])
    missing = [p for p in (*cfg["paths"], POLICY_TESTS) if not any(a in (p, ".") or p.startswith(a + "/") for a in ran)]
    if missing:
        short.append(f"paths without {missing}")
    if selection.get("k"):
        short.append(f"-k {selection['k']!r}")
    if selection.get("impl"):
        short.append(f"--impl {selection['impl']}")
    if (selection.get("m") or "") != (cfg["markers"] or ""):
        short.append(f"-m {selection.get('m')!r} where the lane has {cfg['markers']!r}")
    size = selection.get("size")
    if size not in SIZES or SIZES.index(size) < SIZES.index(cfg["size"]):
        short.append(f"--size {size} where the lane has {cfg['size']}")
    for option in ("deselect", "ignore"):
        if selection.get(option):
            short.append(f"--{option} {selection[option]}")
    if selection.get("last_failed"):
        short.append("--lf")
    return short


def _quarantine_entry(policy: dict, case) -> dict | None:
    """The entry covering `case` in its lane: `*` and `?` are wildcards, brackets literal
    (node ids carry parameters in them)."""
    for entry in policy["quarantine"]:
        if fnmatch.fnmatchcase(case.nodeid, entry["test"].replace("[", "[[]")) and case.lane in entry["lanes"]:
            return entry
    return None


def provenance(name: str, stamp: dict | None, tree: dict) -> list:
    """Why a lane's tree stamp is not the tree being gated (`tree`): full commit ids and the
    digest of every file that can change a run must both be equal."""
    if not stamp:
        return [f"required lane {name} has no tree stamp: rerun it with `python -m selgate.lanes run {name}`"]
    ran, here = str(stamp.get("commit")), str(tree["commit"])
    out = []
    if not FULL_COMMIT.fullmatch(ran):
        out.append(f"required lane {name} names commit {ran!r}, not a full commit id")
    elif ran != here:
        out.append(f"required lane {name} ran commit {ran}, this tree is commit {here}: rerun the lane on it")
    if stamp.get("digest") != tree["digest"]:
        out.append(
            f"required lane {name} ran other files than this tree has (digest {str(stamp.get('digest'))[:12]}, "
            f"here {tree['digest'][:12]}): rerun the lane on this tree"
        )
    if config := untracked_config(stamp):
        out.append(f"required lane {name} ran with untracked pytest configuration {config}: commit or remove it")
    return out


def configuration(name: str, pytest_config: dict | None) -> list:
    """Why the run's pytest configuration is not the lane's own (pyproject.toml, no addopts
    from the environment, plugins named rather than autoloaded)."""
    if not pytest_config:
        return [f"required lane {name} recorded no pytest configuration: rerun it with `python -m selgate.lanes run {name}`"]
    out = []
    if pytest_config.get("inifile") != "pyproject.toml":
        out.append(
            f"required lane {name} read its pytest configuration from {pytest_config.get('inifile')!r}, not pyproject.toml"
        )
    if pytest_config.get("env_addopts"):
        out.append(f"required lane {name} ran under PYTEST_ADDOPTS={pytest_config['env_addopts']!r}")
    if pytest_config.get("autoload", True):
        out.append(f"required lane {name} ran with pytest plugin autoloading on (any installed plugin could deselect tests)")
    return out


def tolerances(name: str, environment: dict, cfg: dict | None) -> list:
    """Tolerances come from the lane YAML only: the run's overrides must be the lane's."""
    from selgate.conformance.tolerances import ENV
    from selgate.lanes.config import tolerance_env

    wanted = tolerance_env(cfg).get(ENV, "none") if cfg else "none"
    ran = environment.get("tolerance_overrides", "none")
    if ran != wanted:
        return [
            f"required lane {name} ran with {ENV}={ran!r}, its lane YAML gives {wanted!r}: only "
            "tolerance_overrides in the lane YAML (with a reason and the measured error) may change a tolerance"
        ]
    return []


def cut_short(name: str, cut: dict) -> str:
    """The blocking line of a run cut short: what cut it and how far it got."""
    by = f"by {cut['signal']}" if cut.get("signal") else f"({cut.get('reason') or 'interrupted'})"
    done, total = cut.get("tests_done", 0), cut.get("tests_collected", 0)
    share = f" ({100 * done // total} %)" if total else ""
    return (
        f"required lane {name} cut short {by} after {done} of {total} tests{share}: its JUnit holds the "
        f"results it has; rerun the lane to completion (`python -m selgate.lanes run {name}`)"
    )


def inventory_gaps(name: str, lane: LaneResult, cfg: dict | None) -> list:
    """How the tests with a result differ from the lane's inventory."""
    if cfg is None:
        return []
    inventory = lane.inventory
    if not inventory:
        return [f"required lane {name} has no inventory.json: rerun it with `python -m selgate.lanes run {name}`"]
    if inventory.get("exitstatus") not in (0, 5):
        return [
            f"required lane {name}: collecting its inventory failed (pytest exit {inventory.get('exitstatus')}): "
            + " ".join(str(inventory.get("output", "")).split())[-300:]
        ]
    # a module that failed to collect reports under its path, and blocks as an error of its own
    gaps = difference(inventory.get("ids", []), [c.nodeid for c in lane.cases if "::" in c.nodeid])
    return [f"required lane {name} ran another set than its selection collects: {'; '.join(gaps)}"] if gaps else []


def evaluate(
    policy: dict,
    results: dict,
    required: list,
    today: datetime.date | None = None,
    *,
    tree: dict,
    same_commit: bool = False,
    sanitizer: dict | None = None,
    require_sanitizer: bool = False,
) -> Verdict:
    """Apply the policy to `{lane: LaneResult}` gated for `tree` (the tree stamp of what is
    being gated); blocking lines come most fundamental first. `same_commit` (a profile's
    flag, set for releases): the gated tree must be committed, with no change beside it.
    `require_sanitizer` (likewise): the compute-sanitizer pass `sanitizer` must be clean."""
    today = today or utc_today()
    v = Verdict(required)
    family_gaps = []
    if not FULL_COMMIT.fullmatch(str(tree["commit"])):
        v.blocking.append(
            f"the tree being gated names no full commit ({tree['commit']!r}): gate a git checkout, "
            "or set GITHUB_SHA / SELGATE_COMMIT to its full commit id"
        )
    if same_commit and tree.get("dirty"):
        v.blocking.append(
            f"the tree being gated has uncommitted changes to files that can change a run "
            f"({', '.join(tree.get('untracked') or []) or 'tracked files'}): a release gates one "
            "committed tree"
        )
    for entry in policy["quarantine"]:
        if entry["expires"] < today:
            v.blocking.append(
                f"quarantine of {entry['test']} (owner {entry['owner']}) expired on "
                f"{entry['expires']}: fix the test or renew the entry"
            )
    for name in required:
        lane: LaneResult | None = results.get(name)
        if lane is None:
            v.blocking.append(
                f"required lane {name} missing: no {name}/junit.xml in the results (run `python -m selgate.lanes run {name}`)"
            )
            continue
        if lane.refused is not None:
            v.blocking.append(f"required lane {name} never ran: the lane runner refused it ({lane.refused})")
            continue
        counts = lane.counts()
        env = lane.environment
        status = (env or {}).get("pytest_exitstatus")
        cfg = _lane_config(name)
        if env is None:
            v.blocking.append(
                f"required lane {name} unstamped: no environment.json beside {lane.junit} "
                "(not run through `python -m selgate.lanes run`)"
            )
        elif env.get("lane") != name:
            v.blocking.append(f"required lane {name} foreign: {lane.junit} was written by lane {env.get('lane')!r}")
        elif env.get("cut"):
            v.blocking.append(cut_short(name, env["cut"]))
        elif status in ABORTED:
            v.blocking.append(f"required lane {name} aborted: pytest exit {status} ({ABORTED[status]})")
        else:
            v.blocking += provenance(name, env.get("tree"), tree)
            v.blocking += configuration(name, env.get("pytest"))
            v.blocking += tolerances(name, env, cfg)
            if short := narrowing(name, env.get("selection") or {}):
                v.blocking.append(
                    f"required lane {name} narrowed: run with {'; '.join(short)} (the gate needs "
                    f"the lane's whole selection: `python -m selgate.lanes run {name}`)"
                )
            v.blocking += inventory_gaps(name, lane, cfg)
        if not lane.cases:
            v.blocking.append(f"required lane {name} empty: {lane.junit} holds no tests")
        elif counts["pass"] == 0 and counts["fail"] == 0 and counts["error"] == 0:
            v.blocking.append(f"required lane {name} skipped: all {len(lane.cases)} tests skipped or xfailed")
        for family in lane_families(policy, name):
            fc = lane.counts(family)
            if fc["pass"] == 0 and lane.cases:
                family_gaps.append(
                    f"required lane {name}: family {family} has no passing test "
                    f"(pass/fail/error/skip/xfail {'/'.join(map(str, fc.values()))})"
                )
    for lane in results.values():
        if lane.refused is not None and lane.name not in required:
            v.blocking.append(f"lane {lane.name} never ran: the lane runner refused it ({lane.refused})")
        for case in lane.cases:
            if case.outcome not in ("fail", "error"):
                continue
            entry = _quarantine_entry(policy, case)
            if entry is not None and entry["expires"] >= today:
                v.quarantined.append((case, entry))
            else:
                seed = f" (seed {case.seed})" if case.seed else ""
                v.blocking.append(f"lane {lane.name}: {case.outcome.upper()} {case.nodeid}{seed}: {case.message}")
    v.blocking += family_gaps
    if require_sanitizer:
        v.blocking += sanitizer_blocking(sanitizer, tree)
    return v
