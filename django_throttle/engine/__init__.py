"""The engine: what applies to a request, the per-request state, one sync and one async flow."""

from __future__ import annotations

from .flow import (
    adecide,
    aenforce,
    aevaluate,
    decide,
    delay_of,
    enforce,
    evaluate,
    finish,
    gather,
)
from .state import SPECS_ATTR, RequestState, state_of, view_specs

__all__ = [
    "RequestState",
    "adecide",
    "aenforce",
    "aevaluate",
    "decide",
    "delay_of",
    "enforce",
    "evaluate",
    "gather",
    "finish",
    "state_of",
    "view_specs",
    "SPECS_ATTR",
]
