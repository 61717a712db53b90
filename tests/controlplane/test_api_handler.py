"""The agent API's lean ASGI handler: no dashboard middleware, but the Host check and the
security headers still hold."""

import asyncio

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


async def test_a_tenant_past_its_request_rate_waits_then_is_refused_while_another_is_served(acme, globex, make_key,
                                                                                             settings):
    """The agent API's pacing (sessions/api/throttle.py): 2 a second, bursts of 4, a turn waited
    for at most 2 s; the rest of a flood is 429 at once, and another tenant's bucket is its own."""
    from asgiref.sync import sync_to_async

    settings.AIRLOCK_API_RATE_PER_TENANT = 2
    ours, theirs = [(await sync_to_async(make_key)(tenant)).key for tenant in (acme, globex)]

    async def whoami(key: str, space: str = " ") -> dict:
        headers = [(b"host", b"127.0.0.1"), (b"authorization", f"Bearer{space}{key}".encode())]
        return await HttpCommunicator(api_app, "GET", "/api/v1/whoami", headers=headers).get_response(timeout=20)

    # (a tab where a space would be is still the tenant's: the views read the header that way too)
    flood = await asyncio.gather(*(whoami(ours, "\t" if n % 2 else " ") for n in range(20)))
    statuses = [response["status"] for response in flood]
    assert statuses.count(200) >= 4 and statuses.count(429) >= 8, statuses
    refused = next(response for response in flood if response["status"] == 429)
    assert b"AIRLOCK_API_RATE_PER_TENANT" in refused["body"] and header(refused, b"retry-after") == b"1"
    assert header(refused, b"content-security-policy") == b"default-src 'none'; frame-ancestors 'none'"
    assert (await whoami(theirs))["status"] == 200  # globex was never part of acme's flood


async def test_made_up_tokens_are_paced_like_requests_without_one(acme, make_key, settings):
    from asgiref.sync import sync_to_async

    settings.AIRLOCK_API_RATE_PER_TENANT = 2
    real = (await sync_to_async(make_key)(acme)).key

    async def whoami(key: str) -> int:
        headers = [(b"host", b"127.0.0.1"), (b"authorization", f"Bearer {key}".encode())]
        return (await HttpCommunicator(api_app, "GET", "/api/v1/whoami", headers=headers).get_response(timeout=20))[
            "status"]

    made_up = await asyncio.gather(*(whoami(f"alk_{n:08x}_not-a-real-secret") for n in range(20)))
    assert made_up.count(429) >= 8 and made_up.count(401) >= 4  # each looked up at the tokenless pace at most
    assert await whoami(real) == 200


async def test_a_tenant_holds_at_most_its_share_of_the_threads_and_waits_in_order_for_more():
    """controlplane/api/handler.py's Shares: a tenant past its share waits on the loop (no thread
    held) for its own calls to end, in order; another tenant's calls go at once; a waiter that
    gives up leaves no turn behind."""
    from controlplane.api.handler import Shares

    shares, order = Shares(), []
    ours_done = asyncio.Event()

    async def call(tenant, name, hold: asyncio.Event | None = None):
        async with shares.turn(tenant, 2):
            order.append(name)
            if hold is not None:
                await hold.wait()

    first = asyncio.create_task(call("acme", "acme 1", ours_done))
    second = asyncio.create_task(call("acme", "acme 2", ours_done))
    third = asyncio.create_task(call("acme", "acme 3"))
    abandoned = asyncio.create_task(call("acme", "acme 4 (gave up)"))
    fourth = asyncio.create_task(call("acme", "acme 5"))
    await asyncio.sleep(0.05)
    assert order == ["acme 1", "acme 2"]  # two at once: the others wait
    await call("globex", "globex")  # another tenant is not held up by acme's queue
    abandoned.cancel()
    ours_done.set()
    await asyncio.gather(first, second, third, fourth)
    assert order == ["acme 1", "acme 2", "globex", "acme 3", "acme 5"]
    assert abandoned.cancelled() and not shares.held and not shares.waiting  # every turn came back
