from django.urls import path

from policies_app import denial_views, views

urlpatterns = [
    path("policies/", views.policy_list, name="policies"),
    path("policies/new", views.policy_create, name="policy-create"),
    path("policies/<slug:name>/", views.policy_detail, name="policy"),
    path("policies/<slug:name>/edit", views.policy_edit, name="policy-edit"),
    path("policies/<slug:name>/check", views.policy_check, name="policy-check"),
    path("policies/<slug:name>/try", views.policy_try, name="policy-try"),
    path("policies/<slug:name>/v/<int:number>/", views.version_detail, name="policy-version"),
    path("policies/<slug:name>/v/<int:number>/replay", views.version_replay, name="policy-replay"),
    path("policies/<slug:name>/v/<int:number>/publish", views.version_publish, name="policy-publish"),
    path("policies/<slug:name>/v/<int:number>/rollback", views.version_rollback, name="policy-rollback"),
    path("policies/<slug:name>/v/<int:number>/shadow", views.version_shadow, name="policy-shadow"),
    path("denials/", denial_views.denials, name="denials"),
    path("denials/<uuid:decision_id>/", denial_views.denial_detail, name="denial"),
    path("denials/<uuid:decision_id>/allow", denial_views.denial_allow, name="denial-allow"),
    path("denials/<uuid:decision_id>/except", denial_views.denial_except, name="denial-except"),
    path("exceptions/", denial_views.exception_page, name="exceptions"),
    path("exceptions/<uuid:exception_id>/revoke", denial_views.exception_revoke, name="exception-revoke"),
]
