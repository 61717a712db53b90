#!/usr/bin/env bash
# Makes the Docker engine ready for Airlock: gVisor's runsc registered (with --network=none)
# when it is installed, dockerd started when it is not running, and waits until it answers.
set -euo pipefail
say() { printf '\033[1m==> %s\033[0m\n' "$*"; }
command -v dockerd >/dev/null || { echo "airlock: dockerd is not installed (apt-get install docker.io)" >&2; exit 1; }

if command -v runsc >/dev/null; then
  mkdir -p /etc/docker
  python3 - "$(command -v runsc)" <<'PY'
import json, pathlib, sys
path = pathlib.Path("/etc/docker/daemon.json")
config = json.loads(path.read_text() or "{}") if path.exists() else {}
# No network; a sandbox may connect to the host's Unix socket mounted into it (its egress proxy).
wanted = {"path": sys.argv[1], "runtimeArgs": ["--network=none", "--host-uds=open"]}
if config.get("runtimes", {}).get("runsc") != wanted:
    config.setdefault("runtimes", {})["runsc"] = wanted
    path.write_text(json.dumps(config, indent=2) + "\n")
    print("==> registered runsc (gVisor) in /etc/docker/daemon.json")
PY
fi

if docker info >/dev/null 2>&1; then
  if command -v runsc >/dev/null && ! docker info --format '{{json .Runtimes}}' | grep -q host-uds; then
    say "Reloading dockerd to pick up runsc"
    kill -HUP "$(pidof dockerd)"
    sleep 1
  fi
  exit 0
fi
say "Starting dockerd"
nohup dockerd >/var/log/airlock-dockerd.log 2>&1 &
for _ in $(seq 1 60); do
  docker info >/dev/null 2>&1 && exit 0
  sleep 0.5
done
echo "airlock: dockerd did not start; see /var/log/airlock-dockerd.log" >&2
tail -20 /var/log/airlock-dockerd.log >&2
exit 1
