"""Telling what was decided: the rejection log, the metrics, the request_throttled signal."""

from __future__ import annotations

from typing import Any

from .. import metrics, rejection_log
from ..decision import Decision
from ..rejection_log import sizing
from ..signals import request_throttled


def announce(request: Any | None, decision: Decision) -> None:
    """Count rejections for the dashboard and every decision in the metrics, and send
    request_throttled for a rejection and for each would-be rejection of a log-only rule (not
    for a key decided without a request: ``request`` None)."""
    rejection_log.note(decision)  # free when admitted
    sizing.note(decision)  # free for other algorithms and, past 20, most decisions
    metrics.decided(decision)  # free when metrics are off
    if request is None:
        return
    if not decision.allowed and decision.rule is not None:
        request_throttled.send(
            Decision, request=request, rule=decision.rule, decision=decision, shadow=False
        )
    for result in decision.results:
        if not result.allowed and not result.rule.enforcing:
            request_throttled.send(
                Decision, request=request, rule=result.rule.name, decision=decision, shadow=True
            )
