from django.apps import AppConfig


class PoliciesConfig(AppConfig):
    name = "policies_app"
    verbose_name = "Policies"
    default_auto_field = "django.db.models.BigAutoField"

    # `manage.py audit_verify` asks every app for these (controlplane imports no app).
    def audit_problems(self, tenant) -> list[str]:
        """What of the tenant's policy history disagrees with its audit chain."""
        from policies_app.integrity import tenant_problems

        return tenant_problems(tenant)

    def platform_audit_problems(self) -> list[str]:
        from policies_app.integrity import floor_problems

        return floor_problems()
