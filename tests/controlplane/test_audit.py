import hashlib
import importlib
import json
import re
from concurrent.futures import ThreadPoolExecutor
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.urls import reverse

from controlplane.audit import GENESIS, audit_record, audit_verify, canonical_json, chain_hash
from controlplane.models import AuditEvent, Tenant
from tests.append_only import append_only_enforced, refused

# Checkpoints are written once an event commits: these tests commit (audit_verify reports a
# missing checkpoint file when events exist).
CHECKPOINTED = pytest.mark.django_db(transaction=True)


def actions(tenant) -> list[str]:
    return list(AuditEvent.objects.filter(tenant=tenant).order_by("seq").values_list("action", flat=True))


def test_every_change_of_security_state_is_audited(alice, acme, client_for):
    client = client_for(alice)
    client.post(reverse("member-add", args=["acme"]), {"username": "erin", "role": "viewer"})
    erin = acme.memberships.get(user__username="erin")
    client.post(reverse("member-role", args=["acme", erin.id]), {"role": "operator"})
    client.post(reverse("api-key-create", args=["acme"]), {"name": "ci", "scopes": ["sessions"]})
    key = acme.api_keys.get()
    client.post(reverse("api-key-revoke", args=["acme", key.id]))
    client.post(reverse("member-remove", args=["acme", erin.id]))
    assert actions(acme) == [
        "tenant.created", "member.added", "member.added", "member.role_changed",
        "api_key.created", "api_key.revoked", "member.removed",
    ]
    role_change = AuditEvent.objects.get(tenant=acme, action="member.role_changed")
    assert role_change.actor == "user:alice"
    assert role_change.data == {"user": "erin", "from": "viewer", "to": "operator"}


def test_each_tenant_has_its_own_chain(alice, charlie, acme, globex):
    assert audit_verify(acme) is None
    assert audit_verify(globex) is None
    assert AuditEvent.objects.filter(tenant=globex).order_by("seq").first().prev_hash == "0" * 64
    acme_hashes = set(AuditEvent.objects.filter(tenant=acme).values_list("hash", flat=True))
    assert not acme_hashes & set(AuditEvent.objects.filter(tenant=globex).values_list("prev_hash", flat=True))


def test_audit_rows_cannot_be_changed_or_deleted_through_the_orm(alice, acme):
    event = AuditEvent.objects.filter(tenant=acme).first()
    event.action = "nothing.happened"
    with pytest.raises(PermissionError):
        event.save()
    with pytest.raises(PermissionError):
        event.delete()
    with pytest.raises(PermissionError):
        AuditEvent.objects.filter(tenant=acme).update(action="x")
    with pytest.raises(PermissionError):
        AuditEvent.objects.filter(tenant=acme).delete()


def test_the_admin_offers_no_way_to_change_audit_rows(alice, acme, db):
    from django.contrib.auth import get_user_model

    root = get_user_model().objects.create_superuser("root", "root@example.com", "a-long-root-password")
    from django.test import Client

    client = Client()
    client.force_login(root)
    event = AuditEvent.objects.filter(tenant=acme).first()
    assert client.get(f"/admin/controlplane/auditevent/{event.pk}/delete/").status_code == 403
    assert client.post(f"/admin/controlplane/auditevent/{event.pk}/change/", {"action": "x"}).status_code == 403
    assert AuditEvent.objects.get(pk=event.pk).action == event.action


@CHECKPOINTED
def test_audit_verify_passes_on_an_intact_chain(alice, bob, charlie):
    out = StringIO()
    call_command("audit_verify", stdout=out)
    assert "acme: 3 events, chain intact" in out.getvalue()
    assert "globex: 2 events, chain intact" in out.getvalue()


def tamper(sql: str, params: list) -> None:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


@CHECKPOINTED
def test_a_row_changed_with_raw_sql_is_reported_with_its_sequence_number(alice, bob, acme):
    table = AuditEvent._meta.db_table
    tamper(f"UPDATE {table} SET data = %s WHERE tenant_id = %s AND seq = 2", ['{"role": "viewer"}', acme.pk])  # noqa: S608
    out = StringIO()
    with pytest.raises(CommandError) as failure:
        call_command("audit_verify", stdout=out)
    assert failure.value.returncode != 0
    assert "BROKEN  acme: event #2: the event's content does not match its hash" in out.getvalue()


def test_a_row_deleted_with_raw_sql_is_reported(alice, bob, acme):
    tamper(f"DELETE FROM {AuditEvent._meta.db_table} WHERE tenant_id = %s AND seq = 2", [acme.pk])  # noqa: S608
    link = audit_verify(acme)
    assert (link.seq, link.problem) == (2, "event #2 is missing (found #3)")


def test_a_rewritten_row_with_a_recomputed_hash_still_breaks_the_next_link(alice, bob, acme):
    event = AuditEvent.objects.get(tenant=acme, seq=2)
    event.actor = "user:mallory"
    forged = chain_hash(event.prev_hash, event)
    table = AuditEvent._meta.db_table
    tamper(f"UPDATE {table} SET actor = %s, hash = %s WHERE id = %s", ["user:mallory", forged, event.pk])  # noqa: S608
    link = audit_verify(acme)
    assert (link.seq, link.problem) == (3, "prev_hash does not match the previous event's hash")


def listed_actions(client, **filters) -> list[str]:
    page = client.get(reverse("audit", args=["acme"]), filters).content.decode()
    return re.findall(r"<td><code>([a-z_.]+)</code></td>", page)


def test_the_audit_page_filters_by_actor_action_and_period(alice, acme, client_for):
    audit_record(tenant=acme, actor=None, action="policy.published", data={"version": 1})
    client = client_for(alice)
    assert listed_actions(client) == ["policy.published", "member.added", "tenant.created"]
    assert listed_actions(client, action="member.") == ["member.added"]
    assert listed_actions(client, actor="system") == ["policy.published", "member.added", "tenant.created"]
    assert listed_actions(client, actor="alice") == []
    assert listed_actions(client, period="24h") == ["policy.published", "member.added", "tenant.created"]
    assert listed_actions(client, until="2000-01-01") == []
    assert listed_actions(client, since="2000-01-01", action="policy.published") == ["policy.published"]


def test_a_bad_audit_filter_is_a_400_with_the_field_named(alice, client_for):
    response = client_for(alice).get(reverse("audit", args=["acme"]), {"since": "yesterday-ish"})
    assert response.status_code == 400
    assert b"since: Enter a valid date." in response.content


@pytest.mark.parametrize("statement", [
    "UPDATE {table} SET actor = 'user:mallory' WHERE tenant_id = %s",
    "DELETE FROM {table} WHERE tenant_id = %s",
    "DELETE FROM {table} WHERE tenant_id = %s AND seq = (SELECT max(seq) FROM {table} WHERE tenant_id = %s)",
])
def test_the_database_refuses_to_change_or_delete_audit_rows(statement, alice, bob, acme):
    sql = statement.format(table=AuditEvent._meta.db_table)
    with append_only_enforced():
        assert refused(sql, [acme.pk] * sql.count("%s"))
    assert actions(acme) == ["tenant.created", "member.added", "member.added"]  # nothing changed


def test_the_database_refuses_to_replace_an_audit_row(alice, bob, acme):
    """SQLite's REPLACE deletes the row it meets without a DELETE trigger; PostgreSQL's upsert updates it."""
    table = AuditEvent._meta.db_table
    last = AuditEvent.objects.get(tenant=acme, seq=3)
    with append_only_enforced():
        if connection.vendor == "sqlite":
            tamper(f"CREATE TEMP TABLE forged AS SELECT * FROM {table} WHERE id = %s", [last.pk])  # noqa: S608
            tamper("UPDATE forged SET actor = 'user:mallory'", [])
            assert refused(f"INSERT OR REPLACE INTO {table} SELECT * FROM forged", [])  # noqa: S608
            assert refused(f"REPLACE INTO {table} SELECT * FROM forged", [])  # noqa: S608
            tamper("UPDATE forged SET id = id + 1000", [])  # a new id, the same tenant and seq
            assert refused(f"INSERT OR REPLACE INTO {table} SELECT * FROM forged", [])  # noqa: S608
        else:
            assert refused(f"INSERT INTO {table} SELECT * FROM {table} WHERE id = %s "  # noqa: S608
                           "ON CONFLICT (id) DO UPDATE SET actor = 'user:mallory'", [last.pk])
    assert AuditEvent.objects.get(tenant=acme, seq=3).actor == last.actor
    assert actions(acme) == ["tenant.created", "member.added", "member.added"]


@pytest.mark.django_db(transaction=True)  # (PostgreSQL refuses any TRUNCATE after this transaction's inserts)
def test_postgresql_refuses_truncate_too(alice, acme):
    if connection.vendor != "postgresql":
        pytest.skip("SQLite has no TRUNCATE")
    with append_only_enforced():
        assert refused(f"TRUNCATE {AuditEvent._meta.db_table} CASCADE", [])
    assert AuditEvent.objects.filter(tenant=acme).count() == 2


def sha_rewrite(tenant, first_seq: int, **changes) -> None:
    """What someone with the database but not the key can do: change event `first_seq` and
    re-chain it and every later one with plain SHA-256 (as events were before the chain was keyed)."""
    table = AuditEvent._meta.db_table
    events = list(AuditEvent.objects.filter(tenant=tenant).order_by("seq"))
    prev = events[first_seq - 2].hash if first_seq > 1 else GENESIS
    for event in events[first_seq - 1:]:
        if event.seq == first_seq:
            for field, value in changes.items():
                setattr(event, field, value)
        digest = hashlib.sha256((prev + canonical_json(event)).encode()).hexdigest()
        tamper(f"UPDATE {table} SET actor = %s, prev_hash = %s, hash = %s WHERE id = %s",  # noqa: S608
               [event.actor, prev, digest, event.pk])
        prev = digest


@pytest.mark.parametrize("first", [1, 2])
def test_events_rewritten_without_the_key_are_found(first, alice, bob, acme):
    sha_rewrite(acme, first, actor="user:mallory")  # a chain consistent on its own, but not keyed
    link = audit_verify(acme)
    assert link.seq == first and "hashed without the key" in link.problem


@CHECKPOINTED
def test_a_whole_chain_rewritten_with_the_key_is_found_by_its_checkpoint(alice, bob, acme):
    """Whoever has the key and the database (not the checkpoint file) can re-chain everything."""
    table, prev = AuditEvent._meta.db_table, GENESIS
    for event in AuditEvent.objects.filter(tenant=acme).order_by("seq"):
        event.actor = "user:mallory"
        digest = chain_hash(prev, event)
        tamper(f"UPDATE {table} SET actor = %s, prev_hash = %s, hash = %s WHERE id = %s",  # noqa: S608
               ["user:mallory", prev, digest, event.pk])
        prev = digest
    link = audit_verify(acme)
    assert link.seq == 1 and link.problem.startswith("re-hashed: event #1's hash is not the one checkpointed")


@CHECKPOINTED
def test_the_last_events_deleted_and_as_many_written_again_are_found(alice, bob, acme):
    """The newest checkpoint agrees with the chain again; an older one of the same count does not."""
    tamper(f"DELETE FROM {AuditEvent._meta.db_table} WHERE tenant_id = %s AND seq >= 2", [acme.pk])  # noqa: S608
    for _ in range(3):
        audit_record(tenant=acme, actor=None, action="policy.published")
    link = audit_verify(acme)
    assert link.seq == 2 and "deleted and others written in their place" in link.problem
    out = StringIO()
    with pytest.raises(CommandError):
        call_command("audit_verify", "--tenant", "acme", stdout=out)
    assert "BROKEN  acme: event #2: re-hashed" in out.getvalue()


@CHECKPOINTED
def test_a_truncated_chain_is_found_after_its_tenant_is_renamed(alice, bob, acme):
    tamper(f"DELETE FROM {AuditEvent._meta.db_table} WHERE tenant_id = %s AND seq >= 2", [acme.pk])  # noqa: S608
    Tenant.objects.filter(pk=acme.pk).update(slug="acme2")
    out = StringIO()
    with pytest.raises(CommandError):
        call_command("audit_verify", "--tenant", "acme2", stdout=out)
    assert "BROKEN  acme2: event #2: truncated" in out.getvalue()
    out = StringIO()
    with pytest.raises(CommandError):
        call_command("audit_verify", stdout=out)
    assert "BROKEN  acme2: event #2: truncated" in out.getvalue() and "gone from the database" not in out.getvalue()


def test_a_row_edited_and_rehashed_with_a_guessed_key_is_found(alice, bob, acme, settings):
    event = AuditEvent.objects.get(tenant=acme, seq=3)
    event.actor = "user:mallory"
    settings.AIRLOCK_AUDIT_KEY = "a-key-the-attacker-guessed"
    forged = chain_hash(event.prev_hash, event)
    settings.AIRLOCK_AUDIT_KEY = ""
    tamper(f"UPDATE {AuditEvent._meta.db_table} SET actor = %s, hash = %s WHERE id = %s",  # noqa: S608
           ["user:mallory", forged, event.pk])
    assert audit_verify(acme).problem.startswith("the event's content does not match its hash")


@CHECKPOINTED
def test_the_last_events_deleted_are_found_by_the_checkpoint(alice, bob, acme):
    tamper(f"DELETE FROM {AuditEvent._meta.db_table} WHERE tenant_id = %s AND seq >= 2", [acme.pk])  # noqa: S608
    link = audit_verify(acme)
    assert (link.seq, link.problem.split(":")[0]) == (2, "truncated")
    assert "#2-#3 were deleted" in link.problem


@CHECKPOINTED
def test_a_whole_chain_deleted_is_found(alice, bob, acme):
    tamper(f"DELETE FROM {AuditEvent._meta.db_table} WHERE tenant_id = %s", [acme.pk])  # noqa: S608
    assert audit_verify(acme).problem.startswith("the whole chain was deleted")


@CHECKPOINTED
def test_a_tenant_deleted_with_its_chain_is_reported_by_audit_verify(alice, charlie, acme):
    tamper(f"DELETE FROM {AuditEvent._meta.db_table} WHERE tenant_id = %s", [acme.pk])  # noqa: S608
    acme.delete()
    out = StringIO()
    with pytest.raises(CommandError):
        call_command("audit_verify", stdout=out)
    assert "ok      globex: 2 events, chain intact" in out.getvalue()
    assert "BROKEN  acme: the tenant and its whole chain are gone from the database" in out.getvalue()


@CHECKPOINTED
def test_checkpoints_are_signed_lines_outside_the_database(alice, acme, settings, caplog):
    import logging

    with caplog.at_level(logging.INFO, logger="airlock.audit"):
        audit_record(tenant=acme, actor=None, action="policy.published")
    lines = settings.AIRLOCK_AUDIT_CHECKPOINTS.read_text().splitlines()
    last = json.loads(lines[-1])
    assert (last["tenant"], last["count"]) == ("acme", 3)
    assert last["hash"] == AuditEvent.objects.get(tenant=acme, seq=3).hash and len(last["mac"]) == 64
    assert "audit checkpoint: tenant acme has 3 events" in caplog.text
    # A line someone added to let a truncated chain pass is not signed by the deployment's key.
    forged = {**last, "count": 2, "mac": "0" * 64}
    with settings.AIRLOCK_AUDIT_CHECKPOINTS.open("a") as file:
        file.write(json.dumps(forged) + "\n")
    out = StringIO()
    with pytest.raises(CommandError):
        call_command("audit_verify", stdout=out)
    assert f"line {len(lines) + 1} of the checkpoint file is not signed" in out.getvalue()
    assert "ok      acme: 3 events, chain intact" in out.getvalue()



@CHECKPOINTED
def test_a_deleted_checkpoint_file_is_reported(alice, acme, settings):
    settings.AIRLOCK_AUDIT_CHECKPOINTS.unlink()
    out = StringIO()
    with pytest.raises(CommandError):
        call_command("audit_verify", stdout=out)
    assert "BROKEN  checkpoints: the checkpoint file" in out.getvalue() and "is missing" in out.getvalue()


@CHECKPOINTED
def test_a_tenant_made_again_under_its_old_name_is_reported_with_tenant(alice, acme, settings):
    from controlplane import services

    tamper(f"DELETE FROM {AuditEvent._meta.db_table} WHERE tenant_id = %s", [acme.pk])  # noqa: S608
    acme.delete()
    services.tenant_create(slug="acme", name="Acme again")
    with settings.AIRLOCK_AUDIT_CHECKPOINTS.open("ab") as file:
        file.write(b"\xff\xfe not a line\n")  # a line that is not even UTF-8 is a forged one, not a crash
    out = StringIO()
    with pytest.raises(CommandError):
        call_command("audit_verify", "--tenant", "acme", stdout=out)
    assert "a tenant of that name was made again" in out.getvalue()
    assert "is not signed by this deployment's audit key" in out.getvalue()


def test_a_user_who_acted_cannot_be_deleted_but_is_refused_cleanly(alice, acme):
    from django.db.models import ProtectedError

    audit_record(tenant=acme, actor=alice, action="policy.published")
    with pytest.raises(ProtectedError):
        alice.delete()


def test_chains_from_before_the_key_are_re_chained_by_their_migration_where_they_hold(alice, bob, charlie, acme,
                                                                                        globex):
    """Migration 0002 keys the chains written with plain SHA-256; one already broken stays broken
    from its broken link on, for audit_verify to report."""
    from django.db.migrations.executor import MigrationExecutor

    rekey = importlib.import_module("controlplane.migrations.0002_audit_keyed").rekey
    apps = MigrationExecutor(connection).loader.project_state(("controlplane", "0002_audit_keyed")).apps
    sha_rewrite(acme, 1)  # both chains as the old code wrote them
    sha_rewrite(globex, 1)
    tamper(f"UPDATE {AuditEvent._meta.db_table} SET actor = 'user:mallory' WHERE tenant_id = %s AND seq = 2",  # noqa: S608
           [globex.pk])
    rekey(apps, None)
    assert audit_verify(acme, []) is None
    assert audit_verify(globex, []).seq == 2


@CHECKPOINTED
def test_checkpoint_lines_cut_from_the_files_middle_are_found(alice, bob, acme, settings):
    """What signed lines alone let through: the chain's last event deleted, another written in its
    place, and the lines that checkpointed the old one cut from the file."""
    old = AuditEvent.objects.get(tenant=acme, seq=3)
    tamper(f"DELETE FROM {AuditEvent._meta.db_table} WHERE id = %s", [old.pk])  # noqa: S608
    audit_record(tenant=acme, actor=None, action="policy.published")
    file = settings.AIRLOCK_AUDIT_CHECKPOINTS
    lines = file.read_text().splitlines(keepends=True)
    cut = [number for number, line in enumerate(lines, 1) if json.loads(line)["hash"] == old.hash]
    file.write_text("".join(line for number, line in enumerate(lines, 1) if number not in cut))
    assert audit_verify(acme) is None  # every checkpoint left agrees with the chain
    out = StringIO()
    with pytest.raises(CommandError):
        call_command("audit_verify", stdout=out)
    assert f"BROKEN  checkpoints: line {cut[0]} of the checkpoint file does not follow the line before it" \
           in out.getvalue()


@CHECKPOINTED
def test_checkpoint_lines_from_before_lines_were_linked_still_verify(alice, acme, settings):
    """A file begun by an earlier version has lines without `prev`; the first linked line follows
    the last of them."""
    from controlplane import audit

    file = settings.AIRLOCK_AUDIT_CHECKPOINTS
    unlinked = []
    for line in map(json.loads, file.read_text().splitlines()):
        del line["prev"], line["mac"]
        text = json.dumps(line, sort_keys=True, separators=(",", ":"))
        unlinked.append(json.dumps({**line, "mac": audit._mac(text)}, sort_keys=True, separators=(",", ":")) + "\n")
    file.write_text("".join(unlinked))
    audit_record(tenant=acme, actor=None, action="policy.published")
    found = audit.checkpoints()
    assert (found.forged, found.cut) == ([], [])
    assert [point.count for point in found.found[acme.pk]] == list(range(1, len(unlinked) + 2))
    lines = file.read_text().splitlines(keepends=True)
    file.write_text("".join(lines[:len(unlinked) - 1] + lines[len(unlinked):]))  # the line it follows cut out
    assert audit.checkpoints().cut == [len(unlinked)]


def test_concurrent_checkpoints_each_follow_the_line_before(settings):
    from types import SimpleNamespace

    from controlplane import audit

    def write(worker: int) -> None:
        for count in range(1, 41):
            audit.checkpoint(SimpleNamespace(pk=worker, slug=f"t{worker}"), count, f"{worker:064x}")

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(write, range(8)))
    found = audit.checkpoints()
    assert (found.forged, found.cut) == ([], [])
    assert sorted(len(points) for points in found.found.values()) == [40] * 8


def test_a_checkpoint_path_that_is_not_a_regular_file_neither_blocks_nor_crashes(settings, acme, caplog):
    import os
    import time

    from controlplane import audit

    os.mkfifo(settings.AIRLOCK_AUDIT_CHECKPOINTS)  # nobody reads it: an open for writing would wait for ever
    started = time.monotonic()
    audit.checkpoint(acme, 1, "0" * 64)
    assert time.monotonic() - started < 1
    assert "not a regular file" in caplog.text
    with pytest.raises(OSError, match="not a regular file"):
        audit.checkpoints()
    out = StringIO()
    with pytest.raises(CommandError):
        call_command("audit_verify", stdout=out)
    assert "BROKEN  checkpoints: the checkpoint file cannot be read" in out.getvalue()


def test_a_line_cut_short_by_a_crash_is_ended_before_the_next(settings):
    from types import SimpleNamespace

    from controlplane import audit

    tenant = SimpleNamespace(pk=1, slug="acme")
    audit.checkpoint(tenant, 1, "1" * 64)
    with settings.AIRLOCK_AUDIT_CHECKPOINTS.open("ab") as file:
        file.write(b'{"tenant_id":1,"tenant":"ac')  # the disk filled up mid-line
    audit.checkpoint(tenant, 2, "2" * 64)
    audit.checkpoint(tenant, 3, "3" * 64)
    found = audit.checkpoints()
    assert (found.forged, found.cut) == ([2], [])  # the fragment, and nothing lost after it
    assert [point.count for point in found.found[1]] == [1, 2, 3]


def test_a_line_longer_than_one_read_is_followed_all_the_same(settings):
    from types import SimpleNamespace

    from controlplane import audit

    audit.checkpoint(SimpleNamespace(pk=1, slug="x" * 70_000), 1, "1" * 64)  # (SQLite keeps any length)
    audit.checkpoint(SimpleNamespace(pk=2, slug="acme"), 1, "2" * 64)
    assert audit.checkpoints().cut == []


def test_a_lock_held_elsewhere_delays_an_event_a_second_at_most(settings, acme, caplog):
    import subprocess
    import sys
    import time

    from controlplane import audit

    audit.checkpoint(acme, 1, "1" * 64)
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, sys, time\n"
                               f"f = open({str(settings.AIRLOCK_AUDIT_CHECKPOINTS)!r})\n"
                               "fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(30)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        started = time.monotonic()
        audit.checkpoint(acme, 2, "2" * 64)
        assert time.monotonic() - started < audit.LOCK_WAIT_S + 0.5
        assert "holds its lock" in caplog.text
    finally:
        holder.kill()
        holder.wait()
    audit.checkpoint(acme, 3, "3" * 64)  # the next one is written, and follows the line before
    found = audit.checkpoints()
    assert ([point.count for point in found.found[acme.pk]], found.cut) == ([1, 3], [])


@CHECKPOINTED
def test_an_emptied_checkpoint_file_is_reported(alice, acme, settings):
    settings.AIRLOCK_AUDIT_CHECKPOINTS.write_text("")
    out = StringIO()
    with pytest.raises(CommandError):
        call_command("audit_verify", stdout=out)
    assert "BROKEN  checkpoints: the checkpoint file" in out.getvalue() and "is empty" in out.getvalue()


@CHECKPOINTED
@pytest.mark.parametrize("how", ["deleted", "emptied"])
def test_a_checkpoint_file_begun_again_is_reported_after_the_next_event_too(how, alice, bob, charlie, acme, settings):
    """The next event made a new file, and a truncation before it was lost with the old one."""
    table = AuditEvent._meta.db_table
    tamper(f"DELETE FROM {table} WHERE tenant_id = %s AND seq >= 2", [acme.pk])  # noqa: S608
    if how == "deleted":
        settings.AIRLOCK_AUDIT_CHECKPOINTS.unlink()
    else:
        settings.AIRLOCK_AUDIT_CHECKPOINTS.write_text("")
    audit_record(tenant=Tenant.objects.get(slug="globex"), actor=None, action="policy.published")
    out = StringIO()
    with pytest.raises(CommandError):
        call_command("audit_verify", stdout=out)
    held = AuditEvent.objects.count() - 1
    assert (f"BROKEN  checkpoints: line 1 begins the checkpoint file again, though the database held {held} audit "
            "events") in out.getvalue()


def test_a_very_long_last_line_costs_one_bounded_read(settings):
    import os
    from types import SimpleNamespace

    from controlplane import audit

    settings.AIRLOCK_AUDIT_CHECKPOINTS.write_bytes(b"x" * (16 * 2**20))  # no newline: one 16 MiB line
    descriptor = os.open(settings.AIRLOCK_AUDIT_CHECKPOINTS, os.O_RDONLY)
    try:  # read back LINE_MAX at most (it read the whole line again for each chunk: seconds, quadratic)
        assert len(audit._last_line(descriptor, 16 * 2**20)) <= audit.LINE_MAX + audit.TAIL_BYTES
    finally:
        os.close(descriptor)
    audit.checkpoint(SimpleNamespace(pk=1, slug="acme"), 1, "1" * 64)
    assert audit.checkpoints().found[1][0].count == 1
