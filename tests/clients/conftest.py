"""The SDK, the CLI and the MCP server against the real server of tests/live.py (`demo_server`:
the demo tenant, its policy and real bubblewrap sandboxes)."""

import re
import sys
from pathlib import Path

import pytest

WRITER_KEY = (
    "from controlplane.models import ApiKeyScope, Tenant; from controlplane import services; "
    "k = services.api_key_create(tenant=Tenant.objects.get(slug='demo'), name='writer', actor=None, "
    "scopes=[ApiKeyScope.SESSIONS, ApiKeyScope.POLICIES_READ, ApiKeyScope.POLICIES_WRITE]); print(k.key)"
)
AIRLOCK = str(Path(sys.executable).with_name("airlock"))  # the CLI as `make run` installs it


@pytest.fixture(scope="session")
def writer_key(demo_server) -> str:
    made = demo_server.manage("shell", "-c", WRITER_KEY)
    assert made.returncode == 0, made.stderr
    return re.search(r"alk_\S+", made.stdout).group(0)


@pytest.fixture
def client(demo_server):
    from airlock import Airlock

    with Airlock(demo_server.url, demo_server.api_key) as client:
        yield client
