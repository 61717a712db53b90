from django.apps import AppConfig


class PoliciesConfig(AppConfig):
    name = "policies_app"
    verbose_name = "Policies"
    default_auto_field = "django.db.models.BigAutoField"
