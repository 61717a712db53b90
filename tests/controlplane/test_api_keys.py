import re
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from controlplane.models import ApiKey
from controlplane.services import api_key_create, api_key_revoke

KEY_SHAPE = re.compile(r"alk_[0-9a-f]{8}_[A-Za-z0-9_-]{43}")


def test_a_tenant_admin_creates_a_key_that_is_shown_once_and_answers_whoami(alice, client_for, api):
    client = client_for(alice)
    response = client.post(
        reverse("api-key-create", args=["acme"]), {"name": "ci-bot", "scopes": ["sessions", "policies:read"]}
    )
    key = KEY_SHAPE.search(response.content.decode()).group()
    assert key not in client.get(reverse("settings", args=["acme"])).content.decode()

    body = api(key).get("/api/v1/whoami").json()
    assert body["tenant"] == {"slug": "acme", "name": "Acme Corp"}
    assert body["key"]["scopes"] == ["policies:read", "sessions"]
    assert body["key"]["name"] == "ci-bot"


def test_only_a_hash_of_the_key_is_stored(acme, make_key):
    new = make_key(acme)
    stored = ApiKey.objects.get(pk=new.api_key.pk)
    secret = new.key.split("_", 2)[2]  # alk_<prefix>_<secret>; the secret may hold "_"
    values = [str(v) for v in stored.__dict__.values()]
    assert not any(secret in value for value in values)
    assert stored.secret_matches(secret)


def test_use_records_the_last_used_time(acme, make_key, api):
    new = make_key(acme)
    assert new.api_key.last_used_at is None
    api(new.key).get("/api/v1/whoami")
    new.api_key.refresh_from_db()
    assert new.api_key.last_used_at is not None


def test_a_revoked_key_gets_401_saying_it_was_revoked(acme, make_key, api):
    new = make_key(acme)
    assert api(new.key).get("/api/v1/whoami").status_code == 200
    api_key_revoke(api_key=new.api_key, actor=None)
    response = api(new.key).get("/api/v1/whoami")
    assert response.status_code == 401
    assert response.json()["error"] == "revoked_key"
    assert response["WWW-Authenticate"].startswith("Bearer")


def test_an_expired_key_gets_401_saying_it_expired(acme, make_key, api):
    new = make_key(acme, expires_at=timezone.now() + timedelta(seconds=60))
    ApiKey.objects.filter(pk=new.api_key.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    response = api(new.key).get("/api/v1/whoami")
    assert response.status_code == 401
    assert response.json()["error"] == "expired_key"


@pytest.mark.parametrize(
    ("header", "error"),
    [
        (None, "not_authenticated"),
        ("Bearer", "malformed_credentials"),
        ("Basic YWxpY2U6cHc=", "malformed_credentials"),
        ("Bearer alk_00000000_nope", "invalid_key"),
        ("Bearer something-else", "invalid_key"),
        ("Bearer alk_", "invalid_key"),
    ],
)
def test_a_wrong_key_gets_401_saying_which(header, error, acme, make_key, client):
    make_key(acme)
    headers = {"Authorization": header} if header else {}
    response = client.get("/api/v1/whoami", headers=headers)
    assert response.status_code == 401
    assert response.json()["error"] == error


def test_a_right_prefix_with_a_wrong_secret_is_invalid(acme, make_key, api):
    new = make_key(acme)
    forged = new.key[:-4] + ("AAAA" if not new.key.endswith("AAAA") else "BBBB")
    assert api(forged).get("/api/v1/whoami").json()["error"] == "invalid_key"


def test_the_dashboard_revokes_a_key(alice, acme, make_key, client_for, api):
    new = make_key(acme)
    client_for(alice).post(reverse("api-key-revoke", args=["acme", new.api_key.id]))
    assert api(new.key).get("/api/v1/whoami").json()["error"] == "revoked_key"


def test_a_key_with_an_unknown_scope_or_a_past_expiry_is_refused(alice, acme, client_for):
    client = client_for(alice)
    response = client.post(reverse("api-key-create", args=["acme"]), {"name": "x", "scopes": ["root"]})
    assert response.status_code == 400
    from django.core.exceptions import ValidationError

    with pytest.raises(ValidationError):
        api_key_create(tenant=acme, name="y", scopes=["sessions"], actor=None,
                       expires_at=timezone.now() - timedelta(days=1))
    assert not ApiKey.objects.exists()


def test_an_expiring_key_shows_its_expiry_in_the_dashboard(alice, client_for):
    client = client_for(alice)
    client.post(reverse("api-key-create", args=["acme"]),
                {"name": "short", "scopes": ["sessions"], "expires_in_days": "7"})
    key = ApiKey.objects.get(name="short")
    assert timedelta(days=6) < key.expires_at - timezone.now() <= timedelta(days=7)
