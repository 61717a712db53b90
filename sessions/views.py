"""The operator dashboard: the tenant's live sessions, one session's live terminal, Kill, and
the operations metrics."""


from django.conf import settings
from django.contrib import messages
from django.core.paginator import Paginator
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from controlplane.decorators import tenant_view
from policies_app.denials import PERIODS
from policies_app.rollups import by_hour
from sessions import lifecycle, selectors
from sessions.metrics import tenant_metrics, warm_pools
from sessions.models import SessionState

STATE_FILTERS = ["active", *SessionState.values]


@tenant_view("read")
def session_list(request):
    conversation_id = request.GET.get("conversation_id", "").strip()[:200]
    state = request.GET.get("state", "")
    state = state if state in STATE_FILTERS else ""
    sessions = selectors.session_search(request.tenant, conversation_id=conversation_id, state=state)
    page = Paginator(sessions.prefetch_related("commands"), 50).get_page(request.GET.get("page"))
    return render(request, "sessions/session_list.html", {
        "section": "sessions", "page": page, "conversation_id": conversation_id, "state": state,
        "states": STATE_FILTERS, "query": request.GET.urlencode(),
    })


@tenant_view("read")
def session_detail(request, session_id):
    session = selectors.session_get(request.tenant, session_id)
    return render(request, "sessions/session_detail.html", {
        "section": "sessions", "session": session, "commands": selectors.command_list(session),
        "decisions": selectors.session_decisions(session)[:500],
    })


@require_POST
@tenant_view("kill_session")
def session_kill(request, session_id):
    session = selectors.session_get(request.tenant, session_id)
    try:
        lifecycle.session_stop(session=session, state=SessionState.KILLED, actor=request.user,
                               reason=f"killed by {request.user.get_username()}", wait=False)
        messages.success(request, "The session was killed; its runner is destroying the sandbox.")
    except lifecycle.LifecycleError as exc:
        messages.error(request, exc.detail)
    return redirect("session", request.tenant.slug, session.pk)


@require_POST
@tenant_view("kill_session")
def sessions_kill_bulk(request):
    conversation_id = request.POST.get("conversation_id", "").strip()[:200]
    everything = request.POST.get("scope") == "tenant"
    if not conversation_id and not everything:
        messages.error(request, "Give a conversation id, or choose every active session of the tenant.")
        return redirect("sessions", request.tenant.slug)
    killed = lifecycle.sessions_kill_bulk(
        tenant=request.tenant, conversation_id=None if everything else conversation_id, actor=request.user,
        reason=f"bulk kill by {request.user.get_username()}" + ("" if everything else f" of {conversation_id}"),
    )
    messages.success(request, f"Killed {killed} session{'s' if killed != 1 else ''}.")
    return redirect("sessions", request.tenant.slug)


@tenant_view("read")
def metrics_page(request):
    """Operations metrics (S10) for one period, with charts."""
    period = request.GET.get("period") or "24h"
    if period not in PERIODS:
        return render(request, "sessions/metrics.html", {
            "section": "metrics", "periods": PERIODS, "period": period,
            "error": f"period must be one of {', '.join(PERIODS)}"}, status=400)
    now = timezone.now()
    figures = tenant_metrics(request.tenant, now - PERIODS[period], now)
    hourly = by_hour(now - PERIODS[period], now)
    charts = {
        "starts": {"labels": [b["at"].strftime("%m-%d %H:00" if hourly else "%Y-%m-%d")
                              for b in figures.starts_over_time],
                   "sessions": [b["sessions"] for b in figures.starts_over_time],
                   "p95_ms": [b["p95_ms"] for b in figures.starts_over_time], "unit": "hour" if hourly else "day"},
        "denials": {"labels": list(figures.denials_by_reason), "counts": list(figures.denials_by_reason.values())},
        "states": {"labels": list(figures.sessions_by_state), "counts": list(figures.sessions_by_state.values())},
    }
    return render(request, "sessions/metrics.html", {
        "section": "metrics", "periods": PERIODS, "period": period, "m": figures, "charts": charts,
        "pools": warm_pools(), "currency": settings.AIRLOCK_COST_CURRENCY,
        "rates": {"cpu": settings.AIRLOCK_COST_PER_CPU_SECOND, "mb_hour": settings.AIRLOCK_COST_PER_MB_HOUR},
    })
