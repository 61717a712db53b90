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
from policies_app.models import FloorVersion, Policy, PolicyException, PolicyPublication, PolicyVersion
from tests.append_only import append_only_enforced, refused

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


def forge(version: PolicyVersion, source: str, *, document: dict | None = None, sha256: str | None = None) -> None:
    """What whoever dropped the triggers can do: delete a version and insert another, with the
    same id and number, another document and (unless `sha256` is given) that document's own
    sha256. (Foreign keys are checked when the transaction ends, with the row back.)"""
    parsed = parse_yaml(source)
    table = PolicyVersion._meta.db_table
    with transaction.atomic():
        run(f"DELETE FROM {table} WHERE id = %s", [version.pk])  # noqa: S608
        run(f"INSERT INTO {table} (id, policy_id, number, document, source, sha256, author_id, created_at, "  # noqa: S608
            "parent_id, note) VALUES (%s, %s, %s, %s, %s, %s, NULL, %s, %s, '')",
            [version.pk, version.policy_id, version.number, json.dumps(document or parsed.canonical()), source,
             sha256 or parsed.sha256(), version.created_at, version.parent_id])


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
        "policy default v1: its document does not match its own sha256 (it was changed in the database)",
        f"policy default v1: its source is not the one audit event #{created_event(v1)} recorded (it was changed "
        "in the database)"]


def test_a_source_changed_alone_is_found(history, acme):
    """The source is read as well as the document (the driver a session runs on, a rollback's
    new version), so it is recorded too."""
    v1 = history.versions.get(number=1)
    forge(v1, V1 + "runtime: {driver: bubblewrap}\n", document=v1.document, sha256=v1.sha256)
    assert integrity.tenant_problems(acme) == [
        f"policy default v1: its source is not the one audit event #{created_event(v1)} recorded (it was changed "
        "in the database)"]


def created_event(version) -> int:
    return AuditEvent.objects.get(action="policy.version_created", target_id=str(version.pk)).seq


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
    assert problem.startswith("platform floor v1: recorded at acme's audit event #") and problem.endswith("(deleted)")


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


def test_sqlite_refuses_to_replace_a_publication(history):
    """SQLite's REPLACE deletes the row it meets without firing the DELETE trigger."""
    if connection.vendor != "sqlite":
        pytest.skip("PostgreSQL's upsert is an UPDATE, refused")
    last = PolicyPublication.objects.order_by("-id").first()
    v2 = history.versions.get(number=2)
    table = PolicyPublication._meta.db_table
    with append_only_enforced():
        for verb in ("INSERT OR REPLACE", "REPLACE"):
            assert refused(f"{verb} INTO {table} (id, policy_id, version_id, action, actor_id, note, created_at) "  # noqa: S608
                           f"SELECT id, policy_id, %s, action, actor_id, note, created_at FROM {table} WHERE id = %s",
                           [v2.pk, last.pk])
    assert PolicyPublication.objects.get(pk=last.pk).version_id == last.version_id


@pytest.mark.django_db(transaction=True)
def test_postgresql_refuses_even_a_replication_role_session(acme, alice):
    """`session_replication_role = replica` skips ordinary triggers; these fire ALWAYS."""
    if connection.vendor != "postgresql":
        pytest.skip("a PostgreSQL setting")
    policy = services.policy_create(tenant=acme, name="default", actor=alice)
    services.version_publish(version=services.version_create(policy=policy, source=V1, actor=alice),
                             actor=alice, note="first")
    with append_only_enforced():
        for table in (PolicyPublication._meta.db_table, PolicyVersion._meta.db_table, AuditEvent._meta.db_table):
            try:
                with transaction.atomic(), connection.cursor() as cursor:
                    cursor.execute("SET LOCAL session_replication_role = replica")
                    cursor.execute(f"DELETE FROM {table}")  # noqa: S608
            except DatabaseError as exc:
                assert "append-only" in str(exc), exc
            else:
                pytest.fail(f"{table}: a replica session deleted its rows")
    assert PolicyPublication.objects.exists() and AuditEvent.objects.filter(tenant=acme).count() == 5


def test_a_publication_moved_to_another_policy_is_found(history, acme, alice):
    """Another policy's wide version, published in this one's name: the row's policy is compared
    with the version's and with the chain's."""
    ops = services.policy_create(tenant=acme, name="ops", actor=alice)
    wide = services.version_create(policy=ops, source="commands:\n  - {id: pytest, bin: pytest}\n", actor=alice)
    services.version_publish(version=wide, actor=alice, note="ops")
    moved = PolicyPublication.objects.get(policy=ops)
    table = PolicyPublication._meta.db_table
    with transaction.atomic():
        run(f"DELETE FROM {table} WHERE id = %s", [moved.pk])  # noqa: S608
        run(f"INSERT INTO {table} (id, policy_id, version_id, action, note, created_at) "  # noqa: S608
            "VALUES (%s, %s, %s, 'publish', 'ops', %s)", [moved.pk, history.pk, wide.pk, moved.created_at])
    assert history.published_version() == wide
    [problem] = integrity.tenant_problems(acme)
    assert "next publication is a publish of policy default v1, a version of policy ops" in problem, problem


@pytest.mark.django_db(transaction=True)
def test_publications_written_at_once_keep_the_chains_order(acme, alice, monkeypatch):
    """A publication's row takes its id before the audit event its seq: two publishes at once got
    them in opposite orders, and `audit_verify` reported an honest history for ever. The
    tenant's audit lock is now taken first (PostgreSQL; SQLite's writers take turns anyway)."""
    import threading

    from django.db import connections

    first = services.policy_create(tenant=acme, name="first", actor=alice)
    second = services.policy_create(tenant=acme, name="second", actor=alice)
    versions = [services.version_create(policy=policy, source=V1, actor=alice) for policy in (first, second)]
    inserted, published = threading.Event(), threading.Event()
    record = services.audit_record

    def held_record(**kwargs):  # the first publish stops between its row and its audit event
        if kwargs.get("target") == versions[0] and kwargs["action"] == "policy.published":
            inserted.set()
            published.wait(1)  # the second publish, if it is not held up meanwhile
        return record(**kwargs)

    monkeypatch.setattr(services, "audit_record", held_record)

    def publish(version, after: threading.Event | None = None):
        if after is not None:
            after.wait(10)
        try:
            services.version_publish(version=version, actor=alice, note="at once")
        finally:
            if after is not None:
                published.set()
            connections.close_all()

    threads = [threading.Thread(target=publish, args=(versions[0],)),
               threading.Thread(target=publish, args=(versions[1], inserted))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert PolicyPublication.objects.count() == 2
    assert integrity.tenant_problems(acme) == []


@pytest.fixture
def granted(history, alice):
    from datetime import timedelta

    from django.utils import timezone

    from policies_app import exceptions

    later = timezone.now() + timedelta(days=1)
    kept = exceptions.exception_grant(policy=history, bin_name="pytest", args=["-c", "x"], expires_at=later,
                                      reason="debugging CI", actor=alice)
    gone = exceptions.exception_grant_egress(policy=history, host="pypi.org", port=443, expires_at=later,
                                             reason="a wheel", actor=alice)
    exceptions.exception_revoke(grant=gone, actor=alice)
    return kept, gone


def test_exceptions_granted_and_revoked_are_checked_against_the_chain(granted, acme):
    kept, gone = granted
    table = PolicyException._meta.db_table
    assert integrity.tenant_problems(acme) == []
    run(f"UPDATE {table} SET args = %s WHERE id = %s", [json.dumps(["-c x"]), kept.pk.hex])  # noqa: S608
    run(f"UPDATE {table} SET revoked_at = NULL WHERE id = %s", [gone.pk.hex])  # noqa: S608
    problems = integrity.tenant_problems(acme)
    assert [problem.split(": ", 1)[1].split(" (")[0] for problem in problems] == [
        f"not what audit event #{event_of(kept)} granted", f"revoked at audit event #{event_of(gone, 'revoked')}, "
        "and in force again"]
    forged = PolicyException.objects.create(tenant=acme, policy=kept.policy, bin="sh", args=["-c", "curl x|sh"],
                                            reason="x", expires_at=kept.expires_at, created_by="user:alice")
    assert (f"exception {forged.pk} ('sh -c curl x|sh'): the audit chain has no record of it being granted (it was "
            "inserted in the database)") in integrity.tenant_problems(acme)


def event_of(grant, what: str = "granted") -> int:
    return AuditEvent.objects.get(action=f"policy.exception_{what}", target_id=str(grant.pk)).seq


def test_a_floor_version_inserted_is_found_and_a_new_tenant_records_the_floor_in_force(acme, db):
    from controlplane.services import tenant_create

    services.floor_set(source=FLOOR, actor=None, note="wide open", accept_breaking=True)
    later = tenant_create(slug="later", name="Later")
    recorded = AuditEvent.objects.filter(tenant=later).order_by("seq").values_list("action", flat=True)
    assert list(recorded) == ["tenant.created", "platform.floor_in_force"]
    assert integrity.floor_problems() == []
    document = parse_yaml("limits: {cpus: 16}\ncommands:\n  - {id: sh, bin: sh}\n")
    FloorVersion.objects.create(number=2, document=document.canonical(), source="", sha256=document.sha256(), note="")
    [problem] = integrity.floor_problems()
    assert problem.startswith("platform floor v2: no tenant's audit chain records it (it was inserted in the database")
    tenant_create(slug="newer", name="Newer")  # a new tenant does not vouch for it
    assert not AuditEvent.objects.filter(tenant__slug="newer", action="platform.floor_in_force").exists()
    assert integrity.floor_problems() == [problem]


def test_floor_versions_set_before_any_tenant_are_not_reported(db):
    from controlplane.services import tenant_create

    for note in ("first", "second"):
        services.floor_set(source=FLOOR, actor=None, note=note, accept_breaking=True)
    assert integrity.floor_problems() == []
    tenant_create(slug="first", name="First")  # records v2, the floor in force; v1 was never in force with a tenant
    assert integrity.floor_problems() == []


def test_a_row_no_honest_write_makes_is_reported_not_a_crash(history, acme):
    """A lone surrogate in a stored document (SQLite keeps JSON as text); an event's data that is
    not an object."""
    if connection.vendor != "sqlite":
        pytest.skip("PostgreSQL's jsonb refuses a lone surrogate")
    v1 = history.versions.get(number=1)
    with transaction.atomic():
        run(f"DELETE FROM {PolicyVersion._meta.db_table} WHERE id = %s", [v1.pk])  # noqa: S608
        run(f"INSERT INTO {PolicyVersion._meta.db_table} (id, policy_id, number, document, source, sha256, "  # noqa: S608
            "created_at, note) VALUES (%s, %s, 1, %s, %s, %s, %s, '')",
            [v1.pk, history.pk, '{"mode": "\\ud800"}', v1.source, v1.sha256, v1.created_at])
    run(f"INSERT INTO {AuditEvent._meta.db_table} (tenant_id, seq, created_at, actor, action, target_type, "  # noqa: S608
        "target_id, data, prev_hash, hash) VALUES (%s, 999, %s, 'x', 'policy.published', '', '', '[1]', '', '')",
        [acme.pk, v1.created_at])
    problems = integrity.tenant_problems(acme)
    assert problems[0] == ("policy default v1: its document does not match its own sha256 (it was changed in the "
                           "database)")
    assert problems[-1].startswith("publications: audit event #999 records policy.published of policy None")


def test_a_policys_tenant_and_name_never_change_and_it_is_never_deleted(history, globex, alice):
    table = Policy._meta.db_table
    with append_only_enforced():
        for sql, params in [(f"UPDATE {table} SET tenant_id = %s WHERE id = %s", [globex.pk, history.pk]),  # noqa: S608
                            (f"UPDATE {table} SET name = 'renamed' WHERE id = %s", [history.pk]),  # noqa: S608
                            (f"DELETE FROM {table} WHERE id = %s", [history.pk])]:  # noqa: S608
            assert refused(sql, params, says="never"), sql
        services.policy_set_shadow(policy=history, version=history.versions.get(number=2), actor=alice)  # still can
    history.refresh_from_db()
    assert (history.tenant_id, history.name, history.shadow_version.number) == (history.tenant_id, "default", 2)


def test_a_legacy_versions_source_that_names_another_runtime_is_found(acme, alice):
    """Versions saved before their source's digest was recorded: the runtime the source names
    (which picks the sessions' driver) must still be the document's."""
    from controlplane.audit import audit_record

    policy = services.policy_create(tenant=acme, name="legacy", actor=alice)
    source = V1 + "runtime: {isolation: gvisor}\n"
    document = parse_yaml(source)
    version = PolicyVersion.objects.create(policy=policy, number=1, document=document.canonical(), source=source,
                                           sha256=document.sha256())
    audit_record(tenant=acme, actor=alice, action="policy.version_created", target=version,
                 data={"policy": "legacy", "number": 1, "sha256": version.sha256})  # as events were written then
    assert integrity.tenant_problems(acme) == []
    forge(version, V1 + "runtime: {driver: bubblewrap}\n", document=version.document, sha256=version.sha256)
    assert integrity.tenant_problems(acme) == [
        "policy legacy v1: the runtime its source names is not its document's (the source was changed in the "
        "database)"]


@pytest.mark.django_db(transaction=True)
def test_a_second_floor_under_a_recorded_number_is_found(acme):
    """(PostgreSQL: its number's uniqueness dropped first.) The floor in force is read as
    floor.current() reads it."""
    if connection.vendor != "postgresql":
        pytest.skip("drops a constraint by name")
    from policies_app import floor

    services.floor_set(source=FLOOR, actor=None, note="first", accept_breaking=True)
    table = FloorVersion._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute("SELECT conname FROM pg_constraint WHERE conrelid = %s::regclass AND contype = 'u'", [table])
        for (name,) in cursor.fetchall():
            cursor.execute(f'ALTER TABLE {table} DROP CONSTRAINT "{name}"')
    document = parse_yaml("limits: {cpus: 16}\ncommands:\n  - {id: sh, bin: sh}\n")
    forged = FloorVersion.objects.create(number=1, document=document.canonical(), source="", sha256=document.sha256(),
                                         note="")
    assert floor.current() == forged
    problems = integrity.floor_problems()
    assert "platform floor v1: 2 floor versions have this number (one was inserted in the database)" in problems
    assert any(problem.startswith("platform floor v1: no tenant's audit chain records it") for problem in problems)


def test_a_sessions_pinned_version_tenant_and_driver_never_change(history, globex, alice):
    """Plain DML gave a live session another tenant's (or a wider) version to decide its commands."""
    from datetime import timedelta

    from django.utils import timezone

    from sessions.models import Session, SessionState

    v1, v2 = history.versions.get(number=1), history.versions.get(number=2)
    session = Session.objects.create(tenant=history.tenant, policy_version=v1, driver="bubblewrap",
                                     state=SessionState.READY, token_hash="x" * 64, created_by="user:alice",
                                     expires_at=timezone.now() + timedelta(hours=1))
    table = Session._meta.db_table
    for column, value in (("policy_version_id", v2.pk), ("tenant_id", globex.pk), ("driver", "docker")):
        assert refused(f"UPDATE {table} SET {column} = %s WHERE id = %s", [value, session.pk.hex],  # noqa: S608
                       says="never change"), column
    session.state = SessionState.ENDED
    session.save()  # what does change still does (every column written, those three unchanged)
    session.refresh_from_db()
    assert (session.policy_version_id, session.state) == (v1.pk, SessionState.ENDED)
