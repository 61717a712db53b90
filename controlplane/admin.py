from django.contrib import admin

from controlplane.models import ApiKey, AuditEvent, Membership, Tenant


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "created_at"]
    search_fields = ["slug", "name"]


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ["user", "tenant", "role", "created_at"]
    list_filter = ["role", "tenant"]
    # Role changes go through the dashboard, where they are audited.
    readonly_fields = ["user", "tenant", "role", "created_at"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ["name", "tenant", "prefix", "created_at", "expires_at", "revoked_at", "last_used_at"]
    list_filter = ["tenant"]
    exclude = ["secret_hash"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(AuditEvent)
class AuditEventAdmin(admin.ModelAdmin):
    """Read-only: the audit log is append-only, here as everywhere."""

    list_display = ["tenant", "seq", "created_at", "actor", "action", "target_type", "target_id"]
    list_filter = ["tenant", "action"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
