"""Readiness of the real parts Airlock depends on: the database and the channel layer."""

import asyncio
import time

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import connection

CHANNEL_TIMEOUT_S = 2.0


def health_report() -> dict:
    checks = {"database": _check_database(), "channel_layer": async_to_sync(_check_channel_layer)()}
    return {"ok": all(check["ok"] for check in checks.values()), "checks": checks}


def _check_database() -> dict:
    started = time.perf_counter()
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except Exception as exc:
        return {"ok": False, "error": type(exc).__name__}
    return {"ok": True, "vendor": connection.vendor, "ms": _ms_since(started)}


async def _check_channel_layer() -> dict:
    layer = get_channel_layer()
    started = time.perf_counter()
    try:
        channel = await layer.new_channel("health.")
        await layer.send(channel, {"type": "health.ping"})
        message = await asyncio.wait_for(layer.receive(channel), CHANNEL_TIMEOUT_S)
    except Exception as exc:
        return {"ok": False, "error": type(exc).__name__}
    return {"ok": message.get("type") == "health.ping", "backend": type(layer).__name__, "ms": _ms_since(started)}


def _ms_since(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 2)
