#!/usr/bin/env bash
# `make run`: Airlock on its embedded defaults (SQLite, in-memory channel layer, bubblewrap)
# at http://127.0.0.1:8000, with a demo tenant whose login and API key are printed once.
# As root it also installs what sandboxes need and builds their root filesystem the first
# time; not root, it says in one line what is missing and how to add it, and serves anyway.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf '\033[1m==> %s\033[0m\n' "$*"; }
started=$SECONDS
sandbox_packages=(bubblewrap:bwrap debootstrap:debootstrap)

if [ "$(id -u)" = 0 ]; then
  ./scripts/system-packages.sh "${sandbox_packages[@]}" || say "Continuing without them: sessions cannot start yet"
fi
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

build=$(.venv/bin/python scripts/rootfs_built.py) && built=true || built=false
if $built; then
  say "Sandbox ${build}"
elif [ "$(id -u)" = 0 ]; then
  say "Building the sandbox root filesystem (once; later runs reuse it)"
  .venv/bin/python manage.py build_rootfs ||
    say "Serving anyway: sessions fail with sandbox_unavailable until the root filesystem is built"
fi
if [ "$(id -u)" != 0 ]; then
  $built && build=""
  missing=$(./scripts/system-packages.sh --missing "${sandbox_packages[@]:0:1}" ${build:+"${sandbox_packages[@]:1}"})
  steps=${missing:+sudo apt-get install -y $missing}
  steps+=${missing:+${build:+ && }}${build:+sudo $build}
  if [ -n "$steps" ]; then
    what=${missing:+the packages $missing}${missing:+${build:+ and }}${build:+the sandbox root filesystem}
    echo "airlock: not root, so sessions cannot start yet: missing $what; run: $steps" >&2
  fi
fi

host=${AIRLOCK_HOST:-127.0.0.1}
port=${AIRLOCK_PORT:-8000}
say "Serving the dashboard and API on http://$host:$port/ (ready $((SECONDS - started)) s after make run; Ctrl-C stops)"
exec .venv/bin/python -m controlplane.serve -b "$host" -p "$port" --access-log - controlplane.asgi:application
