from django.apps import AppConfig


class ControlPlaneConfig(AppConfig):
    name = "controlplane"
    verbose_name = "Control plane"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from controlplane.api import schema  # noqa: F401 - registers the API key's OpenAPI security scheme
