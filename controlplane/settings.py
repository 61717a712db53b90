"""Airlock settings: one module, driven by the environment (see the table in README.md)."""

import fnmatch
import os
import re
from pathlib import Path
from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured

from controlplane.env import (
    check_redis_url,
    database_from_url,
    env_bool,
    env_choice,
    env_float,
    env_int,
    env_json,
    env_keys,
    env_list,
    env_pools,
    env_str,
    host_cpus,
    host_memory_mb,
)

BASE_DIR = Path(__file__).resolve().parent.parent
# `var/` of the checkout unless set; a relative value is taken from the working directory, once.
DATA_DIR = Path(os.path.abspath(env_str("AIRLOCK_DATA_DIR") or BASE_DIR / "var"))

DEBUG = env_bool("DEBUG", False)
SECRET_KEY = env_str("SECRET_KEY")
if not SECRET_KEY and (DATA_DIR / "secret_key").is_file():
    # `make run` keeps a generated key here (mode 600), so manage.py commands find it too.
    try:
        SECRET_KEY = (DATA_DIR / "secret_key").read_text().strip()
    except OSError as exc:
        raise ImproperlyConfigured(f"{DATA_DIR / 'secret_key'} cannot be read: {exc.strerror}") from None
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost"])
if not ALLOWED_HOSTS:
    raise ImproperlyConfigured("ALLOWED_HOSTS is set but empty; list the host names Airlock serves, or unset it "
                               "for 127.0.0.1,localhost")

if not DEBUG:
    if len(SECRET_KEY) < 50:
        raise ImproperlyConfigured(
            "SECRET_KEY is missing or shorter than 50 characters while DEBUG is off; "
            "generate one with: python3 -c 'import secrets; print(secrets.token_urlsafe(64))'"
        )
    if "*" in ALLOWED_HOSTS:
        raise ImproperlyConfigured(
            "ALLOWED_HOSTS contains a wildcard while DEBUG is off; list the host names Airlock serves"
        )
elif not SECRET_KEY:
    SECRET_KEY = "insecure-development-key-only-used-while-DEBUG-is-on-0123456789"  # noqa: S105

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "channels",
    "controlplane",
    "policies_app",
    "sessions.apps.AgentSessionsConfig",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "controlplane.security.content_security_policy",
    "controlplane.static_files.AsyncWhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "controlplane.urls"
ASGI_APPLICATION = "controlplane.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "controlplane.context_processors.tenant_nav",
            ],
        },
    },
]

DATABASES = {
    "default": database_from_url(env_str("DATABASE_URL"), sqlite_default=str(DATA_DIR / "airlock.sqlite3"))
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = check_redis_url(env_str("REDIS_URL"))
CHANNEL_CAPACITY = {
    # Every request for a runner is a message on its channel (a bulk kill sends one per session).
    "airlock.runner.*": 10_000,
    # A reply to a runner call shares its process's one key with the live events of its
    # WebSockets (controlplane/channel_layer.py): past their 100 a reply still gets in.
    "specific.*!airlock.reply.*": 10_000,
}
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "controlplane.channel_layer.RedisChannelLayer",  # channels_redis's, mended (its docstring)
            # redis-py 8 reads with a 5 s socket timeout by default, exactly channels-redis's BRPOP
            # wait: an idle receive would then fail with TimeoutError. Reads wait longer than that.
            "CONFIG": {"hosts": [{"address": REDIS_URL, "socket_timeout": 15, "health_check_interval": 30}],
                       "prefix": env_str("AIRLOCK_CHANNEL_PREFIX") or "airlock",
                       "channel_capacity": CHANNEL_CAPACITY},
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer",
                                  # Given compiled: channels' in-memory layer never compiles the globs
                                  # (channels_redis does; cf. django/channels_redis#73).
                                  "CONFIG": {"channel_capacity": [(re.compile(fnmatch.translate(glob)), capacity)
                                                                  for glob, capacity in
                                                                  CHANNEL_CAPACITY.items()]}}}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator", "OPTIONS": {"min_length": 12}},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
# WhiteNoise serves static/ straight from the finders; STATIC_ROOT only matters to
# `collectstatic`, for a deployment that serves the files from a front proxy instead.
STATIC_ROOT = env_str("AIRLOCK_STATIC_ROOT") or None
WHITENOISE_USE_FINDERS = True

# Cookies and headers: strict by default. AIRLOCK_SECURE_COOKIES may be turned off only for a
# plain-HTTP loopback demo; browsers treat 127.0.0.1 and localhost as secure origins anyway.
SECURE_COOKIES = env_bool("AIRLOCK_SECURE_COOKIES", not DEBUG)
SESSION_COOKIE_SECURE = SECURE_COOKIES
CSRF_COOKIE_SECURE = SECURE_COOKIES
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
CSRF_COOKIE_HTTPONLY = True
CSRF_FAILURE_VIEW = "controlplane.views.csrf_failure"  # a stale token gets a page that can send the form again
SESSION_COOKIE_AGE = env_int("AIRLOCK_SESSION_COOKIE_AGE_S", 8 * 3600, minimum=60)
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
# Sent only on responses over HTTPS (directly, or AIRLOCK_BEHIND_TLS_PROXY): a browser that saw
# it reaches this host over HTTPS only, for this long. 0 turns it off.
SECURE_HSTS_SECONDS = env_int("AIRLOCK_HSTS_SECONDS", 365 * 86400, minimum=0)
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])
for _origin in CSRF_TRUSTED_ORIGINS:
    _parts = urlsplit(_origin)
    if _parts.scheme not in {"http", "https"} or not _parts.netloc or _parts.path not in {"", "/"}:
        raise ImproperlyConfigured(f"CSRF_TRUSTED_ORIGINS: {_origin!r} is not an origin; write its scheme and "
                                   "host, e.g. https://airlock.example.com")
if env_bool("AIRLOCK_BEHIND_TLS_PROXY", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["controlplane.api.auth.ApiKeyAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["controlplane.api.parsers.BoundedJSONParser"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "controlplane.api.errors.exception_handler",
    "UNAUTHENTICATED_USER": None,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Airlock API",
    "DESCRIPTION": "Agent-facing API: sessions, commands and policies. Authenticate with "
    "`Authorization: Bearer <key>`.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_PERMISSIONS": ["rest_framework.permissions.AllowAny"],
    "SERVE_AUTHENTICATION": [],
    # Served from static/vendor (npm swagger-ui-dist): no CDN.
    "SWAGGER_UI_DIST": "/static/vendor/swagger-ui",
    "SWAGGER_UI_FAVICON_HREF": "/static/favicon.svg",
}

# Sandboxes. Root keeps shared state under /var (the root filesystem is built once per machine);
# anyone else keeps it in the data directory.
_AS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
AIRLOCK_RUNTIME = env_choice("AIRLOCK_RUNTIME", "bubblewrap", ("bubblewrap", "docker", "gvisor"))
AIRLOCK_ROOTFS_DIR = env_str(
    "AIRLOCK_ROOTFS_DIR", "/var/cache/airlock/rootfs" if _AS_ROOT else str(DATA_DIR / "rootfs")
)
AIRLOCK_SANDBOX_DIR = env_str(
    "AIRLOCK_SANDBOX_DIR", "/var/lib/airlock/sandboxes" if _AS_ROOT else str(DATA_DIR / "sandboxes")
)

# Egress (docs/architecture.md, "Egress"). The server's port, which no sandbox reaches through its
# proxy whatever the policy says (the database's and Redis's ports neither).
AIRLOCK_PORT = env_int("AIRLOCK_PORT", 8000, minimum=1)
# FOR TESTS AND BENCHMARKS ONLY, never production: "name=127.0.0.1:port,..." makes every session's
# proxy resolve `name` to that loopback upstream, past the deny set (start-up logs a warning).
AIRLOCK_EGRESS_TEST_HOSTS = {}
for _item in env_list("AIRLOCK_EGRESS_TEST_HOSTS", []):
    _name, _, _target = _item.partition("=")
    _address, _, _port = _target.rpartition(":")
    if not (_name and _port.isdigit() and 0 < int(_port) < 65536 and _address in {"127.0.0.1", "[::1]"}):
        raise ImproperlyConfigured(f"AIRLOCK_EGRESS_TEST_HOSTS: {_item!r} is not name=127.0.0.1:port (test upstreams "
                                   "are on loopback only)")
    AIRLOCK_EGRESS_TEST_HOSTS[_name.lower()] = (_address.strip("[]"), int(_port))

# The runner: embedded in the server (the default), or `manage.py runner` processes when REDIS_URL
# is set and AIRLOCK_EMBEDDED_RUNNER is off. A runner that misses heartbeats for
# AIRLOCK_RUNNER_DEAD_AFTER_S is declared dead: its sessions fail and its sandboxes are reaped.
AIRLOCK_EMBEDDED_RUNNER = env_bool("AIRLOCK_EMBEDDED_RUNNER", True)
if not AIRLOCK_EMBEDDED_RUNNER and not REDIS_URL:
    raise ImproperlyConfigured(
        "AIRLOCK_EMBEDDED_RUNNER is off but REDIS_URL is unset; separate runners reach the server only "
        "through Redis: set REDIS_URL, or turn the embedded runner back on"
    )
AIRLOCK_RUNNER_HEARTBEAT_S = env_int("AIRLOCK_RUNNER_HEARTBEAT_S", 2, minimum=1)
AIRLOCK_RUNNER_DEAD_AFTER_S = env_int("AIRLOCK_RUNNER_DEAD_AFTER_S", 15, minimum=2)
if AIRLOCK_RUNNER_DEAD_AFTER_S <= AIRLOCK_RUNNER_HEARTBEAT_S:
    raise ImproperlyConfigured(
        f"AIRLOCK_RUNNER_DEAD_AFTER_S={AIRLOCK_RUNNER_DEAD_AFTER_S} is not longer than AIRLOCK_RUNNER_HEARTBEAT_S="
        f"{AIRLOCK_RUNNER_HEARTBEAT_S}: every runner would be declared dead between two beats"
    )
AIRLOCK_RUNNER_REAP_INTERVAL_S = env_int("AIRLOCK_RUNNER_REAP_INTERVAL_S", 60, minimum=1)
# Started sandboxes each driver keeps warm, per runner (sessions/runtimes/pool.py): docker:4,gvisor:2.
AIRLOCK_WARM_POOL = env_pools("AIRLOCK_WARM_POOL", ("docker", "gvisor"))
AIRLOCK_RUNNER_THREADS = env_int("AIRLOCK_RUNNER_THREADS", 64, minimum=4)
# Admission (sessions/admission.py): what one tenant may have at once, and the host memory the
# sessions of one runner may reserve (their policies' memory, /workspace and /tmp limits).
# One server serves ~35-40 commands a second per core it may use (bench/sessions.py; a container's
# CPU quota counts): a tenant's pace is about a quarter of that, so no one tenant can take the
# server from the others.
AIRLOCK_API_RATE_PER_TENANT = env_float("AIRLOCK_API_RATE_PER_TENANT", round(10 * host_cpus()), minimum=1)
AIRLOCK_MAX_SESSIONS_PER_TENANT = env_int("AIRLOCK_MAX_SESSIONS_PER_TENANT", 32, minimum=1)
# A running command holds one of its runner's threads: a quarter of them per tenant, so that two
# tenants (or three) cannot hold them all either.
AIRLOCK_MAX_COMMANDS_PER_TENANT = env_int("AIRLOCK_MAX_COMMANDS_PER_TENANT", max(1, AIRLOCK_RUNNER_THREADS // 4),
                                          minimum=1)
# (the default leaves an eighth, at least 1 GiB, to the control plane, its database and the host)
_MEMORY_MB = host_memory_mb()
AIRLOCK_RUNNER_MEMORY_MB = env_int("AIRLOCK_RUNNER_MEMORY_MB", max(64, _MEMORY_MB - max(1024, _MEMORY_MB // 8)),
                                   minimum=64)
AIRLOCK_TENANT_MEMORY_SHARE = env_float("AIRLOCK_TENANT_MEMORY_SHARE", 0.5, minimum=0.01)
# How fast one tenant's output is read from its sandboxes on a runner (sessions/runner/core.py):
# past it its commands wait on their own writes, so a flood costs the server (redaction, events)
# a bounded share.
AIRLOCK_OUTPUT_BYTES_PER_S = env_int("AIRLOCK_OUTPUT_BYTES_PER_S", 256 * 1024, minimum=4096)
# What one client may hold of the server (controlplane/connections.py): the time a request's
# headers have to arrive whole (and a body's longest pause), and its open connections per address.
AIRLOCK_CLIENT_TIMEOUT_S = env_float("AIRLOCK_CLIENT_TIMEOUT_S", 20.0, minimum=0.1)
AIRLOCK_MAX_CONNECTIONS_PER_CLIENT = env_int("AIRLOCK_MAX_CONNECTIONS_PER_CLIENT", 256)
# The audit chain's key (controlplane/audit.py): derived from SECRET_KEY unless given; and where
# the chain heads are checkpointed, outside the database.
AIRLOCK_AUDIT_KEY = env_str("AIRLOCK_AUDIT_KEY")
AIRLOCK_AUDIT_CHECKPOINTS = Path(env_str("AIRLOCK_AUDIT_CHECKPOINTS") or DATA_DIR / "audit-checkpoints.jsonl")
# Threads of the server for API requests that wait for a runner (a command with `wait`), and how
# many of them one tenant may hold at once (sessions/admission.py): a quarter, as above.
AIRLOCK_API_THREADS = env_int("AIRLOCK_API_THREADS", 64, minimum=2)
AIRLOCK_API_WAITING_PER_TENANT = env_int("AIRLOCK_API_WAITING_PER_TENANT", max(1, AIRLOCK_API_THREADS // 4),
                                         minimum=1)
# The CPU a server's threads (and a separate runner's) keep to, `auto`, `off` or a CPU's number;
# the sandboxes they start get every CPU (controlplane/cpus.py).
AIRLOCK_SERVER_CPU = env_str("AIRLOCK_SERVER_CPU", "auto").strip().lower()
if AIRLOCK_SERVER_CPU not in {"auto", "off"} and not (AIRLOCK_SERVER_CPU.isascii() and AIRLOCK_SERVER_CPU.isdigit()):
    raise ImproperlyConfigured(f"AIRLOCK_SERVER_CPU={AIRLOCK_SERVER_CPU!r}: expected auto, off or a CPU's number")
# Snapshots and artifacts one tenant may have read and checked whole at once (sessions/admission.py).
AIRLOCK_BLOB_READS_PER_TENANT = env_int("AIRLOCK_BLOB_READS_PER_TENANT", 1, minimum=1)
# A session ends as `expired` at its policy's session_ttl_s, or after this long without a command.
AIRLOCK_SESSION_IDLE_TIMEOUT_S = env_int("AIRLOCK_SESSION_IDLE_TIMEOUT_S", 900, minimum=10)
AIRLOCK_MAX_FILE_BYTES = env_int("AIRLOCK_MAX_FILE_BYTES", 4 * 2**20, minimum=1024)
# Any request body (a workspace file, a policy, a form): longer ones get 413 before being read.
AIRLOCK_MAX_REQUEST_BYTES = env_int("AIRLOCK_MAX_REQUEST_BYTES", AIRLOCK_MAX_FILE_BYTES + 2**20, minimum=65536)
if AIRLOCK_MAX_REQUEST_BYTES < AIRLOCK_MAX_FILE_BYTES:
    raise ImproperlyConfigured(
        f"AIRLOCK_MAX_REQUEST_BYTES={AIRLOCK_MAX_REQUEST_BYTES} is below AIRLOCK_MAX_FILE_BYTES="
        f"{AIRLOCK_MAX_FILE_BYTES}: a file of the allowed size could never be sent"
    )
# Local git repositories a session may start from: "acme:app=/srv/app" for tenant acme's sessions
# only; "docs=/srv/docs", with no tenant, for every tenant's.
AIRLOCK_WORKSPACE_REPOS = [item.partition("=")[::2] for item in env_list("AIRLOCK_WORKSPACE_REPOS", [])]
for _name, _path in AIRLOCK_WORKSPACE_REPOS:
    if not _name.rpartition(":")[2] or not _path.startswith("/"):
        raise ImproperlyConfigured(f"AIRLOCK_WORKSPACE_REPOS: {_name}={_path} is not [tenant:]name=/absolute/path")
# Values redacted from everything stored, streamed or logged, beside the credential shapes.
AIRLOCK_REDACT_VALUES = env_list("AIRLOCK_REDACT_VALUES", [])
if any(len(value) < 6 for value in AIRLOCK_REDACT_VALUES):  # redaction skips them (controlplane/redaction.py)
    raise ImproperlyConfigured("AIRLOCK_REDACT_VALUES holds a value shorter than 6 characters, which would match by "
                               "chance and is never redacted; list only the secrets themselves")
if any("\n" in value or "\r" in value for value in AIRLOCK_REDACT_VALUES):  # output is redacted line by line
    raise ImproperlyConfigured("AIRLOCK_REDACT_VALUES holds a value with a line break, which output redacted line by "
                               "line would never match whole; list each line of it as a value of its own")

# Publishing a version (not a rollback) needs a passing containment eval of it on its driver.
AIRLOCK_REQUIRE_CONTAINMENT_EVAL = env_bool("AIRLOCK_REQUIRE_CONTAINMENT_EVAL", False)

# Decisions older than this are deleted by `manage.py prune_decisions` (run it daily).
AIRLOCK_DECISION_RETENTION_DAYS = env_int("AIRLOCK_DECISION_RETENTION_DAYS", 90, minimum=1)

# Operations metrics: what a CPU-second and a megabyte-hour of workspace storage cost (the
# defaults are about a cloud vCPU and block storage, in US dollars), and the token that
# /metrics (Prometheus) asks for; a tenant's API key with scope metrics:read also reads it,
# for its own tenant only.
AIRLOCK_COST_PER_CPU_SECOND = env_float("AIRLOCK_COST_PER_CPU_SECOND", 0.000012)
AIRLOCK_COST_PER_MB_HOUR = env_float("AIRLOCK_COST_PER_MB_HOUR", 0.00000011)
AIRLOCK_COST_CURRENCY = env_str("AIRLOCK_COST_CURRENCY", "USD")
AIRLOCK_METRICS_TOKEN = env_str("AIRLOCK_METRICS_TOKEN")
AIRLOCK_METRICS_CACHE_S = env_int("AIRLOCK_METRICS_CACHE_S", 15)  # /metrics serves one text this long
if AIRLOCK_METRICS_TOKEN and len(AIRLOCK_METRICS_TOKEN) < 24:
    raise ImproperlyConfigured("AIRLOCK_METRICS_TOKEN is shorter than 24 characters; generate one with: "
                               "python3 -c 'import secrets; print(secrets.token_urlsafe(32))'")

# Persistence (sessions/persistence/, docs/architecture.md "Persistence"). The master key wraps
# each tenant's data key: AIRLOCK_MASTER_KEY (64 hex digits or base64 of 32 bytes) or a file of
# it (AIRLOCK_MASTER_KEY_FILE); unset, it is derived from SECRET_KEY (the embedded default).
# AIRLOCK_MASTER_KEYS_PREVIOUS (or _FILE) lists keys that still unwrap, for `manage.py rotate_keys`.
_MASTER = env_keys("AIRLOCK_MASTER_KEY", "AIRLOCK_MASTER_KEY_FILE")
if len(_MASTER) > 1:
    raise ImproperlyConfigured("AIRLOCK_MASTER_KEY holds more than one key; list old ones in "
                               "AIRLOCK_MASTER_KEYS_PREVIOUS")
AIRLOCK_MASTER_KEY = _MASTER[0] if _MASTER else None
AIRLOCK_MASTER_KEYS_PREVIOUS = env_keys("AIRLOCK_MASTER_KEYS_PREVIOUS", "AIRLOCK_MASTER_KEYS_PREVIOUS_FILE")
# Where snapshots and artifacts are stored, through Django's storage API: the data directory by
# default; any backend (django-storages' S3, say) by configuration alone.
AIRLOCK_STORAGE_BACKEND = env_str("AIRLOCK_STORAGE_BACKEND", "django.core.files.storage.FileSystemStorage")
AIRLOCK_STORAGE_OPTIONS = env_json("AIRLOCK_STORAGE_OPTIONS", {"location": str(DATA_DIR / "persistence")}
                                   if AIRLOCK_STORAGE_BACKEND.endswith("FileSystemStorage") else {})
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    "persistence": {"BACKEND": AIRLOCK_STORAGE_BACKEND, "OPTIONS": AIRLOCK_STORAGE_OPTIONS},
}
# What a gigabyte-month of stored snapshots and artifacts costs (about object storage's, in
# AIRLOCK_COST_CURRENCY), for the Metrics page and /metrics.
AIRLOCK_COST_PER_GB_MONTH = env_float("AIRLOCK_COST_PER_GB_MONTH", 0.023)
# How often a runner's housekeeping prunes snapshots and artifacts past their retention.
AIRLOCK_PRUNE_INTERVAL_S = env_int("AIRLOCK_PRUNE_INTERVAL_S", 3600, minimum=10)

# How often an API key's last-used time is written: once per key per this many seconds.
AIRLOCK_KEY_TOUCH_INTERVAL_S = env_int("AIRLOCK_KEY_TOUCH_INTERVAL_S", 60)

# One level for everything, Django's own loggers included (Django keeps `django` at INFO otherwise).
LOG_LEVEL = env_choice("AIRLOCK_LOG_LEVEL", "INFO", ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"))
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "filters": {"redact": {"()": "controlplane.redaction.RedactingFilter"},
                "security": {"()": "controlplane.redaction.OneLineSecurityEvents"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain",
                             "filters": ["security", "redact"]}},
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    # Reconfigured, `django` loses its own handlers too: its records reach the console once, via the root.
    "loggers": {"django": {"level": LOG_LEVEL}},
}

# Last, once the configuration holds: the data directory exists (sandboxes, uid 65534, traverse it).
if not DATA_DIR.is_dir():
    try:
        DATA_DIR.mkdir(parents=True, exist_ok=True)
        DATA_DIR.chmod(0o711)
    except OSError as exc:
        raise ImproperlyConfigured(f"AIRLOCK_DATA_DIR={DATA_DIR} cannot be created: {exc.strerror}") from None
