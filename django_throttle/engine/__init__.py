"""The engine: what applies to a request, the per-request state, one sync and one async flow."""

from __future__ import annotations

from .flow import (
    aenforce,
    aevaluate,
    arelease_after_threads,
    arelease_leases,
    enforce,
    evaluate,
    finish,
    release_leases,
    serving,
)
from .state import SPECS_ATTR, state_of, view_specs

__all__ = [
    "SPECS_ATTR",
    "aenforce",
    "aevaluate",
    "arelease_after_threads",
    "arelease_leases",
    "enforce",
    "evaluate",
    "finish",
    "release_leases",
    "serving",
    "state_of",
    "view_specs",
]
