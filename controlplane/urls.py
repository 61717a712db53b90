from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from controlplane import views
from controlplane.api.views import healthz
from sessions import prometheus

tenant_patterns = [
    path("audit/", views.audit, name="audit"),
    path("settings/", views.settings_page, name="settings"),
    path("settings/members/add", views.member_add, name="member-add"),
    path("settings/members/<int:membership_id>/role", views.member_role, name="member-role"),
    path("settings/members/<int:membership_id>/remove", views.member_remove, name="member-remove"),
    path("settings/keys/create", views.api_key_create, name="api-key-create"),
    path("settings/keys/<uuid:key_id>/revoke", views.api_key_revoke, name="api-key-revoke"),
    path("", include("sessions.urls")),
    path("", include("policies_app.urls")),
    path("", views.tenant_home, name="tenant-home"),
]

urlpatterns = [
    # The agent API first, its busiest part first: each pattern tried before the one that matches
    # costs its resolution (Django lists what it tried, for a 404's page).
    path("api/v1/", include("sessions.api.urls")),
    path("api/v1/", include("policies_app.api.urls")),
    path("api/v1/", include("controlplane.api.urls")),
    path("", views.home, name="home"),
    path("login/", auth_views.LoginView.as_view(redirect_authenticated_user=True), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("t/<slug:tenant_slug>/", include(tenant_patterns)),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    # The split view serves its start-up script from a URL, as the Content-Security-Policy
    # wants (controlplane/security.py); its page is ours for the same reason (no inline style).
    path("api/docs/", SpectacularSwaggerSplitView.as_view(url_name="api-schema", template_name="api_docs.html"),
         name="api-docs"),
    path("healthz", healthz, name="healthz"),
    path("metrics", prometheus.metrics, name="prometheus-metrics"),
    path("admin/", admin.site.urls),
]

handler403 = "controlplane.errors.forbidden"
handler404 = "controlplane.errors.not_found"
handler500 = "controlplane.errors.server_error"
