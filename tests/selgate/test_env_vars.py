"""The environment-variable registry: one parser per type, malformed values named, and every
variable the package and its scripts mention declared and documented in docs/configuration.md."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from selgate import env_vars
from selgate.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
NAME = re.compile(r"\b(?:NSA|SELGATE)_[A-Z0-9_]*[A-Z0-9]\b")


def package_dirs() -> list[Path]:
    """The folders pyproject.toml maps into the `selgate` namespace."""
    mapping = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    return sorted({ROOT / d for d in mapping.values()})


def test_docs_are_the_generated_text():
    assert (ROOT / "docs" / "configuration.md").read_text() == env_vars.markdown(), (
        "regenerate: python -m selgate.env_vars --markdown > docs/configuration.md"
    )


def test_every_variable_the_package_names_is_declared():
    found = {}
    sources = [path for folder in package_dirs() for path in (*folder.rglob("*.py"), *folder.rglob("*.yaml"))]
    scripts = [path for folder in ("bin", ".ci") for path in (ROOT / folder).iterdir() if path.is_file()]
    for path in [*sources, *scripts]:
        for name in NAME.findall(path.read_text()):
            found.setdefault(name, str(path.relative_to(ROOT)))
    assert found
    # selgate reads its own namespace only: another project's NSA_* variable is never declared
    assert {n: p for n, p in found.items() if n not in env_vars.VARS} == {}


@pytest.mark.parametrize("var", env_vars.VARS.values(), ids=lambda v: v.name)
def test_declared_readers_exist_and_one_names_the_variable(var):
    """Some readers take the name through a constant (e.g. tolerances.ENV), so one literal suffices."""
    assert var.type in env_vars.PARSERS and var.group in env_vars.GROUPS and var.meaning
    texts = [(ROOT / reader).read_text() for reader in var.readers]
    assert any(var.name in text for text in texts)


@pytest.mark.parametrize(
    "raw, value",
    [("1", True), ("TRUE", True), ("yes", True), ("On", True), ("0", False), ("false", False), ("NO", False), ("off", False)],
)
def test_flags_take_every_spelling(raw, value):
    assert env_vars.get("SELGATE_STRICT", environ={"SELGATE_STRICT": raw}) is value


def test_unset_or_empty_is_the_default():
    assert env_vars.get("SELGATE_TRITON_NORMALIZE", environ={}) is True
    assert env_vars.get("SELGATE_TRITON_NORMALIZE", environ={"SELGATE_TRITON_NORMALIZE": ""}) is True
    assert env_vars.get("SELGATE_TRITON_MIN_L", 512, environ={}) == 512
    assert env_vars.get("SELGATE_TRITON_MIN_L", 512, environ={"SELGATE_TRITON_MIN_L": "64"}) == 64
    assert env_vars.get("SELGATE_CUDA_BUILD_WAIT", environ={"SELGATE_CUDA_BUILD_WAIT": "2.5"}) == 2.5
    assert env_vars.get("SELGATE_CONFIG_DIR", environ={"SELGATE_CONFIG_DIR": "/x"}) == Path("/x")


@pytest.mark.parametrize(
    "name, raw, expected",
    [
        ("SELGATE_STRICT", "maybe", "expected one of"),
        ("SELGATE_TRITON_MIN_L", "4k", "expected an integer"),
        ("SELGATE_CUDA_BUILD_WAIT", "soon", "expected a finite number"),
        ("SELGATE_CUDA_BUILD_WAIT", "inf", "expected a finite number"),
    ],
)
def test_a_malformed_value_names_the_variable_and_the_value(name, raw, expected):
    with pytest.raises(ConfigError, match=rf"^{name}: {expected}.*{raw!r}"):
        env_vars.get(name, environ={name: raw})


def test_the_process_environment_is_read(monkeypatch):
    monkeypatch.setenv("SELGATE_VALIDATE_RANGES", "nope")
    with pytest.raises(ConfigError, match="SELGATE_VALIDATE_RANGES"):
        env_vars.get("SELGATE_VALIDATE_RANGES")


def test_an_undeclared_name_is_refused():
    with pytest.raises(KeyError, match="SELGATE_NOPE"):
        env_vars.get("SELGATE_NOPE")
