from django.urls import path

from sessions import views

urlpatterns = [
    path("sessions/", views.session_list, name="sessions"),
    path("sessions/kill", views.sessions_kill_bulk, name="sessions-kill"),
    path("sessions/<uuid:session_id>/", views.session_detail, name="session"),
    path("sessions/<uuid:session_id>/kill", views.session_kill, name="session-kill"),
    path("metrics/", views.metrics_page, name="metrics"),
]
