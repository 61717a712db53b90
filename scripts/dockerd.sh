#!/usr/bin/env bash
# Starts dockerd when it is installed and not running, and waits until it answers.
set -euo pipefail
command -v dockerd >/dev/null || { echo "airlock: dockerd is not installed (apt-get install docker.io)" >&2; exit 1; }
docker info >/dev/null 2>&1 && exit 0
printf '\033[1m==> Starting dockerd\033[0m\n'
mkdir -p /var/log
nohup dockerd >/var/log/airlock-dockerd.log 2>&1 &
for _ in $(seq 1 60); do
  docker info >/dev/null 2>&1 && exit 0
  sleep 0.5
done
echo "airlock: dockerd did not start; see /var/log/airlock-dockerd.log" >&2
tail -20 /var/log/airlock-dockerd.log >&2
exit 1
