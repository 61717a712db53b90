"""The Denials page: counts over time, by reason, rule, program, argument pattern,
conversation and session; filters; drill-down to one decision; CSV and JSON export."""

import csv
import json
from datetime import timedelta

from django.contrib import messages
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.db.models import Q
from django.http import Http404, StreamingHttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from controlplane.decorators import tenant_view
from policies_app import denials as metrics
from policies_app import exceptions, insights, narrowing
from policies_app.document import DocumentError
from policies_app.exceptions import exception_from_denial, exception_list
from policies_app.forms import LIFETIMES, AllowThisForm, ExceptionForm
from policies_app.models import DecisionRecord, PolicyVersion
from policies_app.views import render_version


@tenant_view("read")
def denials(request):
    form = metrics.DenialFilter(request.GET or {"period": "24h", "mode": "enforce"}, tenant=request.tenant)
    if not form.is_valid():
        return render(request, "policies_app/denials.html", {"section": "denials", "form": form}, status=400)
    query = form.query()
    export = request.GET.get("format")
    if export in {"csv", "json"}:
        return _export(query, export, request.tenant.slug)
    summary = metrics.summary(query)
    insight = insights.insights(query.undrilled(), form.since())
    page = Paginator(metrics.latest(query, form.cleaned_data.get("q") or ""), 50).get_page(request.GET.get("page"))
    chart = {"labels": [b["at"].strftime("%m-%d %H:00" if query.hourly else "%Y-%m-%d") for b in summary["over_time"]],
             "counts": [b["count"] for b in summary["over_time"]], "unit": "hour" if query.hourly else "day"}
    versions = PolicyVersion.objects.filter(policy__tenant=request.tenant).select_related("policy").order_by(
        "policy__name", "-number")
    return render(request, "policies_app/denials.html", {
        "section": "denials", "form": form, "summary": summary, "insights": insight, "page": page, "chart": chart,
        "versions": versions, "query_string": _query(request.GET), "drill": _drill_links(request.GET),
        "drilled": [(name, form.cleaned_data[name], _query(request.GET, name)) for name in DRILLED
                    if form.cleaned_data.get(name)],
    })


DRILLED = ("rule", "subject", "pattern", "conversation", "session")  # filters a breakdown's row sets


def _query(params, *without: str) -> str:
    """The page's query string, without the page number (and the keys named)."""
    kept = params.copy()
    for key in ("page", "format", *without):
        kept.pop(key, None)
    return kept.urlencode()


def _drill_links(params) -> dict[str, str]:
    """For each breakdown: the query string its rows add their value to (the same filters, that
    dimension's own replaced)."""
    return {dimension: _query(params, dimension) for dimension in metrics.DRILL}


def _export(query: metrics.DenialQuery, kind: str, tenant_slug: str) -> StreamingHttpResponse:
    rows = metrics.export_rows(query)
    if kind == "csv":
        response = StreamingHttpResponse(_csv_lines(rows), content_type="text/csv; charset=utf-8")
    else:
        response = StreamingHttpResponse(_json_chunks(rows), content_type="application/json")
    response["Content-Disposition"] = f'attachment; filename="denials-{tenant_slug}.{kind}"'
    return response


class _Echo:
    def write(self, value: str) -> str:
        return value


def _csv_lines(rows):
    writer = csv.DictWriter(_Echo(), fieldnames=metrics.EXPORT_FIELDS)
    yield writer.writeheader()
    for row in rows:
        # A cell starting with = + - @ would be a formula to a spreadsheet: quote it as text.
        yield writer.writerow({key: _spreadsheet_safe(value) for key, value in row.items()})


FORMULA_STARTS = {"=", "+", "-", "@", "\t", "\r", "\n", "\uff1d", "\uff0b", "\uff0d", "\uff20"}  # full-width too


def _spreadsheet_safe(value):
    if isinstance(value, list):
        value = " ".join(map(str, value))
    if isinstance(value, str) and value[:1] in FORMULA_STARTS:
        return "'" + value
    return value


def _json_chunks(rows):
    yield "["
    for index, row in enumerate(rows):
        yield ("," if index else "") + json.dumps(row)
    yield "]"


def _denial(request, decision_id) -> DecisionRecord:
    record = get_object_or_404(DecisionRecord.objects.select_related("policy_version__policy"),
                               pk=decision_id, tenant=request.tenant)
    if record.effect == "allow":
        raise Http404("not a denial")
    return record


@tenant_view("read")
def denial_detail(request, decision_id):
    return _render_denial(request, _denial(request, decision_id))


def _render_denial(request, record: DecisionRecord, exception_form: ExceptionForm | None = None, status: int = 200):
    return render(request, "policies_app/denial_detail.html", {
        "section": "denials", "record": record, "not_narrowable": narrowing.why_not(record),
        "newer": narrowing.newer_verdicts(record),
        "testable": record.kind == "exec" and record.reason_code in narrowing.TESTABLE and record.policy_version_id,
        "request_json": json.dumps(record.request, indent=2, ensure_ascii=False),
        "allow_form": AllowThisForm(), "exception_form": exception_form or ExceptionForm(),
        "exceptions": exception_list(request.tenant).filter(from_decision=record.pk)}, status=status)


def _lifetime(key: str | None):
    return timezone.now() + timedelta(hours=LIFETIMES[key]) if key else None


@require_POST
@tenant_view("edit_policy")
def denial_allow(request, decision_id):
    """"Allow this": draft the narrowest rule and show the draft with its replay. Never publishes."""
    record = _denial(request, decision_id)
    form = AllowThisForm(request.POST)
    try:
        if not form.is_valid():
            raise narrowing.NotNarrowable("choose when the rule expires, or never")
        version = narrowing.draft_allowing(record=record, actor=request.user,
                                           expires=_lifetime(form.cleaned_data["expires"]))
    except narrowing.DraftExists as exc:
        messages.info(request, f"v{exc.version.number} is already this draft (nothing new was saved): read its "
                      "replay, then publish it.")
        return redirect("policy-version", request.tenant.slug, exc.version.policy.name, exc.version.number)
    except (narrowing.NotNarrowable, DocumentError) as exc:
        messages.error(request, f"Cannot draft a rule for this denial: {exc}")
        return redirect("denial", request.tenant.slug, record.pk)
    messages.success(request, f"Drafted v{version.number} with the narrowest rule. Its replay is below: check what "
                     "else it would allow, then publish it (nothing is published by itself).")
    return render_version(request, version, with_replay=True, status=201)


@require_POST
@tenant_view("edit_policy")
def denial_except(request, decision_id):
    """Grant a temporary exception for exactly this denied command."""
    record = _denial(request, decision_id)
    form = ExceptionForm(request.POST)
    if form.is_valid():
        try:
            grant = exception_from_denial(record=record, expires_at=_lifetime(form.cleaned_data["lifetime"]),
                                          reason=form.cleaned_data["reason"], ticket=form.cleaned_data["ticket"],
                                          actor=request.user)
        except ValidationError as exc:
            for field, errors in exc.message_dict.items():
                form.add_error(field if field in form.fields else None, errors)
        else:
            messages.success(request, f"Exception {grant.short_id} allows exactly `{grant.command}` until "
                             f"{grant.expires_at:%Y-%m-%d %H:%M} UTC. Each use is counted below.")
            return redirect("exceptions", request.tenant.slug)
    return _render_denial(request, record, form, status=400)


@tenant_view("read")
def exception_page(request):
    grants = exception_list(request.tenant).order_by("-created_at")
    state = request.GET.get("state", "")
    now = timezone.now()
    if state == "active":
        grants = grants.filter(revoked_at__isnull=True, expires_at__gt=now)
    elif state == "ended":
        grants = grants.filter(Q(revoked_at__isnull=False) | Q(expires_at__lte=now))
    page = Paginator(grants, 50).get_page(request.GET.get("page"))
    return render(request, "policies_app/exceptions.html", {
        "section": "exceptions", "page": page, "state": state, "query": f"state={state}" if state else ""})


@require_POST
@tenant_view("edit_policy")
def exception_revoke(request, exception_id):
    grant = get_object_or_404(exception_list(request.tenant), pk=exception_id)
    exceptions.exception_revoke(grant=grant, actor=request.user)
    messages.success(request, f"Exception {grant.short_id} is revoked: `{grant.command}` is judged by the rules "
                     "alone again.")
    return redirect("exceptions", request.tenant.slug)
