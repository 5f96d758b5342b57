"""Django Channels: WebSocket handshakes and messages under the same rules (extra ``[channels]``).

Channels stays optional: this package imports it, nothing else in django_throttle does.
"""

from __future__ import annotations

from .connection import METHOD, Connection
from .consumers import CLOSE_CODE, ThrottledConsumerMixin
from .middleware import ThrottleMiddleware

__all__ = ("CLOSE_CODE", "METHOD", "Connection", "ThrottleMiddleware", "ThrottledConsumerMixin")
