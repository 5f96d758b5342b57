"""The example project under ASGI: Django for HTTP, the throttled echo consumer for WebSockets."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")
django_application = get_asgi_application()  # sets Django up before the consumers are imported

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.urls import path  # noqa: E402

from django_throttle.contrib.channels import ThrottleMiddleware  # noqa: E402
from example_project.demo.consumers import EchoConsumer  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": django_application,
        "websocket": AuthMiddlewareStack(
            ThrottleMiddleware(URLRouter([path("ws/echo/", EchoConsumer.as_asgi())]))
        ),
    }
)
