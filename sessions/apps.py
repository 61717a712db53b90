from django.apps import AppConfig


class AgentSessionsConfig(AppConfig):
    # `sessions` would clash with django.contrib.sessions.
    name = "sessions"
    label = "agent_sessions"
    verbose_name = "Agent sessions"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from sessions.api import schema  # noqa: F401 - registers the session token's OpenAPI security scheme
