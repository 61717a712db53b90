"""Typed readers for settings taken from the environment.

Each helper raises ImproperlyConfigured with one line naming the variable and what it accepts,
so a bad value stops start-up with an explanation instead of a traceback deep in Django.
"""

import os
import re
import tempfile
from urllib.parse import parse_qsl, unquote, urlsplit

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


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    """One of `choices`, matched without regard to case; unset or empty, the default."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    for choice in choices:
        if raw.lower() == choice.lower():
            return choice
    raise ImproperlyConfigured(f"{name}={raw!r} is not one of {', '.join(choices)}")


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_pools(name: str, drivers: tuple[str, ...]) -> dict[str, int]:
    """`driver:size,…` (for example `docker:4,gvisor:2`): how many started sandboxes each driver
    keeps warm. Unset or empty: none."""
    raw = os.environ.get(name, "").strip()
    pools: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in raw.split(","))):
        driver, _, size = item.partition(":")
        driver = driver.strip().lower()
        if driver in pools:
            raise ImproperlyConfigured(f"{name}={raw!r} names {driver} twice; give each driver one size")
        if driver not in drivers:
            raise ImproperlyConfigured(f"{name}={raw!r}: {driver!r} is not a driver with a pool "
                                       f"(use {', '.join(drivers)}), as in docker:4,gvisor:2")
        try:
            pools[driver] = int(size)
        except ValueError:
            raise ImproperlyConfigured(f"{name}={raw!r}: {size!r} is not a pool size, as in docker:4") from None
        if not 0 <= pools[driver] <= 64:
            raise ImproperlyConfigured(f"{name}={raw!r}: a pool holds 0 to 64 sandboxes")
    return pools


def host_memory_mb() -> int:
    """The memory this process may use: the host's (MemTotal), or its cgroup's limit when that is
    lower (a container); 4096 where neither can be read."""
    total = None
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemTotal:"):
                    total = int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        pass
    limits = []
    try:
        with open("/proc/self/cgroup", encoding="ascii") as groups:
            for line in groups:
                _, controllers, path = line.strip().split(":", 2)
                if controllers == "":  # v2
                    limits.append(f"/sys/fs/cgroup{path}/memory.max")
                elif "memory" in controllers.split(","):
                    limits.append(f"/sys/fs/cgroup/memory{path}/memory.limit_in_bytes")
    except (OSError, ValueError):
        pass
    for limit in limits:
        try:
            with open(limit, encoding="ascii") as file:
                value = int(file.read().strip()) // 2**20  # "max" (no limit) is not a number
        except (OSError, ValueError):
            continue
        total = min(total, value) if total else value
    return total or 4096


def host_cpus(*, groups_file: str = "/proc/self/cgroup", cgroup_root: str = "/sys/fs/cgroup") -> float:
    """The CPUs this process may use: those it may run on, or its cgroup's CPU quota when that is
    lower (a container started with --cpus, a pod's CPU limit); at least 1."""
    cpus = float(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))
    quotas = []
    try:
        with open(groups_file, encoding="ascii") as groups:
            for line in groups:
                _, controllers, path = line.strip().split(":", 2)
                if controllers == "":  # v2: "quota period" in one file, "max" for none
                    quotas.append((f"{cgroup_root}{path}/cpu.max", None))
                elif "cpu" in controllers.split(","):
                    base = f"{cgroup_root}/{controllers}{path}"
                    quotas.append((f"{base}/cpu.cfs_quota_us", f"{base}/cpu.cfs_period_us"))
    except (OSError, ValueError):
        pass
    for quota_file, period_file in quotas:
        try:
            with open(quota_file, encoding="ascii") as file:
                parts = file.read().split()
            if period_file is not None:
                with open(period_file, encoding="ascii") as file:
                    parts.append(file.read().strip())
            quota, period = int(parts[0]), int(parts[1])  # "max" (v2) is not a number: no quota
        except (OSError, ValueError, IndexError):
            continue
        if quota > 0 and period > 0:  # v1 writes -1 for none
            cpus = min(cpus, quota / period)
    return max(1.0, cpus)


def database_from_url(url: str, *, sqlite_default: str) -> dict:
    """Django DATABASES['default'] from DATABASE_URL: postgres://user:password@host:port/name, whose
    query options (?sslmode=require) are libpq's, or sqlite:////absolute/path."""
    if not url:
        return _sqlite(sqlite_default)
    parts = urlsplit(url)
    if parts.scheme == "sqlite":
        return _sqlite(_sqlite_path(url, parts))
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
            "OPTIONS": _postgres_options(parts.query),
            "CONN_MAX_AGE": 60,
            "CONN_HEALTH_CHECKS": True,
        }
    raise ImproperlyConfigured(
        f"DATABASE_URL scheme {parts.scheme!r} is not supported: use postgres://user@host:5432/name or "
        "sqlite:////absolute/path.sqlite3"
    )


def _sqlite_path(url: str, parts) -> str:
    example = "sqlite:////var/lib/airlock/db.sqlite3"
    if parts.query or parts.fragment:
        raise ImproperlyConfigured(f"DATABASE_URL: a sqlite URL takes no options (?{parts.query}); e.g. {example}")
    if parts.netloc:
        raise ImproperlyConfigured(f"DATABASE_URL: a sqlite URL has no host ({parts.netloc!r}); e.g. {example}")
    path = unquote(parts.path)
    if not path.startswith("//"):  # sqlite:///rel.db: relative to wherever the process happens to start
        raise ImproperlyConfigured(f"DATABASE_URL={url} is not an absolute path; an absolute path takes four "
                                   f"slashes, e.g. {example}")
    if path.rstrip("/") == "":
        raise ImproperlyConfigured(f"DATABASE_URL={url} needs a file path, e.g. {example}")
    return path[1:]


def _postgres_options(query: str) -> dict:
    """?sslmode=require&connect_timeout=5: connection options, each one libpq knows."""
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=True) if query else []
    except ValueError:
        raise ImproperlyConfigured("DATABASE_URL has options that are not name=value pairs") from None
    options = dict(pairs)
    if len(options) != len(pairs):  # (the values are not shown: one may be a password)
        repeated = sorted({name for name, _ in pairs if sum(other == name for other, _ in pairs) > 1})
        raise ImproperlyConfigured(f"DATABASE_URL repeats the option {', '.join(repeated)}")
    try:
        from psycopg import ProgrammingError
        from psycopg.conninfo import make_conninfo
    except ImportError:  # no driver: Django says so when it connects
        return options
    try:
        make_conninfo("", **options)
    except ProgrammingError as exc:
        raise ImproperlyConfigured(f"DATABASE_URL: {str(exc).strip()} (options are libpq's: sslmode, connect_timeout, "
                                   "application_name, …)") from None
    return options


def _sqlite(path: str) -> dict:
    return {
        "ENGINE": "controlplane.sqlite",
        "NAME": path,
        # Writers wait for the lock instead of failing at once; IMMEDIATE takes the write lock
        # at BEGIN, so a read-then-write transaction cannot deadlock against another writer.
        "OPTIONS": {"timeout": 20, "transaction_mode": "IMMEDIATE",
                    "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"},
        # A request thread keeps its connection, as with PostgreSQL: opening one (Django registers
        # its SQL functions, then the PRAGMAs run) cost ~0.7 ms of CPU, on every API call.
        "CONN_MAX_AGE": 60,
        "CONN_HEALTH_CHECKS": True,
        # Tests use a file too, not SQLite's shared in-memory database: the runner's threads
        # write concurrently, and shared-cache memory databases fail such writers at once.
        "TEST": {"NAME": os.path.join(tempfile.gettempdir(), f"airlock-test-{os.getpid()}.sqlite3")},
    }


def check_redis_url(url: str) -> str:
    """REDIS_URL as redis-py reads it: redis://[:password@]host[:port][/db], rediss:// (TLS) or
    unix:///path/to/socket. Refused here rather than at the first message sent."""
    if not url:
        return url
    example = "e.g. redis://127.0.0.1:6379/0"
    parts = urlsplit(url)
    if parts.scheme not in {"redis", "rediss", "unix"}:
        # (the value is not shown: it may hold a password)
        raise ImproperlyConfigured(f"REDIS_URL is not a redis://, rediss:// or unix:// URL, {example}")
    if parts.scheme == "unix":
        if not parts.path.startswith("/"):
            raise ImproperlyConfigured("REDIS_URL=unix:// needs the socket's absolute path, e.g. "
                                       "unix:///run/redis/redis.sock")
        return url
    if not parts.hostname:
        raise ImproperlyConfigured(f"REDIS_URL has no host, {example}")
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError:
        raise ImproperlyConfigured(f"REDIS_URL has a port that is not a number, {example}") from None
    database = parts.path.strip("/")
    if database and not database.isdigit():
        raise ImproperlyConfigured(f"REDIS_URL: the database after the host must be a number, {example}")
    return url


def parse_key(name: str, raw: str) -> bytes:
    """A 256-bit key written as 64 hex digits or as base64 (standard or URL-safe)."""
    import base64
    import binascii

    raw = raw.strip()
    if re.fullmatch(r"[0-9a-fA-F]{64}", raw):
        return bytes.fromhex(raw)
    try:
        key = base64.b64decode(raw.replace("-", "+").replace("_", "/") + "=" * (-len(raw) % 4), validate=True)
    except (binascii.Error, ValueError):
        key = b""
    if len(key) != 32:
        raise ImproperlyConfigured(f"{name} is not a 256-bit key; generate one with: "
                                   "python3 -c 'import secrets; print(secrets.token_hex(32))'")
    return key


def env_keys(name: str, file_name: str) -> list[bytes]:
    """Keys from `name` (comma-separated), else from the file `file_name` names (one a line)."""
    raw = os.environ.get(name, "").strip()
    path = os.environ.get(file_name, "").strip()
    if raw and path:
        raise ImproperlyConfigured(f"{name} and {file_name} are both set; give the key one way")
    if path:
        try:
            with open(path, encoding="ascii") as handle:
                raw = ",".join(line.strip() for line in handle if line.strip() and not line.startswith("#"))
        except (OSError, UnicodeDecodeError) as exc:
            raise ImproperlyConfigured(f"{file_name}={path} cannot be read: {exc}") from None
        if not raw:
            raise ImproperlyConfigured(f"{file_name}={path} holds no key")
    return [parse_key(name if not path else file_name, item) for item in raw.split(",") if item.strip()]


def env_json(name: str, default: dict) -> dict:
    import json

    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ImproperlyConfigured(f"{name} must be a JSON object of the storage backend's options")
    return value
