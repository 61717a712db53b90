from django.urls import path

from controlplane.api import views

urlpatterns = [
    path("whoami", views.whoami, name="api-whoami"),
]
