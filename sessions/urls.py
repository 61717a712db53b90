from django.urls import path

from sessions import views

urlpatterns = [
    path("sessions/", views.session_list, name="sessions"),
]
