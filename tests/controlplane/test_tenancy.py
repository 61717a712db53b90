import pytest
from django.urls import reverse

from controlplane.roles import Role

TENANT_PAGES = ["sessions", "policies", "denials", "audit", "settings"]


@pytest.mark.parametrize("page", TENANT_PAGES)
def test_an_outsider_gets_404_for_every_page_of_another_tenant(page, alice, charlie, client_for):
    response = client_for(charlie).get(reverse(page, args=["acme"]))
    assert response.status_code == 404
    assert b"Acme" not in response.content


@pytest.mark.parametrize("page", TENANT_PAGES)
def test_a_member_sees_every_page_of_the_layout(page, bob, client_for):
    response = client_for(bob).get(reverse(page, args=["acme"]))
    assert response.status_code == 200
    for section in ["Sessions", "Policies", "Denials", "Audit", "Settings"]:
        assert f">{section}</a>".encode() in response.content


def test_an_anonymous_visitor_is_sent_to_the_login_page(acme, client):
    response = client.get(reverse("audit", args=["acme"]))
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))


def test_an_outsider_cannot_revoke_another_tenants_key_even_through_their_own_tenant(
    alice, charlie, make_key, client_for
):
    acme_key = make_key(alice.memberships.get().tenant).api_key
    response = client_for(charlie).post(reverse("api-key-revoke", args=["globex", acme_key.id]))
    assert response.status_code == 404
    acme_key.refresh_from_db()
    assert acme_key.revoked_at is None


def test_an_outsider_cannot_change_a_role_in_another_tenant(alice, bob, charlie, client_for):
    bob_membership = bob.memberships.get()
    response = client_for(charlie).post(
        reverse("member-role", args=["globex", bob_membership.id]), {"role": "tenant_admin"}
    )
    assert response.status_code == 404
    bob_membership.refresh_from_db()
    assert bob_membership.role == Role.VIEWER


def test_a_user_in_two_tenants_switches_between_them(alice, globex, make_member, client_for):
    make_member(globex, "alice", Role.VIEWER)
    client = client_for(alice)
    acme_page = client.get(reverse("audit", args=["acme"])).content.decode()
    assert 'data-testid="current-tenant">acme<' in acme_page
    assert reverse("audit", args=["globex"]) in acme_page  # the switcher links to the same page there
    globex_page = client.get(reverse("audit", args=["globex"])).content.decode()
    assert 'data-testid="current-tenant">globex<' in globex_page
    assert "tenant.created" in globex_page


def test_home_sends_a_member_to_their_first_tenant(alice, client_for):
    response = client_for(alice).get(reverse("home"))
    assert response["Location"] == reverse("sessions", args=["acme"])


def test_home_tells_a_user_without_tenant_what_to_do(db, client_for):
    from controlplane.services import user_create

    response = client_for(user_create(username="dora").user).get(reverse("home"))
    assert response.status_code == 403
    assert b"not a member of any tenant" in response.content


def test_an_api_key_only_sees_its_own_tenant(alice, charlie, make_key, api):
    globex_key = make_key(charlie.memberships.get().tenant).key
    body = api(globex_key).get("/api/v1/whoami").json()
    assert body["tenant"]["slug"] == "globex"
