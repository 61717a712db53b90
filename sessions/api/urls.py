from django.urls import path

from sessions.api import persistence, views

urlpatterns = [
    path("sessions", views.sessions, name="api-sessions"),
    path("sessions/<uuid:session_id>", views.session_detail, name="api-session"),
    path("sessions/<uuid:session_id>/kill", views.session_kill, name="api-session-kill"),
    path("sessions/<uuid:session_id>/commands", views.commands, name="api-session-commands"),
    path("sessions/<uuid:session_id>/commands/<uuid:command_id>", views.command_detail, name="api-session-command"),
    path("sessions/<uuid:session_id>/files", views.session_files, name="api-session-files"),
    path("sessions/<uuid:session_id>/files/<path:path>", views.session_file, name="api-session-file"),
    path("sessions/<uuid:session_id>/artifacts", persistence.session_artifacts, name="api-session-artifacts"),
    *[item for kind, view in persistence.views.items() for item in (
        path(kind, view["list"], name=f"api-{kind}"),
        path(f"{kind}/<uuid:object_id>", view["detail"], name=f"api-{kind[:-1]}"),
        path(f"{kind}/<uuid:object_id>/verify", view["verify"], name=f"api-{kind[:-1]}-verify"),
        path(f"{kind}/<uuid:object_id>/download", view["download"], name=f"api-{kind[:-1]}-download"),
    )],
]
