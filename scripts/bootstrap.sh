#!/usr/bin/env bash
# Creates .venv and installs Airlock's pinned dependencies (`dev` adds the test tools), and its
# client (clients/python: the SDK, the `airlock` CLI and its MCP server) into the same .venv.
# Re-runs are instant: a stamp records what the environment was installed from.
set -euo pipefail
cd "$(dirname "$0")/.."
extra=${1:-}
say() { printf '\033[1m==> %s\033[0m\n' "$*"; }

if [ ! -x .venv/bin/python ]; then
  say "Creating .venv with $(python3 --version)"
  python3 -m venv .venv
fi
target=.
[ "$extra" = dev ] && target=".[dev]"
stamp=".venv/.airlock-installed-$(cat pyproject.toml constraints.txt clients/python/pyproject.toml | sha256sum | cut -c1-16)-${extra:-base}"
if [ ! -f "$stamp" ] && [ ! -f "${stamp%-base}-dev" ]; then
  say "Installing Python packages into .venv (pinned in pyproject.toml and constraints.txt; ~1 min the first time)"
  started=$SECONDS
  log=$(mktemp /tmp/airlock-pip.XXXXXX.log)
  if ! { .venv/bin/python -m pip install --disable-pip-version-check -q --upgrade pip &&
         .venv/bin/python -m pip install --disable-pip-version-check -c constraints.txt -e "$target" \
           -e "clients/python[mcp]"; } >"$log" 2>&1; then
    tail -n 20 "$log" >&2
    echo "airlock: installing the Python packages failed (pip's whole output: $log)" >&2
    exit 1
  fi
  echo "    installed in $((SECONDS - started)) s"
  rm -f "$log" .venv/.airlock-installed-*
  touch "$stamp"
fi
