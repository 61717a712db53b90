"""The dashboard shell: home, the audit log and the tenant's settings (members and API keys)."""

import re

from django.contrib import messages
from django.contrib.auth import get_user_model
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.shortcuts import redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_POST

from controlplane import selectors, services
from controlplane.decorators import tenant_view
from controlplane.forms import ApiKeyCreateForm, AuditFilterForm, MemberAddForm, MemberRoleForm

AUDIT_PAGE_SIZE = 50


@login_required
def home(request):
    first = selectors.memberships_of(request.user).first()
    if first is None:
        return render(request, "controlplane/no_tenant.html", status=403)
    return redirect("sessions", tenant_slug=first.tenant.slug)


@tenant_view("read")
def tenant_home(request):
    """/t/<tenant>/ itself: the tenant's first page (an outsider gets 404, as everywhere)."""
    return redirect("sessions", tenant_slug=request.tenant.slug)


@tenant_view("read")
def audit(request):
    form = AuditFilterForm(request.GET or None)
    filters = form.filters() if form.is_bound and form.is_valid() else {}
    events = selectors.audit_event_list(request.tenant, **filters).select_related(None)
    page = Paginator(events, AUDIT_PAGE_SIZE).get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    return render(
        request, "controlplane/audit.html",
        {"form": form, "page": page, "query": query.urlencode(), "actions": selectors.audit_actions(request.tenant),
         "section": "audit"},
        status=400 if form.is_bound and form.errors else 200,
    )


@tenant_view("read")
def settings_page(request):
    return _render_settings(request)


def _render_settings(request, *, status: int = 200, **extra):
    context = {
        "section": "settings",
        "members": selectors.member_list(request.tenant),
        "api_keys": selectors.api_key_list(request.tenant),
        "member_form": MemberAddForm(),
        "key_form": ApiKeyCreateForm(),
        "role_choices": MemberRoleForm.base_fields["role"].choices,
        **extra,
    }
    return render(request, "controlplane/settings.html", context, status=status)


@require_POST
@tenant_view("manage_members")
def member_add(request):
    form = MemberAddForm(request.POST)
    if not form.is_valid():
        return _render_settings(request, member_form=form, status=400)
    user = get_user_model().objects.filter(username=form.cleaned_data["username"]).first()
    new_user = None
    try:
        if user is None:
            new_user = services.user_create(username=form.cleaned_data["username"], email=form.cleaned_data["email"])
            user = new_user.user
        services.membership_add(tenant=request.tenant, user=user, role=form.cleaned_data["role"], actor=request.user)
    except ValidationError as exc:
        _add_errors(form, exc)
        return _render_settings(request, member_form=form, status=400)
    if new_user is not None:
        # The password is shown once, in this response only; it is never stored in clear.
        return _render_settings(request, new_user=new_user)
    messages.success(request, f"{user.get_username()} added as {form.cleaned_data['role'].label}.")
    return redirect("settings", tenant_slug=request.tenant.slug)


@require_POST
@tenant_view("manage_members")
def member_role(request, membership_id: int):
    membership = selectors.member_get(request.tenant, membership_id)
    form = MemberRoleForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Choose one of the roles.")
        return redirect("settings", tenant_slug=request.tenant.slug)
    try:
        services.membership_set_role(membership=membership, role=form.cleaned_data["role"], actor=request.user)
    except ValidationError as exc:
        messages.error(request, "; ".join(exc.messages))
    else:
        messages.success(request, f"{membership.user.get_username()} is now {membership.role_name}.")
    return redirect("settings", tenant_slug=request.tenant.slug)


@require_POST
@tenant_view("manage_members")
def member_remove(request, membership_id: int):
    membership = selectors.member_get(request.tenant, membership_id)
    try:
        services.membership_remove(membership=membership, actor=request.user)
    except ValidationError as exc:
        messages.error(request, "; ".join(exc.messages))
    else:
        messages.success(request, f"{membership.user.get_username()} removed.")
    return redirect("settings", tenant_slug=request.tenant.slug)


@require_POST
@tenant_view("manage_api_keys")
def api_key_create(request):
    form = ApiKeyCreateForm(request.POST)
    if not form.is_valid():
        return _render_settings(request, key_form=form, status=400)
    try:
        new_key = services.api_key_create(
            tenant=request.tenant, name=form.cleaned_data["name"], scopes=form.cleaned_data["scopes"],
            expires_at=form.expires_at(), actor=request.user,
        )
    except ValidationError as exc:
        _add_errors(form, exc)
        return _render_settings(request, key_form=form, status=400)
    # Shown once, in this response only: only its hash is stored.
    return _render_settings(request, new_key=new_key)


@require_POST
@tenant_view("manage_api_keys")
def api_key_revoke(request, key_id):
    api_key = selectors.api_key_get(request.tenant, key_id)
    services.api_key_revoke(api_key=api_key, actor=request.user)
    messages.success(request, f"Key {api_key.name} revoked.")
    return redirect("settings", tenant_slug=request.tenant.slug)


def _add_errors(form, exc: ValidationError) -> None:
    if hasattr(exc, "error_dict"):
        for field, errors in exc.error_dict.items():
            target = field if field in form.fields else None
            for error in errors:
                form.add_error(target, error.messages)
    else:
        form.add_error(None, exc.messages)


# Django's reasons for a refusal that a form of this site can meet (the origin matched): the form's
# token went stale when its tab's login was renewed, or the cookie went with the session.
STALE_TOKEN = ("CSRF token", "CSRF cookie")
# Fields a retry never writes into a page: a credential stays out of HTML, caches and history.
NEVER_ECHOED = re.compile(r"password|secret|token|key", re.IGNORECASE)


@never_cache
def csrf_failure(request, reason: str = ""):
    """A form whose security token was refused (settings.CSRF_FAILURE_VIEW). When the request came
    from this site's own page, only its token is stale and the person is signed in, the page
    offers to send the same form again with a fresh token, on a click; never a form that carries
    a credential (the login's), which is to be typed again. A request from another site (its
    origin or referer did not match) is only explained, never offered again."""
    stale = any(reason.startswith(prefix) for prefix in STALE_TOKEN) and _from_this_site(request)
    retry = stale and request.user.is_authenticated and not any(NEVER_ECHOED.search(name) for name in request.POST
                                                                 if name != "csrfmiddlewaretoken")
    fields = [(name, value) for name, values in request.POST.lists() if name != "csrfmiddlewaretoken"
              for value in values] if retry else []
    return render(request, "controlplane/csrf_failure.html", {
        "stale": stale, "retry": retry, "fields": fields, "action": request.get_full_path(),
        "signed_in": request.user.is_authenticated,
    }, status=403)


def _from_this_site(request) -> bool:
    origin = request.headers.get("Origin") or request.headers.get("Referer") or ""
    own = f"{request.scheme}://{request.get_host()}"
    return origin == own or origin.startswith(own + "/")
