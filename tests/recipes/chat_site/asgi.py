# asgi.py: the whole file of a project "mysite" with the app "chat" (chat/routing.py below).
import os

from channels.auth import AuthMiddlewareStack
from channels.routing import ProtocolTypeRouter, URLRouter
from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mysite.settings")
django_asgi = get_asgi_application()  # sets Django up before the consumers are imported

from chat.routing import websocket_urlpatterns  # noqa: E402

from django_throttle.contrib.channels import ThrottleMiddleware  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": django_asgi,
        "websocket": AuthMiddlewareStack(ThrottleMiddleware(URLRouter(websocket_urlpatterns))),
    }
)
