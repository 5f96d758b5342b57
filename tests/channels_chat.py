# chat/routing.py: a chat whose handshakes and messages are limited by admin rules.
from channels.auth import AuthMiddlewareStack
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from channels.routing import URLRouter
from django.urls import path

from django_throttle.contrib.channels import ThrottledConsumerMixin, ThrottleMiddleware


class ChatConsumer(ThrottledConsumerMixin, AsyncJsonWebsocketConsumer):
    throttle_scope = "chat"  # the rules of scope "chat" count every message
    throttle_close_after = 5  # the 5th rejection in a row closes the socket (code 4429)

    def throttle_cost(self, text_data=None, bytes_data=None):
        return 1 + len(text_data or "") // 1000  # a long message counts more

    async def connect(self):
        await self.accept()

    async def receive_json(self, content):
        await self.send_json({"echo": content.get("text", "")})


websocket_application = AuthMiddlewareStack(
    ThrottleMiddleware(URLRouter([path("ws/chat/<str:room>/", ChatConsumer.as_asgi())]))
)
