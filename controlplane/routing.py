"""WebSocket routes of every app, gathered in one list for asgi.py."""

from sessions.routing import websocket_urlpatterns as session_routes

websocket_urlpatterns = [*session_routes]
