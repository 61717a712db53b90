"""Typed readers for settings taken from the environment.

Each helper raises ImproperlyConfigured with one line naming the variable and what it accepts,
so a bad value stops start-up with an explanation instead of a traceback deep in Django.
"""

import os
import tempfile
from urllib.parse import unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

TRUE_WORDS = {"1", "true", "yes", "on"}
FALSE_WORDS = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str = "") -> str:
    return os.environ.get(name, default).strip()


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    word = raw.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean: use one of true/false, 1/0, yes/no")


def env_int(name: str, default: int, *, minimum: int = 0) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not an integer") from None
    if value < minimum:
        raise ImproperlyConfigured(f"{name}={value} is below its minimum of {minimum}")
    return value


def env_float(name: str, default: float, *, minimum: float = 0.0) -> float:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw.strip())
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a number") from None
    if not value >= minimum:  # also refuses nan
        raise ImproperlyConfigured(f"{name}={value} is below its minimum of {minimum}")
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def database_from_url(url: str, *, sqlite_default: str) -> dict:
    """Django DATABASES['default'] from DATABASE_URL (postgres:// or sqlite:///path)."""
    if not url:
        return _sqlite(sqlite_default)
    parts = urlsplit(url)
    if parts.scheme == "sqlite":
        path = unquote(parts.path)
        if not path or path == "/":
            raise ImproperlyConfigured("DATABASE_URL=sqlite:/// needs a file path, e.g. sqlite:////var/lib/airlock/db.sqlite3")
        return _sqlite(path[1:] if path.startswith("//") else path)
    if parts.scheme in {"postgres", "postgresql"}:
        name = unquote(parts.path.lstrip("/"))
        if not name:
            raise ImproperlyConfigured("DATABASE_URL has no database name, e.g. postgres://user@127.0.0.1:5432/airlock")
        try:
            port = parts.port
        except ValueError:
            raise ImproperlyConfigured("DATABASE_URL has a port that is not a number") from None
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": name,
            "USER": unquote(parts.username or ""),
            "PASSWORD": unquote(parts.password or ""),
            "HOST": parts.hostname or "",
            "PORT": str(port or ""),
            "CONN_MAX_AGE": 60,
            "CONN_HEALTH_CHECKS": True,
        }
    raise ImproperlyConfigured(
        f"DATABASE_URL scheme {parts.scheme!r} is not supported: use postgres:// or sqlite:///"
    )


def _sqlite(path: str) -> dict:
    return {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": path,
        # Writers wait for the lock instead of failing at once; IMMEDIATE takes the write lock
        # at BEGIN, so a read-then-write transaction cannot deadlock against another writer.
        "OPTIONS": {"timeout": 20, "transaction_mode": "IMMEDIATE",
                    "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"},
        # Tests use a file too, not SQLite's shared in-memory database: the runner's threads
        # write concurrently, and shared-cache memory databases fail such writers at once.
        "TEST": {"NAME": os.path.join(tempfile.gettempdir(), f"airlock-test-{os.getpid()}.sqlite3")},
    }
