from django.test import Client
from django.urls import reverse


def test_a_user_logs_in_and_out(alice):
    from controlplane.services import user_reset_password

    password = user_reset_password(user=alice)
    client = Client()
    response = client.post(reverse("login"), {"username": "alice", "password": password}, follow=True)
    assert response.redirect_chain[-1][0] == reverse("sessions", args=["acme"])
    assert b'data-testid="current-tenant">acme<' in response.content
    client.post(reverse("logout"))
    assert client.get(reverse("audit", args=["acme"])).status_code == 302


def test_a_wrong_password_is_refused_with_a_message(alice):
    response = Client().post(reverse("login"), {"username": "alice", "password": "wrong"})
    assert response.status_code == 200
    assert b"do not match an account" in response.content


def test_forms_without_a_csrf_token_are_refused(alice):
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    response = client.post(reverse("api-key-create", args=["acme"]), {"name": "x", "scopes": ["sessions"]})
    assert response.status_code == 403
    assert not alice.memberships.get().tenant.api_keys.exists()


def test_session_cookies_are_secure_and_http_only(alice):
    from controlplane.services import user_reset_password

    password = user_reset_password(user=alice)
    client = Client()
    client.post(reverse("login"), {"username": "alice", "password": password})
    cookie = client.cookies["sessionid"]
    assert cookie["secure"] and cookie["httponly"] and cookie["samesite"] == "Lax"


def test_the_layout_serves_its_own_css_and_no_cdn(bob, client_for):
    page = client_for(bob).get(reverse("audit", args=["acme"])).content.decode()
    assert "/static/css/airlock.css" in page
    assert "https://" not in page and "http://" not in page


def test_a_missing_page_is_a_friendly_404(bob, client_for):
    response = client_for(bob).get("/t/acme/nothing-here/")
    assert response.status_code == 404
