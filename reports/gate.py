"""The gate: the policy in gate.yaml applied to the lanes' results, giving a verdict whose
first blocking line names what blocks."""
from __future__ import annotations

import datetime
import fnmatch
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from .results import LaneResult

POLICY_FILE = Path(__file__).resolve().parent / "gate.yaml"
QUARANTINE_KEYS = ("test", "owner", "reason", "expires")
ABORTED = {2: "interrupted", 3: "internal error", 4: "usage error"}


@dataclass
class Verdict:
    required_lanes: list
    blocking: list = field(default_factory=list)
    quarantined: list = field(default_factory=list)   # (CaseResult, entry)
    notes: list = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.blocking

    def headline(self) -> str:
        if self.passed:
            return f"GATE PASSED: required lanes {', '.join(self.required_lanes)}"
        more = f" (and {len(self.blocking) - 1} more)" if len(self.blocking) > 1 else ""
        return f"GATE BLOCKED: {self.blocking[0]}{more}"


def load_policy(path: Path = POLICY_FILE) -> dict:
    """gate.yaml, validated: ValueError names the bad entry."""
    policy = yaml.safe_load(Path(path).read_text()) or {}
    for key in ("default_profile", "profiles", "required_families", "quarantine"):
        if key not in policy:
            raise ValueError(f"{path}: missing key {key!r}")
    for i, entry in enumerate(policy["quarantine"] or []):
        missing = [k for k in QUARANTINE_KEYS if not str(entry.get(k, "")).strip()]
        if missing:
            raise ValueError(f"{path}: quarantine[{i}] ({entry.get('test', '?')}): missing {missing}; "
                             f"every entry needs {list(QUARANTINE_KEYS)}")
        entry["expires"] = _date(entry["expires"], f"{path}: quarantine[{i}].expires")
    return policy


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


def lane_families(policy: dict, lane: str) -> list:
    """Families a lane must pass: gate.yaml's plus its lane YAML's (an emulated run counts
    as its lane)."""
    from selgate.lanes.config import LANE_DIR, load_lane

    base = lane.removesuffix("-emulated")
    extra = load_lane(base)["required_families"] if (LANE_DIR / f"{base}.yaml").exists() else []
    return list(dict.fromkeys([*policy["required_families"], *extra]))


def narrowing(lane: str, selection: dict) -> list:
    """How a run's recorded selection falls short of its lane's own (lanes/<lane>.yaml): a
    missing path, a -k, another -m, a smaller --size, --deselect, --ignore or --lf. A lane
    without a YAML (an ad-hoc result) has nothing to fall short of."""
    from selgate.conformance.cases import SIZES
    from selgate.lanes.config import LANE_DIR, load_lane
    from selgate.lanes.runner import POLICY_TESTS

    base = lane.removesuffix("-emulated")
    if not (LANE_DIR / f"{base}.yaml").exists():
        return []
    cfg = load_lane(base)
    short = []
    ran = selection.get("paths", [])
    missing = [p for p in (*cfg["paths"], POLICY_TESTS) if not any(a in (p, ".") or p.startswith(a + "/") for a in ran)]
    if missing:
        short.append(f"paths without {missing}")
    if selection.get("k"):
        short.append(f"-k {selection['k']!r}")
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
    """The entry covering `case`: `*` and `?` are wildcards, brackets literal (node ids
    carry parameters in them)."""
    for entry in policy["quarantine"] or []:
        if fnmatch.fnmatchcase(case.nodeid, entry["test"].replace("[", "[[]")) and case.lane in entry.get("lanes", [case.lane]):
            return entry
    return None


def evaluate(policy: dict, results: dict, required: list, today: datetime.date | None = None, *,
             same_commit: bool = False) -> Verdict:
    """Apply the policy to `{lane: LaneResult}`; blocking lines come most fundamental first.
    `same_commit` (a profile's flag, set for releases): the required lanes must have run one commit."""
    today = today or datetime.datetime.now(datetime.timezone.utc).date()
    v = Verdict(required)
    family_gaps = []
    for entry in policy["quarantine"] or []:
        if entry["expires"] < today:
            v.blocking.append(f"quarantine of {entry['test']} (owner {entry['owner']}) expired on "
                              f"{entry['expires']}: fix the test or renew the entry")
    for name in required:
        lane: LaneResult | None = results.get(name)
        if lane is None:
            v.blocking.append(f"required lane {name} missing: no {name}/junit.xml in the results "
                              f"(run `python -m selgate.lanes run {name}`)")
            continue
        counts = lane.counts()
        status = (lane.environment or {}).get("pytest_exitstatus")
        if lane.environment is None:
            v.blocking.append(f"required lane {name} unstamped: no environment.json beside {lane.junit} "
                              "(not run through `python -m selgate.lanes run`)")
        elif lane.environment.get("lane") != name:
            v.blocking.append(f"required lane {name} foreign: {lane.junit} was written by lane "
                              f"{lane.environment.get('lane')!r}")
        elif status in ABORTED:
            v.blocking.append(f"required lane {name} aborted: pytest exit {status} ({ABORTED[status]})")
        elif "selection" not in lane.environment:
            v.notes.append(f"lane {name}: its environment.json predates recorded selections, so the gate "
                           "cannot tell whether the run was narrowed")
        elif short := narrowing(name, lane.environment["selection"]):
            v.blocking.append(f"required lane {name} narrowed: run with {'; '.join(short)} (the gate needs "
                              f"the lane's whole selection: `python -m selgate.lanes run {name}`)")
        if not lane.cases:
            v.blocking.append(f"required lane {name} empty: {lane.junit} holds no tests")
        elif counts["pass"] == 0 and counts["fail"] == 0 and counts["error"] == 0:
            v.blocking.append(f"required lane {name} skipped: all {len(lane.cases)} tests skipped or xfailed")
        for family in lane_families(policy, name):
            fc = lane.counts(family)
            if fc["pass"] == 0 and lane.cases:
                family_gaps.append(f"required lane {name}: family {family} has no passing test "
                                  f"(pass/fail/error/skip/xfail {'/'.join(map(str, fc.values()))})")
    commits = {n: (results[n].environment or {}).get("commit", "unknown") for n in required if n in results}
    unnamed = [n for n, c in commits.items() if c in ("", "unknown") or c.endswith("+dirty")]
    shortest = min(commits.values(), key=len, default="")  # a 7-digit git hash and GITHUB_SHA[:12] may name one commit
    if same_commit and (any(not c.startswith(shortest) for c in commits.values()) or unnamed):
        v.blocking.append("required lanes ran different or unnamed commits (" + ", ".join(
            f"{n} {c}" for n, c in commits.items()) + "): a release gates one committed tree; rerun the lanes on it")
    for lane in results.values():
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
    return v
