"""One error shape for the whole API: `{"error": <code>, "detail": <text>, "fields"?: {...}}`."""

from django.conf import settings
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import RequestDataTooBig
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler


def exception_handler(exc, context):
    if isinstance(exc, DjangoValidationError):
        exc = exceptions.ValidationError(detail=_django_errors(exc))
    if isinstance(exc, Http404):
        return Response({"error": "not_found", "detail": "not found"}, status=status.HTTP_404_NOT_FOUND)
    if isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied()
    if isinstance(exc, RequestDataTooBig):  # Django's bound on a parsed body; unanswered, its HTML 400
        return Response({"error": "request_too_large", "detail": f"a JSON body may hold at most "
                         f"{settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes (a workspace file, sent as raw bytes, up to "
                         f"AIRLOCK_MAX_FILE_BYTES)"}, status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE)
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ValidationError):
        fields = exc.detail if isinstance(exc.detail, dict) else {"non_field_errors": exc.detail}
        response.data = {"error": "invalid_request", "detail": "the request is not valid", "fields": fields}
    elif isinstance(exc, exceptions.ParseError):  # a body that is not JSON is an invalid request too
        response.data = {"error": "invalid_request", "detail": "the request body is not valid JSON",
                         "fields": {"non_field_errors": [str(exc.detail)]}}
    elif isinstance(exc, exceptions.APIException):
        codes = exc.get_codes()
        code = codes if isinstance(codes, str) else exc.default_code
        response.data = {"error": code, "detail": str(exc.detail)}
    return response


def _django_errors(exc: DjangoValidationError):
    if hasattr(exc, "error_dict"):
        return {field: [str(m) for e in errors for m in e.messages] for field, errors in exc.error_dict.items()}
    return {"non_field_errors": exc.messages}
