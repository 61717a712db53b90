"""How the server reaches runners: one way for all of them, this process's own included. A
message goes to the runner's channel on the channel layer; a call waits for the reply on a
channel of its own (docs/architecture.md, "Runner")."""

import asyncio
import logging
import time
from dataclasses import dataclass
from datetime import timedelta

from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.conf import settings
from django.db.models import Count, Q, Sum
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


@dataclass(frozen=True)
class Placement:
    runner_id: str
    # What the live runners may reserve in all (a tenant's share of it: sessions/admission.py).
    # Read before the tenant's transaction: runners come and go far more rarely than sessions,
    # and the transaction holds the writer's turn.
    runners_mb: int


def runner_pick(reserve_mb: int = 0) -> Placement:
    """The live runner with the fewest active sessions among those whose memory has room for
    `reserve_mb` more (sessions/admission.py), and what every live runner may reserve: one
    query. An in-memory channel layer reaches only this process's own runner."""
    fresh = timezone.now() - timedelta(seconds=settings.AIRLOCK_RUNNER_DEAD_AFTER_S)
    active = Q(sessions__state__in=ACTIVE_STATES)
    live = list(Runner.objects.filter(stopped_at__isnull=True, heartbeat_at__gte=fresh)
                .annotate(active=Count("sessions", filter=active),
                          reserved=Coalesce(Sum("sessions__reserved_mb", filter=active), 0))
                .values_list("pk", "memory_mb", "heartbeat_at", "active", "reserved"))
    reachable = live
    if isinstance(get_channel_layer(), InMemoryChannelLayer):
        local = local_runner()
        reachable = [runner for runner in live if local is not None and runner[0] == local.id]
    room = [runner for runner in reachable if runner[4] <= runner[1] - reserve_mb]
    if not room:
        if not reachable:
            raise NoRunner("no runner is alive: the server starts its own unless AIRLOCK_EMBEDDED_RUNNER=0; "
                           "otherwise start one with `manage.py runner`")
        raise NoCapacity(f"no runner has {reserve_mb} MB of memory left for this session's limits (its policy's "
                         f"memory_mb and disk_mb, and /tmp): the runners' sessions reserve all of their "
                         f"AIRLOCK_RUNNER_MEMORY_MB; end a session, or add a runner")
    chosen = min(room, key=lambda runner: (runner[3], -runner[2].timestamp()))
    return Placement(runner_id=chosen[0], runners_mb=sum(runner[1] for runner in live))


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
