"""The operator dashboard: the tenant's live sessions, one session's live terminal, Kill, a
conversation's sessions, snapshots and artifacts (Verify, Download, Delete), and the operations
metrics."""


from django.conf import settings
from django.contrib import messages
from django.core.paginator import Paginator
from django.db.models import F
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from controlplane.decorators import tenant_view
from policies_app import selectors as policy_selectors
from policies_app.denials import PERIODS
from policies_app.rollups import by_hour
from sessions import admission, lifecycle, selectors, services
from sessions.evals import background, suite
from sessions.metrics import tenant_metrics, warm_pools
from sessions.models import Artifact, SessionState, Snapshot
from sessions.persistence import services as persistence
from sessions.persistence.responses import archive_response

STATE_FILTERS = ["active", *SessionState.values]
# The list's orders, by a column's name (`-name`: the other way): the field, and whether it runs
# from the highest (newest, busiest) down. Sessions without a figure come last either way.
SORTS = {"age": ("created_at", True), "state": ("state", False), "conversation": ("conversation_id", False),
         "cpu": ("cpu_s", True), "memory": ("memory_bytes", True)}


@tenant_view("read")
def session_list(request):
    conversation_id = request.GET.get("conversation_id", "").strip()[:200]
    state = request.GET.get("state", "")
    state = state if state in STATE_FILTERS else ""
    sort = request.GET.get("sort", "age")
    sort = sort if sort.lstrip("-") in SORTS else "age"
    field, descending = SORTS[sort.lstrip("-")]
    column = F(field).desc(nulls_last=True) if descending != sort.startswith("-") else F(field).asc(nulls_last=True)
    sessions = selectors.session_search(request.tenant, conversation_id=conversation_id, state=state)
    sessions = sessions.order_by(column, "-created_at")
    page = Paginator(sessions.prefetch_related("commands"), 50).get_page(request.GET.get("page"))
    kept = request.GET.copy()
    kept.pop("page", None)
    kept.pop("sort", None)
    return render(request, "sessions/session_list.html", {
        "section": "sessions", "page": page, "conversation_id": conversation_id, "state": state,
        "states": STATE_FILTERS, "sort": sort, "filters": kept.urlencode(),
        "query": f"{kept.urlencode()}&sort={sort}".lstrip("&"),
    })


@tenant_view("read")
def session_detail(request, session_id):
    session = selectors.session_get(request.tenant, session_id)
    response = render(request, "sessions/session_detail.html", {
        "section": "sessions", "session": session, "commands": selectors.command_list(session),
        "decisions": selectors.session_decisions(session)[:500],
    })
    response.terminal_styles = True  # xterm.js colours truecolour cells by attribute (controlplane/security.py)
    return response


@require_POST
@tenant_view("publish_policy")
def version_eval(request, name: str, number: int):
    """Run the containment eval (sessions/evals/) on this version, on the driver its sessions run on."""
    version = policy_selectors.version_get(request.tenant, name, number)
    driver = services.driver_of(version)[0]
    if why := suite.refusal(version, driver):
        messages.error(request, f"The containment eval cannot run: {why}.")
    elif background.start(tenant=request.tenant, version=version, driver=driver):
        messages.info(request, f"The containment eval of v{version.number} on {driver} is running (about 10 to 30 "
                      "seconds): reload this page to see its scorecard.")
    else:
        messages.info(request, f"An eval of v{version.number} on {driver} is already running.")
    return redirect("policy-version", request.tenant.slug, name, number)


@tenant_view("read")
def session_output(request, session_id):
    """What is stored of the session's commands' output (each one's tail, redacted), as a text file."""
    session = selectors.session_get(request.tenant, session_id)
    parts = []
    for command in selectors.command_list(session):
        parts.append(f"$ {' '.join(command.argv)}\n")
        if command.truncated:
            parts.append("[… earlier output cut: only the last part is stored]\n")
        output = command.output or ""
        parts.append(output)
        if command.finished:
            exit_code = "—" if command.exit_code is None else command.exit_code
            if output and not output.endswith("\n"):
                parts.append("\n")
            parts.append(f"[exit {exit_code} · {command.reason}]\n")
    response = HttpResponse("".join(parts), content_type="text/plain; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="session-{session.pk}.txt"'
    return response


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
        "rates": {"cpu": settings.AIRLOCK_COST_PER_CPU_SECOND, "mb_hour": settings.AIRLOCK_COST_PER_MB_HOUR,
                  "gb_month": settings.AIRLOCK_COST_PER_GB_MONTH},
    })


PACKED = {"snapshots": Snapshot, "artifacts": Artifact}


@tenant_view("read")
def conversation(request, conversation_id: str):
    """A conversation's sessions, and the snapshots and artifacts they left, with their provenance."""
    conversation_id = conversation_id[:200]
    tenant = request.tenant
    return render(request, "sessions/conversation.html", {
        "section": "sessions", "conversation_id": conversation_id,
        "sessions": selectors.session_search(tenant, conversation_id=conversation_id)[:200],
        "snapshots": Snapshot.objects.filter(tenant=tenant, conversation_id=conversation_id)[:200],
        "artifacts": Artifact.objects.filter(tenant=tenant, conversation_id=conversation_id)[:200],
    })


def _packed(request, kind: str, object_id):
    if kind not in PACKED:
        raise Http404
    row = PACKED[kind].objects.filter(tenant=request.tenant, pk=object_id).select_related("tenant").first()
    if row is None:
        raise Http404(f"no such {kind[:-1]}")
    return row


@require_POST
@tenant_view("read")
def packed_verify(request, kind: str, object_id):
    row = _packed(request, kind, object_id)
    try:
        result = persistence.verify(row)
    except admission.Refused as exc:
        messages.error(request, f"Not verified now: {exc.detail}")
        return redirect("conversation", request.tenant.slug, row.conversation_id)
    if result["valid"]:
        messages.success(request, f"{kind[:-1].capitalize()} {row.pk} is valid: {result['detail']}.")
    else:
        messages.error(request, f"{kind[:-1].capitalize()} {row.pk} is invalid ({result['reason_code']}, "
                       f"{result['check']}): {result['detail']}")
    return redirect("conversation", request.tenant.slug, row.conversation_id)


@tenant_view("download_artifact")
def packed_download(request, kind: str, object_id):
    row = _packed(request, kind, object_id)
    try:
        archive = persistence.download(row)
    except admission.Refused as exc:
        messages.error(request, f"Not downloaded now: {exc.detail}")
        return redirect("conversation", request.tenant.slug, row.conversation_id)
    except persistence.ProvenanceError as exc:
        messages.error(request, f"Not downloaded: it fails a check ({exc.reason_code}, {exc.rule_id}): {exc.message}")
        return redirect("conversation", request.tenant.slug, row.conversation_id)
    return archive_response(row, kind, archive)


@require_POST
@tenant_view("delete_artifact")
def packed_delete(request, kind: str, object_id):
    row = _packed(request, kind, object_id)
    persistence.delete(row, actor=request.user, why=f"deleted by {request.user.get_username()}")
    messages.success(request, f"Deleted {kind[:-1]} {row.pk}.")
    return redirect("conversation", request.tenant.slug, row.conversation_id)
