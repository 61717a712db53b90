from django.urls import path

from policies_app.api import views

urlpatterns = [
    path("policies", views.policies, name="api-policies"),
    path("denials", views.denials, name="api-denials"),
    path("exceptions", views.exceptions, name="api-exceptions"),
    path("exceptions/<uuid:exception_id>", views.exception_detail, name="api-exception"),
    path("exceptions/<uuid:exception_id>/revoke", views.exception_revoke, name="api-exception-revoke"),
    path("policy-schema", views.policy_schema, name="api-policy-schema"),
    path("policies/<slug:name>", views.policy_detail, name="api-policy"),
    path("policies/<slug:name>/versions", views.version_create, name="api-policy-versions"),
    path("policies/<slug:name>/versions/<int:number>", views.version_detail, name="api-policy-version"),
    path("policies/<slug:name>/versions/<int:number>/publish", views.version_publish, name="api-policy-publish"),
    path("policies/<slug:name>/versions/<int:number>/replay", views.version_replay, name="api-policy-replay"),
    path("policies/<slug:name>/rollback", views.policy_rollback, name="api-policy-rollback"),
    path("policies/<slug:name>/shadow", views.policy_shadow, name="api-policy-shadow"),
    path("policies/<slug:name>/review", views.policy_review, name="api-policy-review"),
    path("policies/<slug:name>/evaluate", views.policy_evaluate, name="api-policy-evaluate"),
]
