"""The agent-facing session API (docs/architecture.md, "API"). Tenant API keys (scope `sessions`) create
sessions; the session token returned reaches that one session until it ends."""

import contextlib

from django.conf import settings
from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework import exceptions, status
from rest_framework.decorators import api_view, authentication_classes, parser_classes, permission_classes
from rest_framework.parsers import BaseParser
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response

from controlplane.api.auth import ApiKeyAuthentication, ApiPrincipal
from controlplane.api.handler import waits_for_runner
from controlplane.api.validation import validated
from controlplane.audit import actor_label
from policies_app.api.serializers import exec_request
from sessions import admission, broker, lifecycle
from sessions.api import serializers as s
from sessions.api.auth import SessionTokenAuthentication, session_for
from sessions.models import SessionState
from sessions.selectors import command_get, command_list, session_search

AUTH = [SessionTokenAuthentication, ApiKeyAuthentication]


def _refused(exc: lifecycle.LifecycleError | admission.Refused) -> Response:
    body = {"error": exc.code, "detail": exc.detail}
    if exc.decision is not None:
        body["decision"] = exc.decision
    response = Response(body, status=exc.status)
    if exc.status == 429:
        response["Retry-After"] = "1"
    return response


def _actor(request):
    return request.auth if isinstance(request.user, ApiPrincipal) else str(request.user)


class RawBodyParser(BaseParser):
    """A workspace file's bytes, whatever their type, up to AIRLOCK_MAX_FILE_BYTES."""

    media_type = "*/*"

    def parse(self, stream, media_type=None, parser_context=None):
        limit = settings.AIRLOCK_MAX_FILE_BYTES
        data = stream.read(limit + 1) if stream is not None else b""
        if len(data) > limit:
            raise FileTooLarge(f"a file may hold at most {limit} bytes (AIRLOCK_MAX_FILE_BYTES)")
        return data


class FileTooLarge(exceptions.APIException):
    status_code = 413
    default_code = "file_too_large"


@waits_for_runner
@extend_schema(methods=["POST"], request=s.SessionCreateSerializer, responses={201: s.SessionSerializer})
@extend_schema(methods=["GET"], parameters=[s.SessionListParams], responses=s.SessionSerializer(many=True),
               summary="The tenant's sessions, newest first (at most 200)")
@api_view(["GET", "POST"])
@authentication_classes(AUTH)
@permission_classes([IsAuthenticated])
def sessions(request):
    if not isinstance(request.user, ApiPrincipal) or "sessions" not in request.user.scopes:
        raise exceptions.PermissionDenied("listing or creating sessions needs an API key with the scope 'sessions'")
    if request.method == "GET":
        params = s.SessionListParams(data=request.query_params)
        params.is_valid(raise_exception=True)
        found = session_search(request.user.tenant, **params.validated_data).order_by("-created_at")[:200]
        return Response(s.SessionSerializer(found, many=True).data)
    data = validated(s.SessionCreateSerializer, request.data)
    try:
        with admission.waiting_call(request.user.tenant):
            created = lifecycle.session_open(
                tenant=request.user.tenant, conversation_id=data["conversation_id"], policy_name=data["policy"],
                repository=data.get("workspace", {}).get("repo", ""), actor_label=actor_label(request.auth),
                persist=data["persist"], resume=data.get("resume", ""))
    except (lifecycle.LifecycleError, admission.Refused) as exc:
        return _refused(exc)
    body = s.SessionSerializer(created.session).data
    body["token"] = created.token
    return Response(body, status=status.HTTP_201_CREATED)


@waits_for_runner
@extend_schema(methods=["GET", "DELETE"], responses=s.SessionSerializer)
@api_view(["GET", "DELETE"])
@authentication_classes(AUTH)
@permission_classes([IsAuthenticated])
def session_detail(request, session_id):
    session = session_for(request, session_id)
    if request.method == "DELETE":
        return _stop(request, session, SessionState.ENDED, "ended through the API")
    return Response(s.SessionSerializer(session).data)


@waits_for_runner
@extend_schema(request=None, responses=s.SessionSerializer)
@api_view(["POST"])
@authentication_classes(AUTH)
@permission_classes([IsAuthenticated])
def session_kill(request, session_id):
    return _stop(request, session_for(request, session_id), SessionState.KILLED, "killed through the API")


def _stop(request, session, state: str, reason: str) -> Response:
    try:
        with admission.waiting_call(session.tenant):
            session = lifecycle.session_stop(session=session, state=state, actor=_actor(request), reason=reason)
    except (lifecycle.LifecycleError, admission.Refused) as exc:
        return _refused(exc)
    return Response(s.SessionSerializer(session).data)


@waits_for_runner
@extend_schema(methods=["POST"], request=s.CommandCreateSerializer,
               responses={200: s.CommandSerializer, 202: s.CommandSerializer})
@extend_schema(methods=["GET"], responses=s.CommandSerializer(many=True))
@api_view(["GET", "POST"])
@authentication_classes(AUTH)
@permission_classes([IsAuthenticated])
def commands(request, session_id):
    session = session_for(request, session_id)
    if request.method == "GET":
        return Response([s.command_body(command) for command in command_list(session)])
    data = validated(s.CommandCreateSerializer, request.data)
    wait = data["wait"]
    try:
        with admission.waiting_call(session.tenant) if wait else contextlib.nullcontext():
            command = broker.command_propose(session=session, request=exec_request(data), wait=wait)
    except (broker.BrokerError, admission.Refused) as exc:
        return _refused(exc)
    if not command.finished and wait:  # the wait ran out, or the session ended meanwhile: as stored now
        command = command_get(session, command.pk)
    code = status.HTTP_200_OK if command.finished else status.HTTP_202_ACCEPTED
    return Response(s.command_body(command), status=code)


@extend_schema(responses=s.CommandSerializer)
@api_view(["GET"])
@authentication_classes(AUTH)
@permission_classes([IsAuthenticated])
def command_detail(request, session_id, command_id):
    session = session_for(request, session_id)
    return Response(s.command_body(command_get(session, command_id)))


@waits_for_runner
@extend_schema(parameters=[s.FileListParams], responses=s.FileListSerializer)
@api_view(["GET"])
@authentication_classes(AUTH)
@permission_classes([IsAuthenticated])
def session_files(request, session_id):
    """The files under `path` (default: the whole workspace), depth first, at most 10,000."""
    session = session_for(request, session_id)
    params = s.FileListParams(data=request.query_params)
    params.is_valid(raise_exception=True)
    path = params.validated_data["path"]
    try:
        with admission.waiting_call(session.tenant):
            listing = broker.file_operation(session=session, op="list", path=path)
    except (broker.BrokerError, admission.Refused) as exc:
        return _refused(exc)
    return Response({"path": path, **listing})


@waits_for_runner
@extend_schema(methods=["PUT"], request={"application/octet-stream": OpenApiTypes.BINARY}, responses={204: None})
@extend_schema(methods=["GET"], responses={(200, "application/octet-stream"): OpenApiTypes.BINARY})
@api_view(["GET", "PUT"])
@authentication_classes(AUTH)
@permission_classes([IsAuthenticated])
@parser_classes([RawBodyParser])
def session_file(request, session_id, path: str):
    session = session_for(request, session_id)
    try:
        with admission.waiting_call(session.tenant):
            if request.method == "PUT":
                broker.file_operation(session=session, op="put", path=path, data=bytes(request.data or b""))
                return Response(status=status.HTTP_204_NO_CONTENT)
            data = broker.file_operation(session=session, op="get", path=path)
    except (broker.BrokerError, admission.Refused) as exc:
        return _refused(exc)
    response = HttpResponse(data, content_type="application/octet-stream")
    response["Content-Disposition"] = "attachment"
    return response
