from django.apps import AppConfig


class PoliciesConfig(AppConfig):
    name = "policies_app"
    verbose_name = "Policies"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from controlplane.signals import tenant_created
        from policies_app.services import floor_record_in_force

        tenant_created.connect(floor_record_in_force, dispatch_uid="policies_app.floor_record_in_force")

    # `manage.py audit_verify` asks every app for these (controlplane imports no app).
    def audit_problems(self, tenant) -> list[str]:
        """What of the tenant's policy history disagrees with its audit chain."""
        from policies_app.integrity import tenant_problems

        return tenant_problems(tenant)

    def platform_audit_problems(self) -> list[str]:
        from policies_app.integrity import floor_problems

        return floor_problems()
