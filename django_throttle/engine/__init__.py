"""The engine: what applies to a request or a key, one store call, the request's state, what
follows. The entry points use only what this package exports, never its modules.

One request through ThrottleMiddleware: ``begin()`` (request_state.py), ``enforce_bans()``
(bans.py), ``enforce_view()`` and ``respond()`` (pipeline.py, whose stages read top to
bottom)."""

from __future__ import annotations

from .bans import aenforce_bans, enforce_bans
from .deciding import block_levels, block_rules, inspect, reset_rules
from .explicit_keys import (
    ablock_key,
    acharge_key,
    adecide_key,
    block_key,
    block_seconds,
    charge_key,
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
    preview,
    respond,
)
from .refunds import arefund_request, refund_request
from .request_state import SPECS_ATTR, begin, serving, state_of, under_middleware
from .settlements import settle_request, view_failed

__all__ = (
    "SPECS_ATTR",
    "aadmit",
    "ablock_key",
    "acharge_key",
    "adecide_key",
    "aenforce",
    "aenforce_bans",
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
    "block_levels",
    "block_rules",
    "block_seconds",
    "charge_key",
    "decide_key",
    "enforce",
    "enforce_bans",
    "enforce_view",
    "evaluate",
    "failed",
    "finish",
    "inspect",
    "preview",
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
    "settle_request",
    "state_of",
    "under_middleware",
    "view_failed",
)
