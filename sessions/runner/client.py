"""How the server reaches runners: one way for all of them, this process's own included. A
message goes to the runner's channel on the channel layer; a call waits for the reply on a
channel of its own (docs/architecture.md, "Runner")."""

import asyncio
import logging
import time
from datetime import timedelta

from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.conf import settings
from django.db.models import Count, F, Q, Sum
from django.db.models.functions import Coalesce
from django.utils import timezone

from sessions import layer
from sessions.models import ACTIVE_STATES, Runner, runner_channel
from sessions.runner import local_runner

log = logging.getLogger("airlock.runner")
HAND_OVER_S = 10  # beyond the call's own timeout: how long reaching the layer's loop may take


class NoRunner(Exception):
    pass


class NoCapacity(Exception):
    pass


def runner_pick(reserve_mb: int = 0) -> Runner:
    """The live runner with the fewest active sessions among those whose memory has room for
    `reserve_mb` more (sessions/admission.py). An in-memory channel layer reaches only this
    process's own runner."""
    fresh = timezone.now() - timedelta(seconds=settings.AIRLOCK_RUNNER_DEAD_AFTER_S)
    runners = Runner.objects.filter(stopped_at__isnull=True, heartbeat_at__gte=fresh)
    if isinstance(get_channel_layer(), InMemoryChannelLayer):
        local = local_runner()
        runners = runners.filter(pk=local.id if local else None)
    active = Q(sessions__state__in=ACTIVE_STATES)
    runners = runners.annotate(active=Count("sessions", filter=active),
                               reserved=Coalesce(Sum("sessions__reserved_mb", filter=active), 0))
    runner = runners.filter(reserved__lte=F("memory_mb") - reserve_mb).order_by("active", "-heartbeat_at").first()
    if runner is None:
        busiest = runners.order_by("-reserved").first()
        if busiest is None:
            raise NoRunner("no runner is alive: the server starts its own unless AIRLOCK_EMBEDDED_RUNNER=0; "
                           "otherwise start one with `manage.py runner`")
        raise NoCapacity(f"no runner has {reserve_mb} MB of memory left for this session's limits (its policy's "
                         f"memory_mb and disk_mb, and /tmp): the runners' sessions reserve all of their "
                         f"AIRLOCK_RUNNER_MEMORY_MB; end a session, or add a runner")
    return runner


def runner_call(runner_id: str, message: dict, *, timeout_s: float) -> dict:
    """Send a message to a runner and wait for its reply (at most timeout_s)."""
    try:
        return layer.run(lambda: _call(runner_id, message, timeout_s), timeout_s + HAND_OVER_S)
    except TimeoutError:  # the loop never took it (then it never leaves), or the layer hung
        return {"ok": False, "error": "runner_unreachable",
                "detail": f"the message could not be handed to the channel layer within {timeout_s + HAND_OVER_S:g} s"}


def runner_send(runner_id: str, message: dict) -> bool:
    """Send a message to a runner without waiting for what it does; False if it could not leave."""
    try:
        layer.run(lambda: get_channel_layer().send(runner_channel(runner_id), message), HAND_OVER_S)
    except Exception:
        log.exception("could not send %s to runner %s", message.get("type"), runner_id)
        return False
    return True


async def _call(runner_id: str, message: dict, timeout_s: float) -> dict:
    channel_layer = get_channel_layer()
    try:
        reply_to = await channel_layer.new_channel("airlock.reply.")
        # The runner drops a reply past reply_by: a late one would wait for nobody (forever, in
        # channels_redis's receive buffer).
        await channel_layer.send(runner_channel(runner_id), {**message, "reply_to": reply_to,
                                                            "reply_by": time.time() + timeout_s})
        reply = await asyncio.wait_for(channel_layer.receive(reply_to), timeout_s)
    except TimeoutError:
        return _timed_out(timeout_s)
    except Exception as exc:  # the channel layer (Redis) failed: say so, do not answer 500
        return {"ok": False, "error": "runner_unreachable", "detail": f"the channel layer failed: {exc}"[:300]}
    reply.pop("type", None)
    return reply


def _timed_out(timeout_s: float) -> dict:
    return {"ok": False, "error": "runner_timeout", "detail": f"the runner did not answer within {timeout_s:g} s"}
