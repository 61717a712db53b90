#!/usr/bin/env bash
# Installs the Debian packages Airlock needs (as root), or prints exactly what to install.
# Usage: system-packages.sh <package:command>...   e.g. bubblewrap:bwrap
set -euo pipefail
missing=()
for pair in "$@"; do
  command -v "${pair#*:}" >/dev/null 2>&1 || missing+=("${pair%%:*}")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  printf '\033[1m==> Installing system packages: %s\033[0m\n' "${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  echo "airlock: missing system packages: ${missing[*]}" >&2
  echo "install them with: sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
