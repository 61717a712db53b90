"""A policy's history cannot be deleted or rewritten unseen: the database refuses (migration
policies_app/0015), and `audit_verify` compares what is left with the keyed audit chain, for
whoever dropped the refusals first (policies_app/integrity.py)."""

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection, transaction

from controlplane.models import AuditEvent
from policies_app import integrity, services
from policies_app.document import parse_yaml
from policies_app.models import FloorVersion, PolicyPublication, PolicyVersion
from tests.append_only import append_only_enforced

V1 = """commands:
  - {id: pytest, bin: pytest, deny_args: ["^-c"]}
limits: {cpus: 2, memory_mb: 512}
"""
V2 = V1.replace("commands:\n", "commands:\n  - {id: make, bin: make, allow_args: [test]}\n")
FLOOR = "limits: {cpus: 4.5}\ncommands:\n  - {id: pytest, bin: pytest}\n"


@pytest.fixture
def history(acme, alice):
    """v1 published, v2 published, v3 a rollback to v1, then retired; a floor set."""
    policy = services.policy_create(tenant=acme, name="default", actor=alice)
    v1 = services.version_create(policy=policy, source=V1, actor=alice)
    services.version_publish(version=v1, actor=alice, note="first")
    v2 = services.version_create(policy=policy, source=V2, actor=alice)
    services.version_publish(version=v2, actor=alice, note="second")
    services.version_rollback(policy=policy, to=v1, actor=alice, note="make broke CI")
    services.policy_retire(policy=policy, actor=alice, note="moving on")
    services.floor_set(source=FLOOR, actor=None, note="wide open", accept_breaking=True)
    return policy


def run(sql: str, params: list) -> None:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def refused(sql: str, params: list) -> bool:
    try:
        with transaction.atomic():  # (a refused statement aborts PostgreSQL's transaction: a savepoint keeps ours)
            run(sql, params)
    except DatabaseError as exc:
        return "append-only" in str(exc)
    return False


@pytest.mark.parametrize(("model", "statement"), [
    (PolicyVersion, "DELETE FROM {table} WHERE id = %s"),
    (FloorVersion, "DELETE FROM {table} WHERE id = %s"),
    (PolicyPublication, "DELETE FROM {table} WHERE id = %s"),
    (PolicyPublication, "UPDATE {table} SET version_id = version_id WHERE id = %s"),
])
def test_the_database_refuses_to_delete_a_policys_history(model, statement, history):
    row = model.objects.order_by("-id").first()
    with append_only_enforced():
        assert refused(statement.format(table=model._meta.db_table), [row.pk])
    assert model.objects.filter(pk=row.pk).exists()


@pytest.mark.django_db(transaction=True)  # (PostgreSQL refuses a TRUNCATE after this transaction's inserts)
@pytest.mark.parametrize("model", [PolicyVersion, FloorVersion, PolicyPublication])
def test_postgresql_refuses_to_truncate_a_policys_history(model, acme, alice):
    if connection.vendor != "postgresql":
        pytest.skip("SQLite has no TRUNCATE")
    policy = services.policy_create(tenant=acme, name="default", actor=alice)
    services.version_publish(version=services.version_create(policy=policy, source=V1, actor=alice),
                             actor=alice, note="first")
    services.floor_set(source=FLOOR, actor=None, note="wide open", accept_breaking=True)
    with append_only_enforced():
        assert refused(f"TRUNCATE {model._meta.db_table} CASCADE", [])
    assert model.objects.exists()


def test_an_intact_history_has_no_problem(history, acme):
    assert integrity.tenant_problems(acme) == []
    assert integrity.floor_problems() == []


def forge(version: PolicyVersion, source: str, *, sha256: str | None = None) -> None:
    """What whoever dropped the triggers can do: delete a version and insert another, with the
    same id and number, another document and (unless `sha256` is given) that document's own
    sha256. (Foreign keys are checked when the transaction ends, with the row back.)"""
    document = parse_yaml(source)
    table = PolicyVersion._meta.db_table
    with transaction.atomic():
        run(f"DELETE FROM {table} WHERE id = %s", [version.pk])  # noqa: S608
        run(f"INSERT INTO {table} (id, policy_id, number, document, source, sha256, author_id, created_at, "  # noqa: S608
            "parent_id, note) VALUES (%s, %s, %s, %s, %s, %s, NULL, %s, %s, '')",
            [version.pk, version.policy_id, version.number, json.dumps(document.canonical()), source,
             sha256 or document.sha256(), version.created_at, version.parent_id])


def test_a_version_deleted_and_inserted_again_with_other_content_is_found(history, acme):
    v2 = history.versions.get(number=2)
    forge(v2, V2.replace("allow_args: [test]", "allow_args: [test, install]"))
    problems = integrity.tenant_problems(acme)
    assert len(problems) == 1
    assert problems[0].startswith("policy default v2: not the version that audit event #")
    assert "deleted and inserted again with other content" in problems[0]


def test_a_document_changed_in_place_is_found_by_its_own_digest(history, acme):
    v1 = history.versions.get(number=1)
    forge(v1, V2, sha256=v1.sha256)
    assert integrity.tenant_problems(acme) == [
        "policy default v1: its document does not match its own sha256 (it was changed in the database)"]


def test_a_deleted_version_and_an_inserted_one_are_found(history, acme, alice):
    table = PolicyVersion._meta.db_table
    draft = services.version_create(policy=history, source=V2, actor=alice)
    run(f"DELETE FROM {table} WHERE id = %s", [draft.pk])  # noqa: S608
    [problem] = integrity.tenant_problems(acme)
    assert problem.startswith("policy default v4: saved at audit event #") and problem.endswith("(deleted)")
    document = parse_yaml(V2)
    run(f"INSERT INTO {table} (policy_id, number, document, source, sha256, created_at, note) "  # noqa: S608
        "VALUES (%s, 4, %s, %s, %s, %s, '')",
        [history.pk, json.dumps(document.canonical()), V2, document.sha256(), draft.created_at])
    assert integrity.tenant_problems(acme) == [
        "policy default v4: the audit chain has no record of it being saved (it was inserted in the database)",
        f"policy default v4: saved at audit event #{draft_event(acme)}, and gone from the database (deleted)"]


def draft_event(tenant) -> int:
    return AuditEvent.objects.filter(tenant=tenant, action="policy.version_created").order_by("-seq").first().seq


def test_a_deleted_publication_that_puts_an_older_version_back_in_force_is_found(history, acme):
    retire = PolicyPublication.objects.filter(policy=history, action=PolicyPublication.RETIRE).get()
    rollback = PolicyPublication.objects.filter(policy=history, action=PolicyPublication.ROLLBACK).get()
    for row in (retire, rollback):
        run(f"DELETE FROM {PolicyPublication._meta.db_table} WHERE id = %s", [row.pk])  # noqa: S608
    assert history.published_version().number == 2  # what the attacker wanted: v2 in force again
    [problem] = integrity.tenant_problems(acme)
    assert problem.startswith("publications: audit event #")
    assert "records policy.rollback of policy default v3" in problem
    assert "the database has no more publications" in problem


def test_an_inserted_publication_is_found(history, acme):
    v2 = history.versions.get(number=2)
    run(f"INSERT INTO {PolicyPublication._meta.db_table} (policy_id, version_id, action, note, created_at) "  # noqa: S608
        "VALUES (%s, %s, 'publish', 'x', %s)", [history.pk, v2.pk, v2.created_at])
    assert history.published_version().number == 2
    [problem] = integrity.tenant_problems(acme)
    assert "the audit chain records nothing more, but the database's next publication is a publish of policy " \
           "default v2" in problem


def test_a_floor_version_deleted_and_inserted_again_is_found(history):
    floor = FloorVersion.objects.get()
    document = parse_yaml("commands: []\n")
    table = FloorVersion._meta.db_table
    run(f"DELETE FROM {table} WHERE id = %s", [floor.pk])  # noqa: S608
    run(f"INSERT INTO {table} (id, number, document, source, sha256, created_at, note) "  # noqa: S608
        "VALUES (%s, %s, %s, 'commands: []', %s, %s, '')",
        [floor.pk, floor.number, json.dumps(document.canonical()), document.sha256(), floor.created_at])
    [problem] = integrity.floor_problems()
    assert problem.startswith("platform floor v1: not the floor that acme's audit event #")
    run(f"DELETE FROM {table} WHERE id = %s", [floor.pk])  # noqa: S608
    [problem] = integrity.floor_problems()
    assert problem.startswith("platform floor v1: set at acme's audit event #") and problem.endswith("(deleted)")


@pytest.mark.django_db(transaction=True)  # (checkpoints are written once their events commit)
def test_audit_verify_reports_a_rewritten_history_and_passes_an_intact_one(acme, alice):
    policy = services.policy_create(tenant=acme, name="default", actor=alice)
    services.version_publish(version=services.version_create(policy=policy, source=V1, actor=alice),
                             actor=alice, note="first")
    services.floor_set(source=FLOOR, actor=None, note="wide open", accept_breaking=True)
    out = StringIO()
    call_command("audit_verify", stdout=out)
    assert "ok      acme:" in out.getvalue() and "BROKEN" not in out.getvalue()
    forge(policy.versions.get(), V2)
    out = StringIO()
    with pytest.raises(CommandError) as failure:
        call_command("audit_verify", stdout=out)
    assert failure.value.returncode == 3
    assert "BROKEN  acme: policy default v1: not the version that audit event #" in out.getvalue()
