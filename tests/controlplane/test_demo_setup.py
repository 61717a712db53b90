import re
from io import StringIO

from django.core.management import call_command
from django.test import Client

from controlplane.models import ApiKey


def run_demo_setup(*args) -> str:
    out = StringIO()
    call_command("demo_setup", *args, stdout=out)
    return out.getvalue()


def test_demo_setup_prints_working_credentials_once_and_keeps_them_on_rerun(db, api):
    first = run_demo_setup()
    password = re.search(r"password: (\S+)", first).group(1)
    key = re.search(r"API key\s+(alk_\S+)", first).group(1)
    assert Client().login(username="admin", password=password)
    assert api(key).get("/api/v1/whoami").json()["tenant"]["slug"] == "demo"
    metrics = api(key).get("/metrics")  # the printed curl works: the demo key reads its tenant's metrics
    assert metrics.status_code == 200 and 'airlock_sessions_started{tenant="demo"} 0.0' in metrics.content.decode()

    second = run_demo_setup()
    assert "password:" not in second and "alk_" not in second
    assert "--reset-credentials" in second
    assert Client().login(username="admin", password=password)
    assert api(key).get("/api/v1/whoami").status_code == 200


def test_resetting_demo_credentials_revokes_the_old_key(db, api):
    first = run_demo_setup()
    old_key = re.search(r"API key\s+(alk_\S+)", first).group(1)
    second = run_demo_setup("--reset-credentials")
    new_key = re.search(r"API key\s+(alk_\S+)", second).group(1)
    assert api(old_key).get("/api/v1/whoami").json()["error"] == "revoked_key"
    assert api(new_key).get("/api/v1/whoami").status_code == 200
    assert ApiKey.objects.filter(revoked_at__isnull=True).count() == 1


def test_the_demo_tenant_has_a_published_default_policy_whose_tests_pass(db):
    from controlplane.models import Tenant

    run_demo_setup()
    policy = Tenant.objects.get(slug="demo").policies.get(name="default")
    assert policy.published_version().number == 1
    run_demo_setup("--reset-credentials")
    assert policy.versions.count() == 1
