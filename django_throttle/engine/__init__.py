"""The engine: what applies to a request or a key, one store call, the request's state, what
follows. The entry points use only what this package exports, never its modules."""

from __future__ import annotations

from .bans import aenforce_bans, enforce_bans
from .deciding import block_levels, block_rules, inspect, reset_rules
from .delays import serving
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
from .flows import (
    aadmit,
    aenforce,
    aenforce_unrouted,
    aenforce_view,
    aevaluate,
    enforce,
    enforce_unrouted,
    enforce_view,
    evaluate,
    preview,
)
from .headers import afailed, afinish, failed, finish
from .leases import (
    arelease_after_threads,
    arelease_leases,
    release_leases,
    request_finished,
    request_started,
)
from .overrides import rule_for
from .refunds import arefund_request, refund_request
from .request_state import SPECS_ATTR, seen_by_middleware, state_of, under_middleware
from .settlements import settle_request, view_failed

__all__ = (
    "SPECS_ATTR",
    "aadmit",
    "afailed",
    "afinish",
    "ablock_key",
    "acharge_key",
    "adecide_key",
    "aenforce",
    "aenforce_bans",
    "aenforce_unrouted",
    "aenforce_view",
    "aevaluate",
    "arefund_request",
    "arelease_after_threads",
    "arelease_leases",
    "block_key",
    "block_levels",
    "block_rules",
    "block_seconds",
    "charge_key",
    "decide_key",
    "enforce",
    "enforce_bans",
    "enforce_unrouted",
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
    "rule_for",
    "seen_by_middleware",
    "serving",
    "settle_request",
    "state_of",
    "under_middleware",
    "view_failed",
)
