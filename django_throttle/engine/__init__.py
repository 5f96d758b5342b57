"""The engine: what applies to a request or a key, one store call, the request's state, what
follows. The entry points use only what this package exports, never its modules.

One request through ThrottleMiddleware: ``begin()`` (request_state.py), ``enforce_view()`` and
``respond()`` (pipeline.py, whose stages read top to bottom)."""

from __future__ import annotations

from .deciding import block_rules, inspect, reset_rules
from .explicit_keys import (
    ablock_key,
    adecide_key,
    block_key,
    block_seconds,
    decide_key,
    refund_key,
    reset_key,
)
from .leases import (
    arelease_after_threads,
    arelease_leases,
    release_leases,
    request_finished,
    request_started,
)
from .overrides import rule_for
from .pipeline import (
    aadmit,
    aenforce,
    aenforce_view,
    aevaluate,
    afailed,
    afinish,
    arespond,
    enforce,
    enforce_view,
    evaluate,
    failed,
    finish,
    respond,
)
from .refunds import arefund_request, refund_request
from .request_state import SPECS_ATTR, begin, serving, state_of, under_middleware

__all__ = (
    "SPECS_ATTR",
    "aadmit",
    "ablock_key",
    "adecide_key",
    "aenforce",
    "aenforce_view",
    "aevaluate",
    "afailed",
    "afinish",
    "arefund_request",
    "arelease_after_threads",
    "arelease_leases",
    "arespond",
    "begin",
    "block_key",
    "block_rules",
    "block_seconds",
    "decide_key",
    "enforce",
    "enforce_view",
    "evaluate",
    "failed",
    "finish",
    "inspect",
    "refund_key",
    "refund_request",
    "release_leases",
    "request_finished",
    "request_started",
    "reset_key",
    "reset_rules",
    "respond",
    "rule_for",
    "serving",
    "state_of",
    "under_middleware",
)
