"""The policy API: policies, versions, publish, rollback, shadow, replay and a dry-run
evaluate. Every object is found through the tenant-scoped selectors of the calling key."""

from dataclasses import asdict
from datetime import timedelta

from django.shortcuts import get_object_or_404
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.decorators import api_view, permission_classes
from rest_framework.response import Response

from controlplane.api.permissions import HasScope
from policies_app import selectors, services
from policies_app.api import serializers as s
from policies_app.decisions import compiled_version, decide, decision_payload, replay
from policies_app.denials import DenialFilter
from policies_app.denials import summary as denial_summary
from policies_app.document import DocumentError, json_schema
from policies_app.exceptions import exception_from_denial, exception_grant, exception_grant_egress, exception_list
from policies_app.exceptions import exception_revoke as revoke
from policies_app.insights import insights
from policies_app.lint import lint
from policies_app.models import DecisionRecord, Policy
from policies_app.review import review

READ = [HasScope.of("policies:read")]
WRITE = [HasScope.of("policies:write")]


def _tenant(request):
    return request.user.tenant


def _valid(serializer_class, request):
    serializer = serializer_class(data=request.data)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


def _document_errors(exc: DocumentError) -> Response:
    return Response({"error": "invalid_policy", "detail": str(exc), "errors": exc.errors},
                    status=status.HTTP_400_BAD_REQUEST)


def _version_body(version) -> dict:
    published = version.policy.published_version()
    body = s.VersionSerializer(version, context={"published": published}).data
    body["lint"] = [asdict(warning) for warning in lint(services.version_document(version))]
    body["containment"] = [  # its newest containment eval on each driver (sessions/evals/)
        {"driver": score.driver, "passed": score.passed, "created_at": score.created_at.isoformat(),
         "airlock_version": score.airlock_version, "eval_version": score.eval_version, "seconds": score.seconds,
         "results": score.results} for score in selectors.scorecard(version)["scores"]]
    return body


@extend_schema(methods=["GET"], responses=s.PolicySerializer(many=True))
@extend_schema(methods=["POST"], request=s.PolicyCreateSerializer, responses={201: s.PolicySerializer})
@api_view(["GET", "POST"])
@permission_classes([HasScope.by_method(read="policies:read", write="policies:write")])
def policies(request):
    if request.method == "GET":
        return Response(s.PolicySerializer(selectors.policy_list(_tenant(request)), many=True).data)
    data = _valid(s.PolicyCreateSerializer, request)
    policy = services.policy_create(tenant=_tenant(request), name=data["name"], actor=request.auth)
    return Response(s.PolicySerializer(policy).data, status=status.HTTP_201_CREATED)


@extend_schema(responses=s.PolicySerializer)
@api_view(["GET"])
@permission_classes(READ)
def policy_detail(request, name: str):
    policy = selectors.policy_get(_tenant(request), name)
    published = policy.published_version()
    body = s.PolicySerializer(policy).data
    body["versions"] = s.VersionSerializer(policy.versions.select_related("author", "parent"), many=True,
                                           context={"published": published}).data
    return Response(body)


@extend_schema(request=s.VersionCreateSerializer, responses={201: s.VersionSerializer})
@api_view(["POST"])
@permission_classes(WRITE)
def version_create(request, name: str):
    policy = selectors.policy_get(_tenant(request), name)
    data = _valid(s.VersionCreateSerializer, request)
    try:
        version = services.version_create(policy=policy, source=data["source"], actor=request.auth, note=data["note"])
    except DocumentError as exc:
        return _document_errors(exc)
    return Response(_version_body(version), status=status.HTTP_201_CREATED)


@extend_schema(responses=s.VersionSerializer)
@api_view(["GET"])
@permission_classes(READ)
def version_detail(request, name: str, number: int):
    return Response(_version_body(selectors.version_get(_tenant(request), name, number)))


@extend_schema(request=s.NoteSerializer, responses=s.VersionSerializer)
@api_view(["POST"])
@permission_classes(WRITE)
def version_publish(request, name: str, number: int):
    version = selectors.version_get(_tenant(request), name, number)
    data = _valid(s.NoteSerializer, request)
    services.version_publish(version=version, actor=request.auth, note=data["note"])
    return Response(_version_body(version))


@extend_schema(request=s.RollbackSerializer, responses={201: s.VersionSerializer})
@api_view(["POST"])
@permission_classes(WRITE)
def policy_rollback(request, name: str):
    policy = selectors.policy_get(_tenant(request), name)
    data = _valid(s.RollbackSerializer, request)
    target = selectors.version_get(_tenant(request), name, data["to"])
    version = services.version_rollback(policy=policy, to=target, actor=request.auth, note=data["note"])
    return Response(_version_body(version), status=status.HTTP_201_CREATED)


@extend_schema(request=s.ShadowSerializer, responses=s.PolicySerializer)
@api_view(["PUT"])
@permission_classes(WRITE)
def policy_shadow(request, name: str):
    policy = selectors.policy_get(_tenant(request), name)
    data = _valid(s.ShadowSerializer, request)
    version = selectors.version_get(_tenant(request), name, data["version"]) if data["version"] else None
    services.policy_set_shadow(policy=policy, version=version, actor=request.auth)
    return Response(s.PolicySerializer(policy).data)


@extend_schema(request=s.ReplaySerializer, responses=OpenApiTypes.OBJECT,
               summary="Replay recorded requests with a version: the verdicts that would flip against the published "
                       "version, grouped by rule")
@api_view(["POST"])
@permission_classes(READ)
def version_replay(request, name: str, number: int):
    version = selectors.version_get(_tenant(request), name, number)
    data = _valid(s.ReplaySerializer, request)
    result = replay(policy=version.policy, compiled=compiled_version(version), limit=data["limit"])
    return Response(asdict(result))


@extend_schema(request=s.ReviewSerializer, responses=OpenApiTypes.OBJECT,
               summary="A document checked without saving it: errors, lint, its own tests, the diff against the "
               "published version and, with `replay`, what recent requests it would judge otherwise")
@api_view(["POST"])
@permission_classes(READ)
def policy_review(request, name: str):
    """What the editor shows; the CLI's `policy lint|test|diff`. An invalid document is a 400
    `invalid_policy` with its errors at their lines, as when saving it."""
    tenant = _tenant(request)
    # A policy not created yet is reviewed too (nothing published, nothing to replay): what
    # `airlock policy publish` checks before it creates anything.
    policy = selectors.policy_list(tenant).filter(name=name).first() or Policy(tenant=tenant, name=name)
    data = _valid(s.ReviewSerializer, request)
    result = review(policy=policy, source=data["source"], with_replay=data["replay"] and policy.pk is not None)
    diff = [asdict(line) for line in result.diff]
    if result.document is None:
        return Response({"error": "invalid_policy", "detail": f"the document has {len(result.errors)} error(s)",
                         "errors": result.errors, "diff": diff}, status=status.HTTP_400_BAD_REQUEST)
    return Response({
        "sha256": result.document.sha256(), "published": result.published,
        "lint": [asdict(warning) for warning in result.warnings],
        "tests": [asdict(outcome) for outcome in result.tests], "tests_failed": result.tests_failed,
        "diff": diff, "replay": asdict(result.replay) if result.replay else None,
    })


@extend_schema(request=s.EvaluateSerializer, responses=s.DecisionSerializer)
@api_view(["POST"])
@permission_classes(READ)
def policy_evaluate(request, name: str):
    """One request judged by the published version (or `version`): a dry run, not recorded."""
    policy = selectors.policy_get(_tenant(request), name)
    data = _valid(s.EvaluateSerializer, request)
    version = selectors.version_get(_tenant(request), name, data["version"]) if data.get("version") else None
    evaluation = decide(tenant=_tenant(request), policy=policy, request=data["request"], version=version,
                        record=False, kind=data["kind"])
    return Response(decision_payload(evaluation.decision))


@extend_schema(summary="Denial metrics: totals, counts over time, top reasons, rules, programs, argument "
               "patterns, conversations and sessions", parameters=[s.DenialParams], responses=OpenApiTypes.OBJECT)
@api_view(["GET"])
@permission_classes(READ)
def denials(request):
    form = DenialFilter(request.query_params, tenant=_tenant(request))
    if not form.is_valid():
        return Response({"error": "invalid_request", "detail": "the filters are not valid", "fields": form.errors},
                        status=status.HTTP_400_BAD_REQUEST)
    query = form.query()
    summary = denial_summary(query)
    summary["insights"] = insights(query.undrilled(), form.since())
    return Response(summary)


@extend_schema(summary="JSON Schema of the policy document", responses=OpenApiTypes.OBJECT)
@api_view(["GET"])
@permission_classes(READ)
def policy_schema(request):
    return Response(json_schema())



@extend_schema(methods=["GET"], responses=s.ExceptionSerializer(many=True), summary="Exceptions, newest first")
@extend_schema(methods=["POST"], request=s.ExceptionCreateSerializer, responses={201: s.ExceptionSerializer},
               summary="Grant a temporary exception for exactly one command, or one egress host:port")
@api_view(["GET", "POST"])
@permission_classes([HasScope.by_method(read="policies:read", write="policies:write")])
def exceptions(request):
    tenant = _tenant(request)
    if request.method == "GET":
        grants = exception_list(tenant).order_by("-created_at")[:500]
        return Response(s.ExceptionSerializer(grants, many=True).data)
    data = _valid(s.ExceptionCreateSerializer, request)
    expires_at = data.get("expires_at") or timezone.now() + timedelta(seconds=data["ttl_s"])
    if "decision" in data:  # field errors (ValidationError) become a 400 in controlplane/api/errors.py
        record = get_object_or_404(DecisionRecord.objects.select_related("policy_version__policy"),
                                   pk=data["decision"], tenant=tenant, effect__in=["deny", "audit_deny"])
        grant = exception_from_denial(record=record, expires_at=expires_at, reason=data["reason"],
                                      ticket=data["ticket"], actor=request.auth)
    elif data.get("host"):
        grant = exception_grant_egress(policy=selectors.policy_get(tenant, data["policy"]), host=data["host"],
                                       port=data["port"], expires_at=expires_at, reason=data["reason"],
                                       ticket=data["ticket"], actor=request.auth)
    else:
        grant = exception_grant(policy=selectors.policy_get(tenant, data["policy"]), bin_name=data["bin"],
                                args=data["args"], cwd=data["cwd"], expires_at=expires_at, reason=data["reason"],
                                ticket=data["ticket"], actor=request.auth)
    return Response(s.ExceptionSerializer(grant).data, status=status.HTTP_201_CREATED)


@extend_schema(responses=s.ExceptionSerializer)
@api_view(["GET"])
@permission_classes(READ)
def exception_detail(request, exception_id):
    return Response(s.ExceptionSerializer(get_object_or_404(exception_list(_tenant(request)), pk=exception_id)).data)


@extend_schema(request=None, responses=s.ExceptionSerializer, summary="Revoke an exception: never honoured again")
@api_view(["POST"])
@permission_classes(WRITE)
def exception_revoke(request, exception_id):
    grant = get_object_or_404(exception_list(_tenant(request)), pk=exception_id)
    return Response(s.ExceptionSerializer(revoke(grant=grant, actor=request.auth)).data)
