# Live session streams (/ws/sessions/<id>/) arrive with the broker.
websocket_urlpatterns: list = []
