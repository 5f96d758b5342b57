"""django_throttle: rate limiting for Django, with rules edited in the admin."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["Decision", "acheck", "check", "reset", "throttle"]

if TYPE_CHECKING:
    from .api import acheck, check, reset
    from .decision import Decision
    from .decorators import throttle

_LAZY = {
    "throttle": "decorators",
    "check": "api",
    "acheck": "api",
    "reset": "api",
    "Decision": "decision",
}


def __getattr__(name: str) -> Any:
    # Imported on first use: the package itself is imported while Django loads apps,
    # before models may be.
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'django_throttle' has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f".{module}", __name__), name)
