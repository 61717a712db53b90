from io import StringIO
from pathlib import Path

import pytest
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection, transaction

from controlplane.models import AuditEvent
from policies_app import selectors, services
from policies_app.document import DocumentError
from policies_app.models import PolicyVersion

V1 = """commands:
  - {id: pytest, bin: pytest, deny_args: ["^-c"]}
tests:
  - request: {bin: pytest, args: ["-c", "x"]}
    expect: {allowed: false, reason_code: arg_denied}
"""
V2 = V1.replace("commands:\n", "commands:\n  - {id: make, bin: make, allow_args: [test]}\n")


@pytest.fixture
def policy(acme, alice):
    return services.policy_create(tenant=acme, name="default", actor=alice)


def test_versions_are_numbered_and_publishing_needs_a_note_and_passing_tests(policy, alice):
    v1 = services.version_create(policy=policy, source=V1, actor=alice)
    with pytest.raises(ValidationError, match="note"):
        services.version_publish(version=v1, actor=alice, note=" ")
    services.version_publish(version=v1, actor=alice, note="first")
    v2 = services.version_create(policy=policy, source=V2, actor=alice)
    assert (v1.number, v2.number) == (1, 2)
    assert v2.parent == v1
    assert v2.state(policy.published_version()) == "draft"
    services.version_publish(version=v2, actor=alice, note="allow make test")
    assert policy.published_version() == v2
    assert v1.state(v2) == "retired"


def test_a_version_whose_own_tests_fail_cannot_be_published(policy, alice):
    failing = V1.replace("allowed: false, reason_code: arg_denied", "allowed: true")
    version = services.version_create(policy=policy, source=failing, actor=alice)
    with pytest.raises(ValidationError, match="test 1: expected allowed: true, got allowed: false"):
        services.version_publish(version=version, actor=alice, note="try")
    assert policy.published_version() is None


def test_a_version_allowing_an_address_egress_never_reaches_is_saved_but_not_published(policy, alice):
    version = services.version_create(policy=policy, source=V1 + "network: {egress: allowlist, allow: "
                                      "['169.254.169.254:80', 'pypi.org:443']}\n", actor=alice)
    with pytest.raises(ValidationError, match="cloud metadata address"):
        services.version_publish(version=version, actor=alice, note="try")
    assert policy.published_version() is None


def test_an_invalid_document_is_not_saved(policy, alice):
    with pytest.raises(DocumentError):
        services.version_create(policy=policy, source="commands: [{id: x, bin: /bin/sh}]", actor=alice)
    assert not PolicyVersion.objects.exists()


def test_rollback_publishes_the_old_document_as_a_new_version(policy, alice):
    v1 = services.version_create(policy=policy, source=V1, actor=alice)
    services.version_publish(version=v1, actor=alice, note="first")
    v2 = services.version_create(policy=policy, source=V2, actor=alice)
    services.version_publish(version=v2, actor=alice, note="second")
    v3 = services.version_rollback(policy=policy, to=v1, actor=alice, note="make broke CI")
    assert v3.number == 3 and v3.sha256 == v1.sha256 and v3.source == V1
    assert policy.published_version() == v3
    actions = list(AuditEvent.objects.filter(tenant=policy.tenant, action__startswith="policy.")
                   .order_by("seq").values_list("action", flat=True))
    assert actions == ["policy.created", "policy.version_created", "policy.published", "policy.version_created",
                       "policy.published", "policy.version_created", "policy.rollback"]


def test_a_saved_version_cannot_be_changed_through_the_orm(policy, alice):
    version = services.version_create(policy=policy, source=V1, actor=alice)
    version.note = "edited"
    with pytest.raises(PermissionError):
        version.save()
    with pytest.raises(PermissionError):
        PolicyVersion.objects.filter(pk=version.pk).update(note="edited")
    with pytest.raises(PermissionError):
        version.delete()


def test_an_update_of_a_saved_version_is_refused_by_the_database(policy, alice):
    version = services.version_create(policy=policy, source=V1, actor=alice)
    with pytest.raises(DatabaseError, match="immutable"), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"UPDATE {PolicyVersion._meta.db_table} SET source = %s WHERE id = %s",  # noqa: S608
                       ["commands: []", version.pk])
    assert PolicyVersion.objects.get(pk=version.pk).source == V1


def test_a_saved_version_cannot_be_replaced_on_sqlite_either(policy, alice):
    """SQLite's REPLACE deletes the row it meets without firing the UPDATE trigger."""
    if connection.vendor != "sqlite":
        pytest.skip("PostgreSQL's upsert is an UPDATE, refused above")
    version = services.version_create(policy=policy, source=V1, actor=alice)
    table = PolicyVersion._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE TEMP TABLE forged AS SELECT * FROM {table} WHERE id = %s", [version.pk])  # noqa: S608
        cursor.execute("UPDATE forged SET source = 'commands: []'")
    with pytest.raises(DatabaseError, match="immutable"), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"INSERT OR REPLACE INTO {table} SELECT * FROM forged")  # noqa: S608
    assert PolicyVersion.objects.get(pk=version.pk).source == V1


def test_retiring_a_policy_leaves_nothing_published(policy, alice):
    v1 = services.version_create(policy=policy, source=V1, actor=alice)
    services.version_publish(version=v1, actor=alice, note="first")
    services.policy_retire(policy=policy, actor=alice, note="replaced")
    assert policy.published_version() is None
    assert v1.state(None) == "retired"


def test_another_tenants_policies_are_not_found(policy, alice, charlie, globex):
    from django.http import Http404

    services.version_create(policy=policy, source=V1, actor=alice)
    assert list(selectors.policy_list(globex)) == []
    with pytest.raises(Http404):
        selectors.policy_get(globex, "default")
    with pytest.raises(Http404):
        selectors.version_get(globex, "default", 1)


def test_policy_test_runs_a_files_tests_and_fails_on_a_broken_one(tmp_path: Path):
    good = tmp_path / "good.yaml"
    good.write_text(V1)
    out = StringIO()
    call_command("policy_test", str(good), stdout=out)
    assert "PASS  test 0 pytest -c x" in out.getvalue() and "1 passed, 0 failed" in out.getvalue()

    bad = tmp_path / "bad.yaml"
    bad.write_text(V1.replace("allowed: false", "allowed: true"))
    with pytest.raises(CommandError, match="1 policy test"):
        call_command("policy_test", str(bad), stdout=StringIO())

    invalid = tmp_path / "invalid.yaml"
    invalid.write_text("commands:\n  - {id: x, bin: /bin/sh}\n")
    err = StringIO()
    with pytest.raises(CommandError, match="not a valid policy"):
        call_command("policy_test", str(invalid), stdout=StringIO(), stderr=err)
    assert f"{invalid}:2: commands.0.bin" in err.getvalue()
