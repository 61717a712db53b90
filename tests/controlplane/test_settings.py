"""A bad environment stops start-up with a one-line explanation, never a traceback."""

import os
import subprocess
import sys
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
    base["AIRLOCK_DATA_DIR"] = "/nonexistent/airlock-test"
    return subprocess.run(
        [sys.executable, *command],
        cwd=ROOT,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("env", "explanation"),
    [
        ({}, "SECRET_KEY is missing or shorter than 50 characters while DEBUG is off"),
        ({"SECRET_KEY": "short"}, "SECRET_KEY is missing or shorter than 50 characters while DEBUG is off"),
        ({"SECRET_KEY": GOOD_KEY, "ALLOWED_HOSTS": "*"}, "ALLOWED_HOSTS contains a wildcard while DEBUG is off"),
        ({"DEBUG": "maybe"}, "DEBUG='maybe' is not a boolean"),
        ({"SECRET_KEY": GOOD_KEY, "DATABASE_URL": "mysql://x/y"}, "DATABASE_URL scheme 'mysql' is not supported"),
        (
            {"SECRET_KEY": GOOD_KEY, "AIRLOCK_KEY_TOUCH_INTERVAL_S": "soon"},
            "AIRLOCK_KEY_TOUCH_INTERVAL_S='soon' is not an integer",
        ),
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


def test_a_good_environment_starts(tmp_path):
    result = start({"SECRET_KEY": GOOD_KEY, "AIRLOCK_DATA_DIR": str(tmp_path)}, "manage.py", "check", "--deploy")
    assert result.returncode == 0, result.stderr


def test_debug_off_sets_secure_cookie_flags(settings):
    assert settings.DEBUG is False
    assert settings.SESSION_COOKIE_SECURE and settings.CSRF_COOKIE_SECURE and settings.SESSION_COOKIE_HTTPONLY
