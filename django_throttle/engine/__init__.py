"""The engine: what applies to a request, the per-request state, one sync and one async flow."""

from __future__ import annotations

from .flow import aenforce, aevaluate, enforce, evaluate, finish
from .state import SPECS_ATTR, state_of, view_specs

__all__ = [
    "SPECS_ATTR",
    "aenforce",
    "aevaluate",
    "enforce",
    "evaluate",
    "finish",
    "state_of",
    "view_specs",
]
