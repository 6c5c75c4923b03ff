"""What every command line of the package shares: a parser whose help shows each option's default,
and argument types that turn a bad value into a usage error (exit 2) naming the option, before
anything runs."""

from __future__ import annotations

import argparse
import contextlib
import math
import os
from pathlib import Path


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions as written; each option's help ends with its default where it has one and
    the help does not already say it."""

    def _get_help_string(self, action):
        text = action.help or ""
        default = action.default
        if (
            "default" in text
            or default is None
            or default is argparse.SUPPRESS
            or action.nargs == 0  # a flag (--help, store_true): its default is its absence
            or (action.nargs in (argparse.OPTIONAL, argparse.ZERO_OR_MORE) and not action.option_strings)
        ):
            return text
        shown = ",".join(map(str, default)) if isinstance(default, (list, tuple)) else default
        return f"{text} (default {shown})".lstrip()


class Parser(argparse.ArgumentParser):
    """argparse with HelpFormatter; its subcommands' parsers are Parsers too (argparse makes them
    of the parent's class)."""

    def __init__(self, *args, formatter_class=HelpFormatter, **kwargs):
        super().__init__(*args, formatter_class=formatter_class, **kwargs)


def _number(kind, text: str, lowest, strict: bool, highest=None, expected: str | None = None):
    """`text` as `kind`, or a usage error saying what was expected (by default, the lower bound)."""
    expected = expected or f"{'an integer' if kind is int else 'a finite number'} {'>' if strict else '>='} {lowest:g}"
    try:
        value = kind(text)
    except ValueError:
        value = None
    # an integer is never compared as a float: one of 400 digits overflowed math.isfinite (a traceback)
    if (
        value is None
        or (kind is float and not math.isfinite(value))
        or value < lowest
        or (strict and value == lowest)
        or (highest is not None and value > highest)
    ):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    return value


# Each worker is a process importing torch (and, in a check, an executor more): no machine runs
# more, and a count past a C long overflowed inside xdist (a traceback, exit 1).
MAX_WORKERS = 1024
WORKERS_RANGE = f">= 1 (a crashing test needs a worker to die in) and at most {MAX_WORKERS} (each is a process)"
MAX_TIMEOUT_S = 7 * 24 * 3600  # a week; beyond, a timer overflows (pytest-timeout raised OverflowError in every case)


def workers(text: str) -> int:
    """A count of xdist workers: at least one, at most MAX_WORKERS."""
    return _number(int, text, 1, False, MAX_WORKERS, WORKERS_RANGE)


def worker_number(text: str) -> int:
    """An integer for a --workers whose range is checked later (the lane runner refuses it after
    removing the lane's earlier results); a non-integer is refused here in `workers`' words."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {WORKERS_RANGE}, got {text!r}") from None


def seconds(text: str) -> int:
    """A time limit in whole seconds: at least one, at most MAX_TIMEOUT_S."""
    return _number(
        int, text, 1, False, MAX_TIMEOUT_S, f"an integer >= 1 and at most {MAX_TIMEOUT_S} s (a week; a longer timer overflows)"
    )


INT64_MAX = 2**63 - 1  # torch's sizes and counts are int64


def positive_int(text: str) -> int:
    return _number(int, text, 0, True, INT64_MAX, "an integer > 0 and at most 2^63 - 1 (torch's int64)")


def count(text: str) -> int:
    """An integer >= 0 (warm-up calls, restarts)."""
    return _number(int, text, 0, False, INT64_MAX, "an integer >= 0 and at most 2^63 - 1 (torch's int64)")


def positive_number(text: str) -> float:
    """A duration, a rate: finite and > 0."""
    return _number(float, text, 0.0, strict=True)


def int_list(text: str) -> list[int]:
    """Comma-separated positive integers (shapes)."""
    try:
        items = [positive_int(x) for x in text.split(",") if x]
    except argparse.ArgumentTypeError:
        items = []
    if not items:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers > 0, got {text!r}")
    return items


def choice_list(choices):
    def parse(text: str) -> list[str]:
        items = [x for x in text.split(",") if x]
        bad = [x for x in items if x not in choices]
        if bad or not items:
            raise argparse.ArgumentTypeError(f"expected a comma-separated subset of {sorted(choices)}, got {text!r}")
        return items

    return parse


def spec_problem(spec: str, what: str) -> str | None:
    """What is wrong with `spec` as `package.module:callable` (the option `what` named), or None: a
    path (`../k/refk:fn`) failed inside importlib with a message about relative imports."""
    module, sep, attr = spec.partition(":")
    if not (module and sep and attr):
        return f"{what}: expected package.module:callable (the callable after a colon), got {spec!r}"
    if not all(part.isidentifier() for part in module.split(".")):
        return (
            f"{what}: {module!r} is not a module name: the module is imported from the current folder "
            "(run from the kernel's folder, or put it on PYTHONPATH, and name it as Python imports it: pkg.mod:fn)"
        )
    return None


def command(sub, name: str, what: str, **kwargs) -> argparse.ArgumentParser:
    """A subcommand whose one-line summary is also its own --help's description."""
    return sub.add_parser(name, help=what, description=what, **kwargs)


WRITE_PROBE = ".selgate-writable"


def cannot_write(folder: Path, size: int = 1 << 20) -> str | None:
    """Why `folder` takes no file of `size` bytes, or None: a read-only, full or not-a-folder
    --out is the caller's to fix, said before a run rather than as a traceback after it. The
    folders it makes to find out are removed again."""
    folder = Path(folder).absolute()
    made = [f for f in (folder, *folder.parents) if not f.exists()]
    probe = folder / WRITE_PROBE
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe.unlink(missing_ok=True)  # a symlink left there would lead the write to its target
        with os.fdopen(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600), "wb") as f:
            f.write(bytes(size))
    except (FileExistsError, NotADirectoryError):
        return "not a folder"
    except OSError as e:
        return e.strerror or str(e)
    finally:
        with contextlib.suppress(OSError):  # a read-only mount refuses even removing a missing file
            probe.unlink(missing_ok=True)
            for f in made:
                f.rmdir()
    return None
