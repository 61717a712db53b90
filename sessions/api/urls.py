from django.urls import path

from sessions.api import views

urlpatterns = [
    path("sessions", views.session_create, name="api-sessions"),
    path("sessions/<uuid:session_id>", views.session_detail, name="api-session"),
    path("sessions/<uuid:session_id>/kill", views.session_kill, name="api-session-kill"),
    path("sessions/<uuid:session_id>/commands", views.commands, name="api-session-commands"),
    path("sessions/<uuid:session_id>/commands/<uuid:command_id>", views.command_detail, name="api-session-command"),
    path("sessions/<uuid:session_id>/files/<path:path>", views.session_file, name="api-session-file"),
]
