"""What a hostile review found at the edges of the API and the dashboard: input that crashed
or was guessed at, refusals logged as errors, headers a browser needs."""

import json
import logging

import pytest
from django.urls import reverse

from controlplane.roles import Role


@pytest.mark.parametrize("body", ["[" * 100_000 + "]" * 100_000, '{"a":' * 40 + "1" + "}" * 40])
def test_json_nested_past_any_real_request_is_a_400_not_a_500(body, transactional_db, acme, make_key, api):
    # transactional: the sessions endpoint runs on the API's own threads, which see only commits
    key = make_key(acme).key
    response = api(key).post("/api/v1/sessions", data=body, content_type="application/json")
    assert response.status_code == 400
    assert response.json()["error"] == "invalid_request"
    assert "nested deeper" in response.json()["fields"]["non_field_errors"][0]


def test_a_json_body_over_djangos_own_limit_is_a_json_413(transactional_db, acme, make_key, api):
    # Within AIRLOCK_MAX_REQUEST_BYTES but over Django's DATA_UPLOAD_MAX_MEMORY_SIZE (2.5 MiB, kept
    # for forms: parsing one costs many times its size), it was Django's HTML 400 page.
    body = json.dumps({"conversation_id": "x" * 3 * 2**20, "policy": "default"})
    response = api(make_key(acme).key).post("/api/v1/sessions", data=body, content_type="application/json")
    assert response.status_code == 413
    assert response.json()["error"] == "request_too_large" and "JSON body" in response.json()["detail"]


def test_policy_endpoints_refuse_deep_json_too(acme, make_key, api):
    from controlplane.models import ApiKeyScope

    key = make_key(acme, scopes=(ApiKeyScope.POLICIES_READ, ApiKeyScope.POLICIES_WRITE)).key
    response = api(key).post("/api/v1/policies", data="[" * 5000, content_type="application/json")
    assert response.status_code == 400 and response.json()["error"] == "invalid_request"


def test_a_role_refusal_is_one_line_in_the_log_not_a_traceback(acme, alice, make_member, client_for, caplog):
    viewer = make_member(acme, "vera", Role.VIEWER)
    with caplog.at_level(logging.WARNING, logger="django.request"):
        response = client_for(viewer).post(reverse("api-key-create", args=["acme"]), {"name": "x"})
    assert response.status_code == 403
    assert "cannot manage api keys" in response.content.decode()
    records = [r for r in caplog.records if r.name == "django.request"]
    assert records and all(r.exc_info is None for r in records)


def test_pages_and_api_answers_carry_a_content_security_policy(alice, client_for, acme, make_key, api):
    page = client_for(alice).get(reverse("sessions", args=["acme"]))
    policy = page.headers["Content-Security-Policy"]
    assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy and "unsafe-inline" not in policy
    answer = api(make_key(acme).key).get("/api/v1/whoami")
    assert answer.headers["Content-Security-Policy"].startswith("default-src 'none'")


def test_no_page_carries_inline_script_or_handlers(alice, client_for):
    client = client_for(alice)
    for name in ("sessions", "policies", "denials", "exceptions", "settings", "audit", "metrics"):
        html = client.get(reverse(name, args=["acme"])).content.decode()
        assert "onsubmit=" not in html and "onclick=" not in html
        assert "<script>" not in html and ' style="' not in html, name


def test_hsts_is_sent_over_https_only(alice, client_for, acme, make_key, api, settings):
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    client = client_for(alice)
    assert "Strict-Transport-Security" not in client.get(reverse("sessions", args=["acme"])).headers
    secure = client.get(reverse("sessions", args=["acme"]), headers={"X-Forwarded-Proto": "https"})
    assert secure.headers["Strict-Transport-Security"] == f"max-age={365 * 86400}"


def test_the_api_docs_script_is_served_apart_from_the_page(client, db):
    page = client.get("/api/docs/")
    assert page.status_code == 200 and "<script>" not in page.content.decode()
    script = client.get("/api/docs/?script")
    assert script.status_code == 200 and script["Content-Type"].startswith("application/javascript")


def test_a_tenants_own_address_leads_to_its_sessions_and_stays_closed_to_outsiders(alice, charlie, client_for):
    response = client_for(alice).get("/t/acme/")
    assert response.status_code == 302 and response["Location"] == reverse("sessions", args=["acme"])
    assert client_for(charlie).get("/t/acme/").status_code == 404


def test_answers_written_before_django_carry_the_api_headers(settings):
    """The tenant throttle's 429 and the body limit's 413 (ASGI, before Django's handler), and the
    connection cap's 429 (written before the request is read)."""
    from controlplane import connections, security

    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    proxied = {"scheme": "http", "headers": [(b"x-forwarded-proto", b"https")]}
    plain = {"scheme": "http", "headers": [(b"x-forwarded-proto", b"http")]}
    assert dict(security.raw_headers(proxied))[b"strict-transport-security"] == f"max-age={365 * 86400}".encode()
    assert b"strict-transport-security" not in dict(security.raw_headers(plain))
    assert dict(security.raw_headers(plain))[b"content-security-policy"] == security.API.encode()
    assert b"\r\ncontent-security-policy: default-src 'none'; frame-ancestors 'none'\r\n" in connections.REFUSED
    assert b"\r\nx-content-type-options: nosniff\r\n" in connections.REFUSED
