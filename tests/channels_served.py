"""The test project with WebSockets behind a real ASGI server (tests/served.py's settings):
``/ws/echo/`` through AuthMiddlewareStack, ThrottleMiddleware and URLRouter."""

from __future__ import annotations

from typing import Any

from tests import served  # configures the settings and sets Django up: imported first


def _application() -> Any:
    # Channels' auth imports Django's models: after the set-up above.
    from channels.auth import AuthMiddlewareStack
    from channels.generic.websocket import WebsocketConsumer
    from channels.routing import ProtocolTypeRouter, URLRouter
    from django.urls import path

    from django_throttle.contrib.channels import ThrottleMiddleware

    class Echo(WebsocketConsumer):
        def connect(self) -> None:
            self.accept()

        def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
            self.send(text_data=text_data)

    return ProtocolTypeRouter(
        {
            "http": served.asgi,
            "websocket": AuthMiddlewareStack(
                ThrottleMiddleware(URLRouter([path("ws/echo/", Echo.as_asgi())]))
            ),
        }
    )


application = _application()
