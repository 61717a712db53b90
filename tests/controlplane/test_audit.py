import re
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.urls import reverse

from controlplane.audit import audit_record, audit_verify
from controlplane.models import AuditEvent


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


def test_audit_verify_passes_on_an_intact_chain(alice, bob, charlie):
    out = StringIO()
    call_command("audit_verify", stdout=out)
    assert "acme: 3 events, chain intact" in out.getvalue()
    assert "globex: 2 events, chain intact" in out.getvalue()


def tamper(sql: str, params: list) -> None:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


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
    from controlplane.audit import chain_hash

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
