"""The tree a lane ran: the full commit and a digest of every file that can change a run
(code, configuration, pytest configuration, test data), tracked or untracked. The gate
compares it with the tree being gated, so results from another commit, another working
tree or a tree with an extra `pytest.ini` cannot stand in for this one."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from pathlib import Path

from selgate.kernels import settings

ROOT = Path(__file__).resolve().parent.parent
FULL_COMMIT = re.compile(r"[0-9a-f]{40}")
# What a run reads: sources, configuration and test data. Prose cannot change a run.
RUN_SUFFIXES = (
    ".py",
    ".pyi",
    ".yaml",
    ".yml",
    ".toml",
    ".ini",
    ".cfg",
    ".json",
    ".csv",
    ".txt",
    ".sh",
    ".cu",
    ".cuh",
    ".cpp",
    ".cc",
    ".c",
    ".h",
    ".hpp",
)
NOT_RUN = ("docs/", "reports/evidence/", "reports/out/")
# Files pytest reads its own configuration from; untracked, they can narrow a run unseen.
PYTEST_CONFIG = ("pytest.ini", ".pytest.ini", "tox.ini", "setup.cfg", "conftest.py", "pyproject.toml")
# Without git (a copy of the tree in an image), the walk skips what git and .dockerignore leave out.
SKIP_DIRS = {".git", ".venv", "venv", "__pycache__", ".hypothesis", ".pytest_cache", "build", ".whl", ".mypy_cache"}


def _git(root: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], capture_output=True, text=True, timeout=60, cwd=root)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def runs(path: str) -> bool:
    """Whether the file at `path` (relative, `/`-separated) can change a run."""
    return path.endswith(RUN_SUFFIXES) and not path.startswith(NOT_RUN)


def _walk(root: Path) -> list[str]:
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS and not d.endswith(".egg-info")]
        rel = Path(dirpath).relative_to(root)
        found += [(rel / f).as_posix() for f in filenames]
    return found


def commit(root: Path = ROOT) -> str:
    """The full commit id: SELGATE_COMMIT (a copy of the tree without .git), GITHUB_SHA in CI,
    else the checkout's HEAD; "unknown" when none names one."""
    named = settings.get("SELGATE_COMMIT") or os.environ.get("GITHUB_SHA")
    if named:
        return named
    head = _git(root, "rev-parse", "HEAD")
    return head.strip() if head else "unknown"


def tree_stamp(root: Path = ROOT) -> dict:
    """{commit, digest, files, untracked, dirty} of the tree at `root`. `untracked` lists the
    untracked files that can change a run and `dirty` says whether the run-relevant files
    differ from the commit; both are None in a copy without git."""
    root = Path(root)
    listed = _git(root, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
    if listed is None:
        paths, untracked, dirty = _walk(root), None, None
    else:
        paths = listed.split("\0")
        others = _git(root, "ls-files", "-z", "--others", "--exclude-standard") or ""
        untracked = sorted(p for p in others.split("\0") if p and runs(p))
        changed = _git(root, "diff", "--name-only", "-z", "HEAD") or ""
        dirty = bool(untracked) or any(runs(p) for p in changed.split("\0") if p)
    digest = hashlib.sha256()
    files = 0
    for path in sorted({p for p in paths if p and runs(p)}):
        full = root / path
        if not full.is_file():  # tracked but deleted in the working tree
            continue
        digest.update(path.encode() + b"\0" + hashlib.sha256(full.read_bytes()).digest())
        files += 1
    return {"commit": commit(root), "digest": digest.hexdigest(), "files": files, "untracked": untracked, "dirty": dirty}


def untracked_config(stamp: dict) -> list[str]:
    """Untracked pytest configuration files in a tree stamp."""
    return [p for p in stamp.get("untracked") or [] if p.rsplit("/", 1)[-1] in PYTEST_CONFIG]
