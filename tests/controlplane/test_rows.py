"""controlplane/rows.py: statements built once from a model's metadata must read and write
exactly what the ORM reads and writes, on SQLite and PostgreSQL alike."""

import threading
import uuid
from datetime import timedelta

import pytest
from django.db import DatabaseError, connection, transaction
from django.db.transaction import TransactionManagementError
from django.utils import timezone

from controlplane import rows
from policies_app import services as policies
from policies_app.decisions import decide
from sessions.models import CommandRun, CommandState, Runner, Session, SessionState, hash_token

POLICY = "commands:\n  - {id: t, bin: 'true', max_args: 0}\n"


@pytest.fixture
def session(acme):
    policy = policies.policy_create(tenant=acme, name="p", actor=None)
    version = policies.version_create(policy=policy, source=POLICY, actor=None)
    return Session.objects.create(tenant=acme, policy_version=version, driver="bubblewrap", state=SessionState.READY,
                                  token_hash=hash_token("ast_rows"), expires_at=timezone.now() + timedelta(hours=1))


def _command(session, **fields) -> CommandRun:
    record = decide(tenant=session.tenant, policy=session.policy_version.policy, version=session.policy_version,
                    request={"bin": "true", "args": []}, session_id=session.pk).record
    return CommandRun.objects.create(session=session, argv=["true", "ä b"], cwd="/workspace", timeout_s=5,
                                     decision=record, **fields)


def _fields(instance) -> dict:
    """Each column's value with its type: 1 == True, but a bool read back as 1 is a bug."""
    return {field.attname: (type(getattr(instance, field.attname)), getattr(instance, field.attname))
            for field in instance._meta.concrete_fields}


def test_get_reads_every_field_and_its_related_rows_as_the_orm_does(session):
    runner = Runner.objects.create(id="host-1-abc", hostname="host", pid=1, drivers=["bubblewrap"])
    Session.objects.filter(pk=session.pk).update(runner=runner, cache_hit=True, prepare_ms=12, cpu_s=0.5,
                                                 ready_at=timezone.now())
    related = ("tenant", "policy_version__policy", "runner")
    orm = Session.objects.select_related(*related).get(pk=session.pk)
    got = rows.get(Session, {"token_hash": hash_token("ast_rows")}, related=related)
    assert _fields(got) == _fields(orm)
    for path in ("tenant", "policy_version", "runner"):
        assert _fields(getattr(got, path)) == _fields(getattr(orm, path)), path
    assert _fields(got.policy_version.policy) == _fields(orm.policy_version.policy)
    assert got.runner.drivers == ["bubblewrap"] and got.cache_hit is True
    assert not got._state.adding  # a saved row: save() updates it
    got.state_reason = "edited"
    got.save(update_fields=["state_reason"])
    assert Session.objects.get(pk=session.pk).state_reason == "edited"


def test_get_gives_none_for_a_null_foreign_key_and_for_no_row(session, django_assert_num_queries):
    with django_assert_num_queries(1):
        got = rows.get(Session, {"pk": session.pk}, related=("runner", "tenant"))
        assert got.runner is None and got.tenant.slug == "acme"  # cached: no second query
    assert rows.get(Session, {"token_hash": "no such hash"}, related=("tenant",)) is None


def test_select_converts_what_it_reads(session):
    command = _command(session)
    [(pk, argv, state, created)] = rows.select(CommandRun, ("pk", "argv", "state", "created_at"),
                                               {"session": session.pk})
    assert (pk, argv, state) == (command.pk, ["true", "ä b"], CommandState.QUEUED)
    assert created == CommandRun.objects.get(pk=command.pk).created_at and created.tzinfo is not None
    assert rows.select(CommandRun, ("pk",), {"session": uuid.uuid4()}) == []


@pytest.mark.django_db(transaction=True)
def test_a_lock_outside_a_transaction_is_refused(session):
    with pytest.raises(TransactionManagementError):
        rows.select(Session, ("pk",), {"pk": session.pk}, for_update=True)


@pytest.mark.django_db(transaction=True)
def test_a_locked_row_stays_locked_until_the_transaction_ends(session):
    if not connection.features.has_select_for_update:
        pytest.skip("SQLite has no row locks: its writers take the database's lock at BEGIN IMMEDIATE")
    locked, release = threading.Event(), threading.Event()

    def holder():
        with transaction.atomic():
            rows.select(Session, ("pk",), {"pk": session.pk}, for_update=True)
            locked.set()
            release.wait(10)
        connection.close()

    thread = threading.Thread(target=holder)
    thread.start()
    try:
        assert locked.wait(10)
        with pytest.raises(DatabaseError), transaction.atomic():
            Session.objects.select_for_update(nowait=True).filter(pk=session.pk).first()
    finally:
        release.set()
        thread.join(10)
    with transaction.atomic():  # free again
        assert Session.objects.select_for_update(nowait=True).filter(pk=session.pk).first() is not None


def test_update_changes_only_the_rows_its_condition_names(session):
    queued, running = _command(session), _command(session, state=CommandState.RUNNING)
    now = timezone.now()
    changed = rows.update(CommandRun, {"pk": queued.pk, "state": CommandState.QUEUED},
                          {"state": CommandState.RUNNING, "started_at": now})
    assert changed == 1
    assert rows.update(CommandRun, {"pk": queued.pk, "state": CommandState.QUEUED}, {"state": "failed"}) == 0
    queued.refresh_from_db()
    assert (queued.state, queued.started_at) == (CommandState.RUNNING, now)
    running.refresh_from_db()
    assert running.started_at is None


def test_count_and_conditions_through_a_foreign_key(session, globex):
    _command(session)
    _command(session, state=CommandState.RUNNING)
    _command(session, state=CommandState.EXITED)
    waiting = (CommandState.QUEUED, CommandState.RUNNING)
    assert rows.count(CommandRun, {"session__tenant": session.tenant_id, "state": waiting}) == 2
    assert rows.count(CommandRun, {"session__tenant": globex.pk, "state": waiting}) == 0
    assert rows.count(Runner, {"pk": "none"}) == 0


def test_a_statement_without_a_condition_or_with_an_empty_set_is_refused(session):
    with pytest.raises(ValueError, match="condition is required"):
        rows.update(Session, {}, {"state_reason": "all of them"})
    with pytest.raises(ValueError, match="empty set"):
        rows.count(Session, {"state": ()})
    with pytest.raises(ValueError, match="not a chain of foreign keys"):
        rows.get(Session, {"pk": session.pk}, related=("state",))
