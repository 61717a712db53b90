#!/usr/bin/env bash
# Installs the Debian packages Airlock needs (as root), quietly: one line, apt's own output in
# a log shown only when it fails. Not root: prints what is missing and the command, exits 1.
# Usage: system-packages.sh [--missing] <package:command>...   e.g. bubblewrap:bwrap
#   --missing   install nothing: print the names of the missing packages (space-separated)
set -euo pipefail
only_list=false
if [ "${1:-}" = --missing ]; then only_list=true; shift; fi
missing=()
for pair in "$@"; do  # /usr/sbin too: an ordinary user's PATH lacks it, and debootstrap lives there
  PATH="$PATH:/usr/sbin:/sbin" command -v "${pair#*:}" >/dev/null 2>&1 || missing+=("${pair%%:*}")
done
if $only_list; then echo "${missing[*]}"; exit 0; fi
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  log=$(mktemp /tmp/airlock-apt.XXXXXX.log)
  started=$SECONDS
  printf '\033[1m==> Installing system packages: %s\033[0m\n' "${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  if { apt-get update -q && apt-get install -y -q --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; then
    echo "    installed in $((SECONDS - started)) s"
    rm -f "$log"
  else
    tail -n 15 "$log" >&2
    echo "airlock: installing ${missing[*]} failed (apt-get's whole output: $log)" >&2
    exit 1
  fi
else
  echo "airlock: missing system packages: ${missing[*]}; install them with: sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
