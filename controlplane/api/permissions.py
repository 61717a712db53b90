from rest_framework.permissions import BasePermission

from controlplane.api.auth import ApiPrincipal


class HasScope(BasePermission):
    """`permission_classes = [HasScope.of("sessions")]`: the key must carry the scope."""

    required_scope = ""
    message = "the API key lacks the scope this endpoint needs"

    @classmethod
    def of(cls, scope: str) -> type["HasScope"]:
        return type(f"HasScope_{scope}", (cls,), {"required_scope": scope,
                    "message": f"the API key lacks the scope {scope!r}"})

    def has_permission(self, request, view) -> bool:
        return isinstance(request.user, ApiPrincipal) and self.required_scope in request.user.scopes
