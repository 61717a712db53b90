#!/usr/bin/env bash
# `make test`: ruff, then the suite on SQLite + in-memory channel layer, then on
# PostgreSQL + Redis (required when CI=true, skipped with a notice otherwise).
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf '\033[1m==> %s\033[0m\n' "$*"; }

./scripts/bootstrap.sh dev
say "ruff"
.venv/bin/ruff check .

say "pytest: SQLite + in-memory channel layer"
env -u DATABASE_URL -u REDIS_URL .venv/bin/python -m pytest "$@"

pg_url=${AIRLOCK_TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}
redis_url=${AIRLOCK_TEST_REDIS_URL:-redis://127.0.0.1:6379/0}
if .venv/bin/python scripts/services_up.py "$pg_url" "$redis_url"; then
  # The driver conformance suite touches no database, and the browser tests run their own server
  # on the embedded defaults: the first pass ran them exactly as this one would.
  say "pytest: PostgreSQL + Redis (without tests/runtimes and tests/browser, which do not use them)"
  DATABASE_URL=$pg_url REDIS_URL=$redis_url AIRLOCK_CHANNEL_PREFIX="airlock-test-$$" \
    .venv/bin/python -m pytest --ignore=tests/runtimes --ignore=tests/browser "$@"
elif [ "${CI:-}" = true ]; then
  echo "airlock: PostgreSQL or Redis is not reachable, and CI requires the PostgreSQL + Redis pass" >&2
  exit 1
else
  say "PostgreSQL + Redis pass skipped: start them (see README) or set CI=true to require it"
fi
