from django.urls import path

from sessions import consumers

websocket_urlpatterns = [
    path("ws/sessions/<uuid:session_id>/", consumers.SessionConsumer.as_asgi()),
    path("ws/t/<slug:tenant_slug>/sessions/", consumers.TenantSessionsConsumer.as_asgi()),
]
