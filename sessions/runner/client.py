"""How the server (synchronous views) reaches runners: this process's own runner directly, on
its event loop; any other through its channel on the channel layer (Redis)."""

import asyncio
import logging
from datetime import timedelta

from asgiref.sync import async_to_sync
from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.conf import settings
from django.db.models import Count, Q
from django.utils import timezone

from sessions.models import ACTIVE_STATES, Runner, runner_channel
from sessions.runner import local_runner

log = logging.getLogger("airlock.runner")


class NoRunner(Exception):
    pass


def runner_pick() -> Runner:
    """The live runner with the fewest active sessions. With the in-memory channel layer only
    this process's own runner can be reached."""
    local = local_runner()
    fresh = timezone.now() - timedelta(seconds=settings.AIRLOCK_RUNNER_DEAD_AFTER_S)
    runners = Runner.objects.filter(stopped_at__isnull=True, heartbeat_at__gte=fresh)
    if isinstance(get_channel_layer(), InMemoryChannelLayer):
        runners = runners.filter(pk=local.id if local else None)
    runner = (runners.annotate(active=Count("sessions", filter=Q(sessions__state__in=ACTIVE_STATES)))
              .order_by("active", "-heartbeat_at").first())
    if runner is None:
        raise NoRunner("no runner is alive: the server starts its own unless AIRLOCK_EMBEDDED_RUNNER=0; "
                       "otherwise start one with `manage.py runner`")
    return runner


def runner_call(runner_id: str, message: dict, *, timeout_s: float) -> dict:
    """Send a message to a runner and wait for its reply (at most timeout_s)."""
    local = local_runner()
    if local is not None and local.id == runner_id:
        future = asyncio.run_coroutine_threadsafe(local.handle(message), local.loop)
        try:
            return future.result(timeout_s)
        except TimeoutError:
            return _timed_out(timeout_s)
    return async_to_sync(_call_remote)(runner_id, message, timeout_s)


def runner_send(runner_id: str, message: dict) -> bool:
    """Send a message to a runner without waiting for what it does; False if it could not leave."""
    local = local_runner()
    if local is not None and local.id == runner_id:
        asyncio.run_coroutine_threadsafe(local.handle(message), local.loop)
        return True
    try:
        async_to_sync(get_channel_layer().send)(runner_channel(runner_id), message)
    except Exception:
        log.exception("could not send %s to runner %s", message.get("type"), runner_id)
        return False
    return True


async def _call_remote(runner_id: str, message: dict, timeout_s: float) -> dict:
    layer = get_channel_layer()
    try:
        reply_to = await layer.new_channel("airlock.reply.")
        await layer.send(runner_channel(runner_id), {**message, "reply_to": reply_to})
        reply = await asyncio.wait_for(layer.receive(reply_to), timeout_s)
    except TimeoutError:
        return _timed_out(timeout_s)
    except Exception as exc:  # the channel layer (Redis) failed: say so, do not answer 500
        return {"ok": False, "error": "runner_unreachable", "detail": f"the channel layer failed: {exc}"[:300]}
    reply.pop("type", None)
    return reply


def _timed_out(timeout_s: float) -> dict:
    return {"ok": False, "error": "runner_timeout", "detail": f"the runner did not answer within {timeout_s:g} s"}
