"""The role matrix: viewer reads; operator also kills sessions and downloads snapshots and
artifacts; security_admin also edits and publishes policies and deletes snapshots and artifacts;
tenant_admin also manages members and API keys."""

import pytest
from django.urls import reverse

from controlplane.models import ApiKey, Membership
from controlplane.roles import MINIMUM_ROLE, Role, can

MATRIX = {
    Role.VIEWER: {"read"},
    Role.OPERATOR: {"read", "kill_session", "download_artifact"},
    Role.SECURITY_ADMIN: {"read", "kill_session", "download_artifact", "edit_policy", "publish_policy",
                          "delete_artifact"},
    Role.TENANT_ADMIN: set(MINIMUM_ROLE),
}


@pytest.mark.parametrize("role", list(Role))
def test_each_role_may_do_exactly_what_the_matrix_says(role):
    assert {action for action in MINIMUM_ROLE if can(role, action)} == MATRIX[role]


@pytest.fixture
def member_of_role(acme, alice, make_member):
    return lambda role: make_member(acme, f"user-{role.label}", role)


@pytest.mark.parametrize("role", list(Role))
def test_only_a_tenant_admin_adds_members(role, member_of_role, client_for):
    client = client_for(member_of_role(role))
    response = client.post(reverse("member-add", args=["acme"]), {"username": "newcomer", "role": "viewer"})
    added = Membership.objects.filter(user__username="newcomer").exists()
    assert added == (role == Role.TENANT_ADMIN)
    assert response.status_code == (200 if role == Role.TENANT_ADMIN else 403)


@pytest.mark.parametrize("role", list(Role))
def test_only_a_tenant_admin_creates_api_keys(role, member_of_role, client_for):
    client = client_for(member_of_role(role))
    response = client.post(reverse("api-key-create", args=["acme"]), {"name": "ci", "scopes": ["sessions"]})
    assert ApiKey.objects.filter(name="ci").exists() == (role == Role.TENANT_ADMIN)
    assert response.status_code == (200 if role == Role.TENANT_ADMIN else 403)


@pytest.mark.parametrize("role", list(Role))
def test_only_a_tenant_admin_sees_the_member_and_key_controls(role, member_of_role, client_for):
    page = client_for(member_of_role(role)).get(reverse("settings", args=["acme"])).content.decode()
    assert ("Create key" in page) == (role == Role.TENANT_ADMIN)
    assert ("Add member" in page) == (role == Role.TENANT_ADMIN)


def test_a_forbidden_action_says_which_role_is_missing(bob, client_for):
    response = client_for(bob).post(reverse("api-key-create", args=["acme"]), {"name": "x", "scopes": ["sessions"]})
    assert response.status_code == 403
    assert b"viewer cannot manage api keys" in response.content


def test_a_tenant_admin_changes_a_role(alice, bob, client_for):
    membership = bob.memberships.get()
    client_for(alice).post(reverse("member-role", args=["acme", membership.id]), {"role": "operator"})
    membership.refresh_from_db()
    assert membership.role == Role.OPERATOR


def test_the_last_tenant_admin_cannot_be_demoted_or_removed(alice, client_for):
    membership = alice.memberships.get()
    client = client_for(alice)
    page = client.post(reverse("member-role", args=["acme", membership.id]), {"role": "viewer"}, follow=True)
    assert b"at least one tenant_admin" in page.content
    client.post(reverse("member-remove", args=["acme", membership.id]))
    membership.refresh_from_db()
    assert membership.role == Role.TENANT_ADMIN


def test_adding_a_new_user_shows_their_password_once(alice, client_for):
    client = client_for(alice)
    response = client.post(reverse("member-add", args=["acme"]), {"username": "erin", "role": "operator"})
    assert b'data-testid="new-user"' in response.content
    assert Membership.objects.get(user__username="erin").role == Role.OPERATOR
    again = client.get(reverse("settings", args=["acme"]))
    assert b'data-testid="new-user"' not in again.content


def test_adding_an_existing_member_twice_is_a_form_error(alice, bob, client_for):
    response = client_for(alice).post(reverse("member-add", args=["acme"]), {"username": "bob", "role": "viewer"})
    assert response.status_code == 400
    assert b"already a member" in response.content


def test_a_bad_role_name_is_a_form_error_not_a_crash(alice, client_for):
    response = client_for(alice).post(reverse("member-add", args=["acme"]), {"username": "x", "role": "root"})
    assert response.status_code == 400
    assert not Membership.objects.filter(user__username="x").exists()


def test_stored_workspaces_are_downloaded_by_operators_and_deleted_by_security_admins(acme, make_member, client_for):
    some = "00000000-0000-4000-8000-000000000000"
    for role, download, delete in ((Role.VIEWER, 403, 403), (Role.OPERATOR, 404, 403),
                                   (Role.SECURITY_ADMIN, 404, 404)):
        client = client_for(make_member(acme, f"user{role}", role))
        assert client.get(f"/t/acme/stored/snapshots/{some}/download").status_code == download
        assert client.post(f"/t/acme/stored/artifacts/{some}/delete").status_code == delete
