from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.decorators import api_view, authentication_classes, permission_classes
from rest_framework.permissions import AllowAny
from rest_framework.response import Response

from controlplane.health import health_report


@extend_schema(
    summary="Who am I",
    description="The tenant and scopes of the API key that authenticates the request.",
    responses=inline_serializer("WhoAmI", {
        "tenant": inline_serializer("WhoAmITenant", {"slug": serializers.CharField(), "name": serializers.CharField()}),
        "key": inline_serializer("WhoAmIKey", {
            "name": serializers.CharField(), "prefix": serializers.CharField(),
            "scopes": serializers.ListField(child=serializers.CharField()),
            "expires_at": serializers.DateTimeField(allow_null=True),
        }),
    }),
)
@api_view(["GET"])
def whoami(request):
    api_key = request.auth
    return Response({
        "tenant": {"slug": api_key.tenant.slug, "name": api_key.tenant.name},
        "key": {
            "name": api_key.name, "prefix": api_key.display_prefix, "scopes": api_key.scopes,
            "expires_at": api_key.expires_at,
        },
    })


@extend_schema(exclude=True)
@api_view(["GET"])
@authentication_classes([])
@permission_classes([AllowAny])
def healthz(request):
    report = health_report()
    return Response(report, status=200 if report["ok"] else 503)

