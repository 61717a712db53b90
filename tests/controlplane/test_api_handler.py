"""The agent API's lean ASGI handler: no dashboard middleware, but the Host check and the
security headers still hold."""

import pytest
from channels.testing import HttpCommunicator

from controlplane.asgi import api_app

pytestmark = pytest.mark.django_db(transaction=True)


async def get(path: str, *, host: bytes = b"127.0.0.1", key: str | None = None) -> dict:
    headers = [(b"host", host)] + ([(b"authorization", f"Bearer {key}".encode())] if key else [])
    return await HttpCommunicator(api_app, "GET", path, headers=headers).get_response(timeout=10)


def header(response: dict, name: bytes) -> bytes | None:
    return dict(response["headers"]).get(name)


async def test_api_responses_carry_the_security_headers(acme, make_key):
    from asgiref.sync import sync_to_async

    key = (await sync_to_async(make_key)(acme)).key
    response = await get("/api/v1/whoami", key=key)
    assert response["status"] == 200
    assert header(response, b"X-Content-Type-Options") == b"nosniff"
    assert header(response, b"X-Frame-Options") == b"DENY"
    assert header(response, b"Referrer-Policy") == b"same-origin"


async def test_a_host_outside_allowed_hosts_is_refused(db):
    response = await get("/api/v1/whoami", host=b"evil.example")
    assert response["status"] == 400


async def test_unknown_api_paths_still_answer_json(db):
    response = await get("/api/v1/nothing")
    assert response["status"] == 404 and b'"not_found"' in response["body"]
