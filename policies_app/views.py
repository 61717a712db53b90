"""The policy pages: list, versions timeline, the editor (check, save a draft), a version's
page (tests, diff, replay, publish, rollback, shadow). Viewers see everything read-only."""

import shlex

from django.contrib import messages
from django.core.exceptions import ValidationError
from django.http import JsonResponse
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.views.decorators.http import require_POST

from controlplane.decorators import tenant_view
from policies_app import floor, narrowing, selectors, services
from policies_app.decisions import decision_payload
from policies_app.document import DocumentError, json_schema, parse_yaml
from policies_app.engine import VersionRef, compile_policy, evaluate
from policies_app.forms import EditorForm, NoteForm, PolicyCreateForm, ReplayForm, TryForm
from policies_app.models import DecisionRecord
from policies_app.review import marks, review

STARTER = """# Default deny: only the commands listed here may run, with these arguments.
mode: enforce
limits: {cpus: 1, memory_mb: 512, pids: 128, disk_mb: 256, command_timeout_s: 15}
commands:
  - id: pytest
    bin: pytest
    prepend_args: ["-q"]
    deny_args: ["^-c", "^-p"]
tests:
  - request: {bin: pytest, args: ["-c", "x"]}
    expect: {allowed: false, reason_code: arg_denied}
"""


@tenant_view("read")
def policy_list(request):
    policies = selectors.policy_list(request.tenant).prefetch_related("versions")
    return render(request, "policies_app/policy_list.html",
                  {"section": "policies", "policies": policies, "form": PolicyCreateForm()})


@require_POST
@tenant_view("edit_policy")
def policy_create(request):
    form = PolicyCreateForm(request.POST)
    if form.is_valid():
        try:
            policy = services.policy_create(tenant=request.tenant, name=form.cleaned_data["name"], actor=request.user)
        except ValidationError as exc:
            form.add_error("name", exc.messages)
        else:
            return redirect("policy-edit", tenant_slug=request.tenant.slug, name=policy.name)
    policies = selectors.policy_list(request.tenant)
    return render(request, "policies_app/policy_list.html",
                  {"section": "policies", "policies": policies, "form": form}, status=400)


@tenant_view("read")
def policy_detail(request, name: str):
    policy = selectors.policy_get(request.tenant, name)
    published = policy.published_version()
    pinned = selectors.pinned_sessions(policy)
    versions = [(version, version.state(published), pinned.get(version.number, 0))
                for version in policy.versions.select_related("author")]
    history = policy.publications.select_related("version", "actor")[:50]
    return render(request, "policies_app/policy_detail.html",
                  {"section": "policies", "policy": policy, "published": published, "versions": versions,
                   "card": selectors.scorecard(published), "card_version": published,
                   "history": history, "shadow_differences": selectors.shadow_differences(policy)})


@tenant_view("edit_policy")
def policy_edit(request, name: str):
    policy = selectors.policy_get(request.tenant, name)
    published = policy.published_version()
    if request.method != "POST":
        start = policy.versions.first()
        source = start.source if start else STARTER
        added = None
        if test_from := request.GET.get("test_from"):  # "Add as a test" on a denial's page
            source, added = _with_denial_test(request, source, test_from)
        form = EditorForm(initial={"source": source})
        return _render_editor(request, policy, form, review(policy=policy, source=source), added_test=added)
    form = EditorForm(request.POST)
    if not form.is_valid():
        return _render_editor(request, policy, form, None, status=400)
    source = form.cleaned_data["source"]
    if request.POST.get("action") == "save":
        try:
            version = services.version_create(policy=policy, source=source, actor=request.user,
                                              note=form.cleaned_data["note"])
        except DocumentError:
            pass  # shown below, at their lines
        else:
            messages.success(request, f"Saved draft v{version.number}. Publishing it takes a note and passing tests.")
            return redirect("policy-version", tenant_slug=request.tenant.slug, name=name, number=version.number)
    result = review(policy=policy, source=source,
                    with_replay=request.POST.get("action") == "replay")
    return _render_editor(request, policy, form, result, status=400 if result.errors else 200,
                          published=published)


def _with_denial_test(request, source: str, decision_id: str) -> tuple[str, str | None]:
    """The source with a test that the denial's request stays refused as it was, and what was added."""
    try:
        record = DecisionRecord.objects.get(tenant=request.tenant, pk=decision_id)
    except (DecisionRecord.DoesNotExist, ValidationError):  # ValidationError: not a UUID
        messages.error(request, "No test added: there is no such denial.")
        return source, None
    try:
        return narrowing.with_denial_test(source, record), " ".join([record.request["bin"], *record.request["args"]])
    except narrowing.NotNarrowable as exc:
        messages.error(request, f"No test added: {exc}.")
        return source, None


def _render_editor(request, policy, form, result, *, status: int = 200, published=None, added_test=None):
    published = published or policy.published_version()
    return render(request, "policies_app/editor.html",
                  {"section": "policies", "policy": policy, "form": form, "review": result, "published": published,
                   "published_source": published.source if published else "", "schema": json_schema(),
                   "added_test": added_test, "try_form": TryForm(), "floor": floor.current()}, status=status)


@require_POST
@tenant_view("edit_policy")
def policy_check(request, name: str):
    """The editor's check as one types: the marks at their lines and the review panel, nothing saved."""
    policy = selectors.policy_get(request.tenant, name)
    form = EditorForm(request.POST)
    if not form.is_valid():
        return JsonResponse({"error": "invalid_request", "fields": form.errors}, status=400)
    source = form.cleaned_data["source"]
    result = review(policy=policy, source=source, with_replay=request.POST.get("replay") == "1")
    panel = render_to_string("policies_app/_review.html", {"review": result}, request=request)
    return JsonResponse({"valid": result.document is not None, "marks": marks(result, source), "panel": panel})


@require_POST
@tenant_view("edit_policy")
def policy_try(request, name: str):
    """One exec request judged by the document in the editor: a dry run, not recorded."""
    policy = selectors.policy_get(request.tenant, name)
    form = TryForm(request.POST)
    if not form.is_valid():
        return JsonResponse({"error": "invalid_request", "fields": form.errors}, status=400)
    try:
        document = parse_yaml(form.cleaned_data["source"])
        args = shlex.split(form.cleaned_data["args"])
    except DocumentError as exc:
        return JsonResponse({"error": "invalid_policy", "detail": "fix the document's errors first",
                             "errors": exc.errors}, status=400)
    except ValueError as exc:  # shlex: an unclosed quote
        return JsonResponse({"error": "invalid_request", "fields": {"args": [str(exc)]}}, status=400)
    compiled = compile_policy(document, VersionRef(policy.name, 0, document.sha256()))
    request_body = {"bin": form.cleaned_data["bin"], "args": args, "cwd": form.cleaned_data["cwd"] or "/workspace"}
    decision = evaluate(compiled, request_body)
    return JsonResponse({"request": request_body, "decision": decision_payload(decision)})


@tenant_view("read")
def version_detail(request, name: str, number: int):
    version = selectors.version_get(request.tenant, name, number)
    return render_version(request, version)


def render_version(request, version, *, note_form=None, status: int = 200, with_replay: bool = False):
    policy = version.policy
    published = policy.published_version()
    replay_limit = ReplayForm(request.POST or None)
    limit = replay_limit.cleaned_data.get("limit") if replay_limit.is_bound and replay_limit.is_valid() else None
    result = review(policy=policy, source=version.source, number=version.number,
                    with_replay=with_replay, replay_limit=limit or 10_000)
    return render(request, "policies_app/version.html", {
        "section": "policies", "policy": policy, "version": version, "published": published,
        "state": version.state(published), "review": result, "note_form": note_form or NoteForm(),
        "card": selectors.scorecard(version), "card_version": version,
        "source_lines": version.source.splitlines(),
    }, status=status)


@require_POST
@tenant_view("read")
def version_replay(request, name: str, number: int):
    version = selectors.version_get(request.tenant, name, number)
    return render_version(request, version, with_replay=True)


@require_POST
@tenant_view("publish_policy")
def version_publish(request, name: str, number: int):
    version = selectors.version_get(request.tenant, name, number)
    return _publication(request, version, lambda note: services.version_publish(
        version=version, actor=request.user, note=note), f"Published v{version.number}.",
        after=lambda: selectors.pinned_message(version.policy, version))


@require_POST
@tenant_view("publish_policy")
def version_rollback(request, name: str, number: int):
    version = selectors.version_get(request.tenant, name, number)
    outcome = {}

    def rollback(note):
        outcome["version"] = services.version_rollback(policy=version.policy, to=version, actor=request.user,
                                                       note=note)

    response = _publication(request, version, rollback, f"Rolled back to the document of v{version.number}.")
    if "version" in outcome:
        return redirect("policy-version", tenant_slug=request.tenant.slug, name=name,
                        number=outcome["version"].number)
    return response


@require_POST
@tenant_view("publish_policy")
def version_shadow(request, name: str, number: int):
    version = selectors.version_get(request.tenant, name, number)
    stop = request.POST.get("stop") == "1"
    services.policy_set_shadow(policy=version.policy, version=None if stop else version, actor=request.user)
    messages.success(request, "Shadow stopped." if stop else f"v{version.number} now runs in shadow on live traffic.")
    return redirect("policy-version", tenant_slug=request.tenant.slug, name=name, number=number)


def _publication(request, version, action, success: str, after=None):
    form = NoteForm(request.POST)
    if not form.is_valid():
        return render_version(request, version, note_form=form, status=400)
    try:
        action(form.cleaned_data["note"])
    except ValidationError as exc:
        for message in exc.messages:
            form.add_error(None, message)
        return render_version(request, version, note_form=form, status=400)
    messages.success(request, success)
    if after is not None and (note := after()):
        messages.warning(request, note)
    return redirect("policy-version", tenant_slug=request.tenant.slug, name=version.policy.name,
                    number=version.number)
