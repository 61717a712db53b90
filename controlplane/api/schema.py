"""How the OpenAPI schema (/api/schema/, /api/docs/) describes Airlock's authentication, so
Swagger UI's Authorize takes a key and sends it (drf-spectacular's documented extension point)."""

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class ApiKeyScheme(OpenApiAuthenticationExtension):
    target_class = "controlplane.api.auth.ApiKeyAuthentication"
    name = "apiKey"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "bearerFormat": "alk_<prefix>_<secret>",
                "description": "A tenant's API key (Settings → API keys): `Authorization: Bearer alk_…`."}
