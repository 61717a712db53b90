"""Shared fixtures. The cast (after healthchecks' hc/test.py): alice is acme's tenant_admin,
bob her teammate (a viewer), charlie an outsider who runs the tenant globex."""

from pathlib import Path

import pytest
from django.conf import settings
from django.test import Client

from controlplane import services
from controlplane.models import ApiKeyScope
from controlplane.roles import Role
from tests.append_only import append_only_statements

pytest_plugins = ["tests.live"]  # demo_server: a real server, for the browser, SDK, CLI and MCP tests


@pytest.fixture(autouse=True)
def _fast_hasher(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def _own_audit_checkpoints(settings, tmp_path):
    """Each test's audit checkpoints apart: tenant ids repeat from one test's database to the next."""
    settings.AIRLOCK_AUDIT_CHECKPOINTS = tmp_path / "audit-checkpoints.jsonl"


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker):
    """The test database lets its audit rows and policy history go: Django's test flush empties
    every table between tests, which a deployment's database refuses (tests/append_only.py). Tests of
    that refusal put the triggers back for their own time (`append_only_enforced`).

    At the end, the threads that keep connections (the API's threads, as in a server,
    and asgiref's one thread for thread-sensitive calls) close them before the test database
    is dropped: PostgreSQL refuses to drop a database in use."""
    from asgiref.sync import SyncToAsync
    from django.db import connection, connections

    from controlplane.api.handler import prompt, waiting
    from controlplane.threads import close_connections_and_shutdown

    with django_db_blocker.unblock(), connection.cursor() as cursor:
        for statement in append_only_statements(connection.vendor, drop=True):
            cursor.execute(statement)
    yield
    for pool in (waiting, prompt):
        close_connections_and_shutdown(pool)
    SyncToAsync.single_thread_executor.submit(connections.close_all).result(timeout=10)


def pytest_sessionfinish(session, exitstatus):
    """Django removes the SQLite test database's file at the end; SQLite's write-ahead log and
    shared-memory files beside it stayed in the temporary directory, two more every run."""
    database = settings.DATABASES["default"]
    if "sqlite" in database["ENGINE"] and (name := database.get("TEST", {}).get("NAME")):
        for suffix in ("-wal", "-shm"):
            Path(f"{name}{suffix}").unlink(missing_ok=True)


@pytest.fixture(scope="session")
def built_rootfs():
    """The sandbox root filesystem, built on first use when missing (as `make run` does), or the
    reason it cannot be built here."""
    from sessions.runtimes import rootfs
    from sessions.runtimes.base import RuntimeUnavailable

    if rootfs.current() is None:
        try:
            rootfs.build(progress=lambda message: None)
        except RuntimeUnavailable as exc:
            return exc
    return rootfs.current()


@pytest.fixture
def acme(db):
    return services.tenant_create(slug="acme", name="Acme Corp")


@pytest.fixture
def globex(db):
    return services.tenant_create(slug="globex", name="Globex")


@pytest.fixture
def make_member(db):
    def make(tenant, username: str, role: Role):
        from django.contrib.auth import get_user_model

        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            user = services.user_create(username=username).user
        services.membership_add(tenant=tenant, user=user, role=role)
        return user

    return make


@pytest.fixture
def alice(acme, make_member):
    return make_member(acme, "alice", Role.TENANT_ADMIN)


@pytest.fixture
def bob(acme, alice, make_member):
    return make_member(acme, "bob", Role.VIEWER)


@pytest.fixture
def charlie(globex, make_member):
    return make_member(globex, "charlie", Role.TENANT_ADMIN)


@pytest.fixture
def client_for():
    def make(user) -> Client:
        client = Client()
        client.force_login(user)
        return client

    return make


@pytest.fixture
def make_key(db):
    def make(tenant, *, scopes=(ApiKeyScope.SESSIONS,), expires_at=None, name="agent"):
        return services.api_key_create(tenant=tenant, name=name, scopes=list(scopes), actor=None,
                                       expires_at=expires_at)

    return make


@pytest.fixture
def api():
    """A client for the JSON API: `api(key).get(path)`."""

    def make(key: str | None = None) -> Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return Client(headers=headers)

    return make
