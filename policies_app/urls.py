from django.urls import path

from policies_app import views

urlpatterns = [
    path("policies/", views.policy_list, name="policies"),
    path("denials/", views.denials, name="denials"),
]
