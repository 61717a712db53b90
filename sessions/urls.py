from django.urls import path

from sessions import views

urlpatterns = [
    path("sessions/", views.session_list, name="sessions"),
    path("sessions/kill", views.sessions_kill_bulk, name="sessions-kill"),
    path("sessions/<uuid:session_id>/", views.session_detail, name="session"),
    path("sessions/<uuid:session_id>/kill", views.session_kill, name="session-kill"),
    path("sessions/<uuid:session_id>/output.txt", views.session_output, name="session-output"),
    path("metrics/", views.metrics_page, name="metrics"),
    path("policies/<slug:name>/v/<int:number>/eval", views.version_eval, name="policy-eval"),
    path("conversations/<path:conversation_id>/", views.conversation, name="conversation"),
    path("stored/<str:kind>/<uuid:object_id>/verify", views.packed_verify, name="packed-verify"),
    path("stored/<str:kind>/<uuid:object_id>/download", views.packed_download, name="packed-download"),
    path("stored/<str:kind>/<uuid:object_id>/delete", views.packed_delete, name="packed-delete"),
]
