"""The demo's WebSocket echo: its handshakes and messages under the demo's rules."""

from channels.generic.websocket import AsyncWebsocketConsumer

from django_throttle.contrib.channels import ThrottledConsumerMixin


class EchoConsumer(ThrottledConsumerMixin, AsyncWebsocketConsumer):
    """Sends every message back; the rules of scope "echo" count them."""

    throttle_scope = "echo"

    async def connect(self):
        await self.accept()

    async def receive(self, text_data=None, bytes_data=None):
        await self.send(text_data=text_data, bytes_data=bytes_data)
