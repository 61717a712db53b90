"""A bad environment stops start-up with a one-line explanation, never a traceback."""

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GOOD_KEY = "k" * 64


def start(env: dict, *command: str) -> subprocess.CompletedProcess:
    base = {
        key: value
        for key, value in os.environ.items()
        if key not in {"DEBUG", "SECRET_KEY", "ALLOWED_HOSTS", "DATABASE_URL", "REDIS_URL"}
    }
    # An empty data directory: no secret_key file left there by `make run` may stand in.
    with tempfile.TemporaryDirectory(prefix="airlock-settings-") as data:
        return subprocess.run(
            [sys.executable, *command],
            cwd=ROOT,
            env={**base, "AIRLOCK_DATA_DIR": data, **env},
            capture_output=True,
            text=True,
            timeout=60,
        )


def refused(env: dict, explanation: str, name: str):
    """A case where everything is good but `env`."""
    return pytest.param({"SECRET_KEY": GOOD_KEY, **env}, explanation, id=name)


@pytest.mark.parametrize(
    ("env", "explanation"),
    [
        pytest.param({}, "SECRET_KEY is missing or shorter than 50 characters while DEBUG is off", id="no-key"),
        refused({"SECRET_KEY": "short"}, "SECRET_KEY is missing or shorter than 50 characters while DEBUG is off",
                "short-key"),
        refused({"ALLOWED_HOSTS": "*"}, "ALLOWED_HOSTS contains a wildcard while DEBUG is off", "wildcard-host"),
        refused({"ALLOWED_HOSTS": " , "}, "ALLOWED_HOSTS is set but empty", "no-host"),
        refused({"DEBUG": "maybe"}, "DEBUG='maybe' is not a boolean", "debug-not-boolean"),
        refused({"DATABASE_URL": "mysql://x/y"}, "DATABASE_URL scheme 'mysql' is not supported", "database-mysql"),
        refused({"DATABASE_URL": "sqlite:///relative.sqlite3"},
                "DATABASE_URL=sqlite:///relative.sqlite3 is not an absolute path; an absolute path takes four slashes",
                "database-sqlite-relative"),
        refused({"DATABASE_URL": "sqlite:////tmp/x.sqlite3?mode=ro"}, "a sqlite URL takes no options",
                "database-sqlite-options"),
        refused({"DATABASE_URL": "postgres://airlock:pw@127.0.0.1/airlock?sslmod=require"},
                'DATABASE_URL: invalid connection option "sslmod"', "database-postgres-unknown-option"),
        refused({"REDIS_URL": "localhost:6379"}, "REDIS_URL is not a redis://, rediss:// or unix:// URL",
                "redis-no-scheme"),
        refused({"REDIS_URL": "redis://127.0.0.1:63x9/0"}, "REDIS_URL has a port that is not a number", "redis-port"),
        refused({"AIRLOCK_DATA_DIR": "/dev/null/airlock"}, "AIRLOCK_DATA_DIR=/dev/null/airlock cannot be created",
                "data-dir-impossible"),
        refused({"CSRF_TRUSTED_ORIGINS": "airlock.example.com"},
                "CSRF_TRUSTED_ORIGINS: 'airlock.example.com' is not an origin; write its scheme and host",
                "csrf-origin-without-scheme"),
        refused({"AIRLOCK_KEY_TOUCH_INTERVAL_S": "soon"}, "AIRLOCK_KEY_TOUCH_INTERVAL_S='soon' is not an integer",
                "touch-interval-not-integer"),
        refused({"AIRLOCK_LOG_LEVEL": "loud"},
                "AIRLOCK_LOG_LEVEL='loud' is not one of DEBUG, INFO, WARNING, ERROR, CRITICAL", "log-level"),
        refused({"AIRLOCK_RUNTIME": "bogus"}, "AIRLOCK_RUNTIME='bogus' is not one of bubblewrap, docker, gvisor",
                "runtime"),
        refused({"AIRLOCK_RUNNER_HEARTBEAT_S": "5", "AIRLOCK_RUNNER_DEAD_AFTER_S": "5"},
                "AIRLOCK_RUNNER_DEAD_AFTER_S=5 is not longer than AIRLOCK_RUNNER_HEARTBEAT_S=5",
                "dead-after-heartbeat"),
        refused({"AIRLOCK_EMBEDDED_RUNNER": "0"}, "AIRLOCK_EMBEDDED_RUNNER is off but REDIS_URL is unset",
                "separate-runners-without-redis"),
        refused({"AIRLOCK_MAX_FILE_BYTES": "200000", "AIRLOCK_MAX_REQUEST_BYTES": "100000"},
                "AIRLOCK_MAX_REQUEST_BYTES=100000 is below AIRLOCK_MAX_FILE_BYTES=200000", "request-below-file"),
        refused({"AIRLOCK_REDACT_VALUES": "a-long-secret-value,abc"},
                "AIRLOCK_REDACT_VALUES holds a value shorter than 6 characters", "redact-value-too-short"),
        refused({"AIRLOCK_REDACT_VALUES": "first-line\nsecond-line"},
                "AIRLOCK_REDACT_VALUES holds a value with a line break", "redact-value-line-break"),
        refused({"AIRLOCK_METRICS_TOKEN": "t" * 23}, "AIRLOCK_METRICS_TOKEN is shorter than 24 characters",
                "metrics-token-short"),
        refused({"AIRLOCK_WARM_POOL": "bubblewrap:2"},
                "AIRLOCK_WARM_POOL='bubblewrap:2': 'bubblewrap' is not a driver with a pool (use docker, gvisor)",
                "warm-pool-driver"),
        refused({"AIRLOCK_WARM_POOL": "docker:many"}, "AIRLOCK_WARM_POOL='docker:many': 'many' is not a pool size",
                "warm-pool-size"),
        refused({"AIRLOCK_WARM_POOL": "docker:4,gvisor:65"}, "a pool holds 0 to 64 sandboxes", "warm-pool-too-big"),
        refused({"AIRLOCK_WARM_POOL": "docker:2,docker:3"}, "names docker twice", "warm-pool-twice"),
        refused({"AIRLOCK_CLIENT_TIMEOUT_S": "soon"}, "AIRLOCK_CLIENT_TIMEOUT_S='soon' is not a number",
                "client-timeout"),
        refused({"AIRLOCK_MAX_CONNECTIONS_PER_CLIENT": "-1"}, "AIRLOCK_MAX_CONNECTIONS_PER_CLIENT", "connections"),
        refused({"AIRLOCK_SERVER_CPU": "first"}, "AIRLOCK_SERVER_CPU='first': expected auto, off or a CPU's number",
                "server-cpu"),
        refused({"AIRLOCK_SERVER_CPU": "-1"}, "AIRLOCK_SERVER_CPU='-1'", "server-cpu-negative"),
    ],
)
def test_a_bad_environment_stops_manage_py_with_one_line(env, explanation):
    result = start(env, "manage.py", "check")
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("airlock: configuration error: ")
    assert explanation in result.stderr
    assert "Traceback" not in result.stderr


def test_a_bad_environment_stops_the_asgi_server_with_one_line():
    result = start({"SECRET_KEY": "short"}, "-c", "import controlplane.asgi")
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert "airlock: configuration error: SECRET_KEY is missing" in result.stderr


def test_a_bad_environment_stops_the_server_with_one_line():
    result = start({"SECRET_KEY": GOOD_KEY, "AIRLOCK_CLIENT_TIMEOUT_S": "0"}, "-m", "controlplane.serve", "-p", "1",
                   "controlplane.asgi:application")
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == [
        "airlock: configuration error: AIRLOCK_CLIENT_TIMEOUT_S=0.0 is below its minimum of 0.1"], result.stderr


def test_a_cpu_the_server_may_not_run_on_stops_it_with_one_line():
    result = start({"SECRET_KEY": GOOD_KEY, "AIRLOCK_SERVER_CPU": "4095"}, "-m", "controlplane.serve", "-p", "1",
                   "controlplane.asgi:application")
    assert result.returncode != 0
    allowed = ", ".join(map(str, sorted(os.sched_getaffinity(0))))
    assert result.stderr.strip().splitlines() == [
        f"airlock: configuration error: AIRLOCK_SERVER_CPU=4095: this process may run on CPUs {allowed} only"], \
        result.stderr


def test_a_good_environment_starts(tmp_path):
    result = start({"SECRET_KEY": GOOD_KEY, "AIRLOCK_DATA_DIR": str(tmp_path),
                    "AIRLOCK_WARM_POOL": " docker:4, gvisor:2 "}, "manage.py", "check", "--deploy")
    assert result.returncode == 0, result.stderr


def test_debug_off_sets_secure_cookie_flags(settings):
    assert settings.DEBUG is False
    assert settings.SESSION_COOKIE_SECURE and settings.CSRF_COOKIE_SECURE and settings.SESSION_COOKIE_HTTPONLY


@pytest.mark.parametrize(("groups", "files", "expected"), [
    ("0::/pod\n", {"pod/cpu.max": "150000 100000\n"}, 1.5),  # v2, a pod's CPU limit of 1.5
    ("0::/pod\n", {"pod/cpu.max": "max 100000\n"}, None),  # v2, no quota
    ("4:cpu,cpuacct:/docker/x\n", {"cpu,cpuacct/docker/x/cpu.cfs_quota_us": "100000\n",
                                   "cpu,cpuacct/docker/x/cpu.cfs_period_us": "100000\n"}, 1.0),  # v1, --cpus=1
    ("4:cpu:/\n", {"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),  # v1, none
    ("0::/pod\n", {"pod/cpu.max": "20000 100000\n"}, 1.0),  # a fifth of a core still counts as one
    ("0::/gone\n", {}, None),  # unreadable: the CPUs it may run on
])
def test_the_cpus_a_deployment_may_use_follow_its_cgroup_quota(tmp_path, groups, files, expected):
    """The default per-tenant API rate is 10 a second per CPU: a container's quota, not the node's
    cores, decides it."""
    from controlplane.env import host_cpus

    (tmp_path / "cgroup").write_text(groups)
    for name, text in files.items():
        (tmp_path / "fs" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "fs" / name).write_text(text)
    runnable = len(os.sched_getaffinity(0))
    found = host_cpus(groups_file=str(tmp_path / "cgroup"), cgroup_root=str(tmp_path / "fs"))
    assert found == (max(1.0, min(runnable, expected)) if expected is not None else runnable)
