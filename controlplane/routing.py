"""WebSocket routes of every app, gathered in one list for asgi.py; a path that names no stream
is refused at the handshake (403), where channels' router would raise and the server log a
traceback for every such request."""

from channels.generic.websocket import AsyncWebsocketConsumer
from django.urls import re_path

from sessions.routing import websocket_urlpatterns as session_routes


class NoStream(AsyncWebsocketConsumer):
    async def connect(self):
        await self.close()  # before accepting: the handshake is answered 403


websocket_urlpatterns = [*session_routes, re_path(r"", NoStream.as_asgi())]
