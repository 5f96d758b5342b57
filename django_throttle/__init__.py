"""django_throttle: rate limiting for Django, with rules edited in the admin."""

from __future__ import annotations

from types import MappingProxyType
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = (
    "Decision",
    "aacquire",
    "ablock_key",
    "acharge_key",
    "acheck",
    "acheck_key",
    "acquire",
    "arefund",
    "block_key",
    "charge_key",
    "check",
    "check_key",
    "refund",
    "refund_key",
    "reset",
    "asettle",
    "settle",
    "throttle",
)

if TYPE_CHECKING:
    from .api import (
        aacquire,
        ablock_key,
        acharge_key,
        acheck,
        acheck_key,
        acquire,
        arefund,
        asettle,
        block_key,
        charge_key,
        check,
        check_key,
        refund,
        refund_key,
        reset,
        settle,
    )
    from .decision import Decision
    from .decorators import throttle

_LAZY = MappingProxyType(
    {
        "throttle": "decorators",
        "check": "api",
        "acheck": "api",
        "reset": "api",
        "check_key": "api",
        "acheck_key": "api",
        "acquire": "api",
        "aacquire": "api",
        "refund": "api",
        "arefund": "api",
        "refund_key": "api",
        "block_key": "api",
        "ablock_key": "api",
        "charge_key": "api",
        "settle": "api",
        "asettle": "api",
        "acharge_key": "api",
        "Decision": "decision",
    }
)


def __getattr__(name: str) -> Any:
    # Imported on first use: the package itself is imported while Django loads apps,
    # before models may be.
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'django_throttle' has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f".{module}", __name__), name)
