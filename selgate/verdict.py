"""What a verdict is, for the gate and for `selgate check` alike: it passes when nothing
blocks, its headline says what a pass covers or names the first thing that blocks, and
pytest's exit statuses are worded once."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

ABORTED = {2: "interrupted", 3: "internal error", 4: "usage error"}  # pytest stopped before a verdict
EXIT_MEANING = {0: "passed", 1: "tests failed", **ABORTED, 5: "no tests collected"}


def pytest_exit(status) -> str:
    """`pytest exit 2 (interrupted)`; a status pytest never gives says so."""
    return f"pytest exit {status} ({EXIT_MEANING.get(status, 'not a pytest exit status')})"


@dataclass(kw_only=True)
class Verdict:
    """`subject` PASSED (with `scope()`, what the pass covers) or BLOCKED (the first of
    `blocking`, and how many more)."""

    subject: ClassVar[str]
    blocking: list = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.blocking

    def scope(self) -> str:
        raise NotImplementedError

    @property
    def headline(self) -> str:
        if self.passed:
            return f"{self.subject} PASSED: {self.scope()}"
        more = f" (and {len(self.blocking) - 1} more)" if len(self.blocking) > 1 else ""
        return f"{self.subject} BLOCKED: {self.blocking[0]}{more}"
