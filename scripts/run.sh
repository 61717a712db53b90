#!/usr/bin/env bash
# `make run`: Airlock on its embedded defaults (SQLite, in-memory channel layer, bubblewrap)
# at http://127.0.0.1:8000, with a demo tenant whose login and API key are printed once.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf '\033[1m==> %s\033[0m\n' "$*"; }

./scripts/system-packages.sh bubblewrap:bwrap
./scripts/bootstrap.sh

export AIRLOCK_DATA_DIR=${AIRLOCK_DATA_DIR:-$PWD/var}
mkdir -p "$AIRLOCK_DATA_DIR"
key_file="$AIRLOCK_DATA_DIR/secret_key"
if [ -z "${SECRET_KEY:-}" ] && [ ! -s "$key_file" ]; then
  say "Generating a secret key in $key_file (settings read it from there)"
  (umask 077 && .venv/bin/python -c 'import secrets; print(secrets.token_urlsafe(64))' > "$key_file")
fi

say "Applying database migrations"
.venv/bin/python manage.py migrate --no-input -v 1
.venv/bin/python manage.py demo_setup

host=${AIRLOCK_HOST:-127.0.0.1}
port=${AIRLOCK_PORT:-8000}
say "Serving the dashboard and API on http://$host:$port/ (Ctrl-C stops)"
exec .venv/bin/python -m controlplane.serve -b "$host" -p "$port" --access-log - controlplane.asgi:application
