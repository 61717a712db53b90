"""Artifacts and snapshots over the API (docs/architecture.md, "Persistence").

A session packs artifacts with its token (or its tenant's key); reads go through the tenant: a
key with the `sessions` scope reaches all of its tenant's, a session token those of its own
conversation. Deleting needs the tenant's key. Every lookup is scoped, so another tenant's id is
a 404 like one that does not exist."""

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import exceptions, status
from rest_framework.decorators import api_view, authentication_classes, permission_classes
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response

from controlplane.api.auth import ApiPrincipal
from controlplane.api.handler import waits_for_runner
from controlplane.audit import actor_label
from sessions import admission, broker
from sessions.api import serializers as s
from sessions.api.auth import SessionPrincipal, session_for
from sessions.api.views import AUTH, _actor, _refused
from sessions.models import Artifact, Snapshot
from sessions.persistence import services as persistence
from sessions.persistence.responses import archive_response

MODELS = {"artifacts": Artifact, "snapshots": Snapshot}


def _scope(request, model, *, write: bool = False):
    """The rows this caller may reach."""
    principal = request.user
    if isinstance(principal, ApiPrincipal) and "sessions" in principal.scopes:
        return model.objects.filter(tenant=principal.tenant).select_related("tenant")
    if isinstance(principal, SessionPrincipal) and not write:
        return model.objects.filter(tenant=principal.tenant, conversation_id=principal.session.conversation_id
                                    ).select_related("tenant")
    if isinstance(principal, SessionPrincipal):
        raise exceptions.PermissionDenied("deleting needs the tenant's API key, not a session token")
    raise exceptions.PermissionDenied("the API key lacks the scope 'sessions'")


def _get(request, kind: str, object_id, *, write: bool = False):
    row = _scope(request, MODELS[kind], write=write).filter(pk=object_id).first()
    if row is None:
        raise exceptions.NotFound(f"no such {kind[:-1]} in this tenant")
    return row


@waits_for_runner
@extend_schema(methods=["POST"], request=s.ArtifactCreateSerializer, responses={201: OpenApiTypes.OBJECT})
@extend_schema(methods=["GET"], responses=OpenApiTypes.OBJECT)
@api_view(["GET", "POST"])
@authentication_classes(AUTH)
@permission_classes([IsAuthenticated])
def session_artifacts(request, session_id):
    session = session_for(request, session_id)
    if request.method == "GET":
        rows = Artifact.objects.filter(tenant=session.tenant, session=session)
        return Response([s.packed_body(row) for row in rows])
    serializer = s.ArtifactCreateSerializer(data=request.data)
    serializer.is_valid(raise_exception=True)
    try:
        with admission.waiting_call(session.tenant):
            row = broker.artifact_pack(session=session, name=serializer.validated_data["name"],
                                       paths=serializer.validated_data["paths"], actor=actor_label(_actor(request)))
    except (broker.BrokerError, admission.Refused) as exc:
        return _refused(exc)
    return Response(s.packed_body(row, manifest=True), status=status.HTTP_201_CREATED)


CONVERSATION = OpenApiParameter("conversation_id", str, description="only this conversation's")


def _listing(kind: str):
    @extend_schema(parameters=[CONVERSATION], responses=OpenApiTypes.OBJECT, operation_id=f"{kind}_list")
    @api_view(["GET"])
    @authentication_classes(AUTH)
    @permission_classes([IsAuthenticated])
    def listing(request):
        rows = _scope(request, MODELS[kind])
        if conversation := request.query_params.get("conversation_id", "").strip():
            rows = rows.filter(conversation_id=conversation[:200])
        return Response([s.packed_body(row) for row in rows[:500]])

    return listing


def _detail(kind: str):
    @extend_schema(methods=["GET", "DELETE"], responses=OpenApiTypes.OBJECT, operation_id=f"{kind}_detail")
    @api_view(["GET", "DELETE"])
    @authentication_classes(AUTH)
    @permission_classes([IsAuthenticated])
    def detail(request, object_id):
        row = _get(request, kind, object_id, write=request.method == "DELETE")
        if request.method == "DELETE":
            persistence.delete(row, actor=_actor(request), why="deleted through the API")
            return Response(status=status.HTTP_204_NO_CONTENT)
        return Response(s.packed_body(row, manifest=True))

    return detail


def _verify(kind: str):
    @waits_for_runner  # reading and checking a blob: not on a thread of the calls that answer at once
    @extend_schema(request=None, responses=OpenApiTypes.OBJECT, operation_id=f"{kind}_verify")
    @api_view(["POST"])
    @authentication_classes(AUTH)
    @permission_classes([IsAuthenticated])
    def verify(request, object_id):
        row = _get(request, kind, object_id)
        try:
            with admission.waiting_call(row.tenant):
                return Response(persistence.verify(row))
        except admission.Refused as exc:
            return _refused(exc)

    return verify


def _download(kind: str):
    @waits_for_runner
    @extend_schema(responses={(200, "application/x-tar"): OpenApiTypes.BINARY}, operation_id=f"{kind}_download")
    @api_view(["GET"])
    @authentication_classes(AUTH)
    @permission_classes([IsAuthenticated])
    def download(request, object_id):
        row = _get(request, kind, object_id)
        try:
            with admission.waiting_call(row.tenant):
                archive = persistence.download(row)
        except admission.Refused as exc:
            return _refused(exc)
        except persistence.ProvenanceError as exc:  # never hand out bytes that fail a check
            return Response({"error": exc.reason_code, "detail": exc.message, "check": exc.rule_id},
                            status=status.HTTP_409_CONFLICT)
        return archive_response(row, kind, archive)

    return download


views = {kind: {"list": _listing(kind), "detail": _detail(kind), "verify": _verify(kind), "download": _download(kind)}
         for kind in MODELS}
