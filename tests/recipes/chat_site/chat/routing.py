# chat/routing.py: a chat whose handshakes and messages are limited by admin rules.
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.urls import path

from django_throttle.contrib.channels import ThrottledConsumerMixin


class ChatConsumer(ThrottledConsumerMixin, AsyncJsonWebsocketConsumer):
    throttle_scope = "chat"  # the rules of scope "chat" count every message
    throttle_close_after = 5  # the 5th rejection in a row closes the socket (code 4429)

    def throttle_cost(self, text_data=None, bytes_data=None):
        return 1 + len(text_data or "") // 1000  # a long message counts more

    async def connect(self):
        await self.accept()

    async def receive_json(self, content):
        await self.send_json({"echo": content.get("text", "")})


websocket_urlpatterns = [path("ws/chat/<str:room>/", ChatConsumer.as_asgi())]
