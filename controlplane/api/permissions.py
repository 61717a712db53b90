from rest_framework.permissions import SAFE_METHODS, BasePermission

from controlplane.api.auth import ApiPrincipal


class HasScope(BasePermission):
    """`permission_classes = [HasScope.of("sessions")]`: the key must carry the scope."""

    required_scope = ""
    message = "the API key lacks the scope this endpoint needs"

    @classmethod
    def of(cls, scope: str) -> type["HasScope"]:
        return type(f"HasScope_{scope}", (cls,), {"required_scope": scope,
                    "message": f"the API key lacks the scope {scope!r}"})

    @classmethod
    def by_method(cls, *, read: str, write: str) -> type["HasScope"]:
        """`read` for GET/HEAD/OPTIONS, `write` for the rest."""

        class ByMethod(cls):
            def has_permission(self, request, view) -> bool:
                self.required_scope = read if request.method in SAFE_METHODS else write
                self.message = f"the API key lacks the scope {self.required_scope!r}"
                return super().has_permission(request, view)

        return ByMethod

    def has_permission(self, request, view) -> bool:
        return isinstance(request.user, ApiPrincipal) and self.required_scope in request.user.scopes
