"""The session token in the OpenAPI schema (see controlplane/api/schema.py)."""

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class SessionTokenScheme(OpenApiAuthenticationExtension):
    target_class = "sessions.api.auth.SessionTokenAuthentication"
    name = "sessionToken"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "bearerFormat": "ast_<token>",
                "description": "A session's own token, returned once when the session is created: it reaches "
                               "that session only, until it ends."}
