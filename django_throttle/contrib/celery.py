"""``throttle_task``: a Celery task that waits its turn under a scope's rules back in the queue.

Celery's ``rate_limit`` is per worker and ``acquire()`` holds a worker slot while it waits; a
rejected run here goes back to the broker instead. Celery stays optional: this module imports
it, nothing else in django_throttle does.
"""

from __future__ import annotations

import functools
import inspect
import random
from collections.abc import Callable
from typing import Any, Concatenate, ParamSpec, TypeVar

from celery.exceptions import Reject, Retry

from ..costs import valid_cost
from ..decision import Decision
from ..engine import decide_key

P = ParamSpec("P")
R = TypeVar("R")

JITTER_SHARE = 0.1  # of the retry time: deferred runs of one burst come back spread out
JITTER_FLOOR = 0.1  # seconds: the spread of a short retry time


def throttle_task(
    scope: str, key: Callable[..., str], cost: int = 1
) -> Callable[[Callable[Concatenate[Any, P], R]], Callable[Concatenate[Any, P], R]]:
    """Under ``@app.task(bind=True)``: each run counts ``cost`` for client ``key(*args,
    **kwargs)`` under the rules of ``scope``; a rejected run goes back to the queue with
    ``countdown`` = the decision's ``retry_after`` plus jitter, the same task id, its retries
    not counted, and without sleeping in the worker."""
    if not isinstance(scope, str) or not scope:
        raise ValueError(f"throttle_task scope must be a non-empty string, not {scope!r}")
    if not callable(key):
        raise ValueError(
            f"throttle_task key must be a callable of the task's arguments, not {key!r}"
        )
    cost = valid_cost(cost)

    def decorate(run: Callable[Concatenate[Any, P], R]) -> Callable[Concatenate[Any, P], R]:
        @functools.wraps(run)
        def throttled(task: Any, /, *args: P.args, **kwargs: P.kwargs) -> R:
            client = key(*args, **kwargs)
            if not isinstance(client, str) or not client:
                raise ValueError(
                    f"throttle_task key of {getattr(task, 'name', run.__name__)} must return a "
                    f"non-empty string (the client key), not {client!r}"
                )
            decision = decide_key(scope, client, cost)
            if decision.allowed:
                return run(task, *args, **kwargs)
            raise defer(task, decision)

        # Celery checks a call's arguments against the signature it reads without following
        # __wrapped__: give it the task function's own.
        throttled.__signature__ = inspect.signature(run)  # type: ignore[attr-defined]
        return throttled

    return decorate


def countdown(decision: Decision) -> float:
    """Seconds until a rejected run comes back: its retry time plus up to a tenth of it (at
    least 0.1 s) at random."""
    wait = max(decision.retry_after, 0.0)
    return wait + random.uniform(0.0, max(JITTER_FLOOR, wait * JITTER_SHARE))


def defer(task: Any, decision: Decision) -> Retry:
    """Send the same message (task id, arguments, options, retries) back to the broker to run
    in ``countdown(decision)`` seconds; the Retry the worker takes as "retried" is returned
    for the caller to raise. Unlike ``task.retry()``, the retries are not counted."""
    when = countdown(decision)
    reason = f"throttled by rule {decision.rule!r} of the scope; back in {when:.2f}s"
    request = task.request
    if request.called_directly or request.is_eager:
        # No broker to go back to: the run ends with a Retry and the body does not run (a
        # retry in eager mode would run again at once, polling the store).
        return Retry(reason, when=when)
    # As task.retry() does, without adding one to request.retries nor checking max_retries.
    signature = task.signature_from_request(request, countdown=when)
    try:
        signature.apply_async()
    except Exception as exc:
        raise Reject(exc, requeue=False) from exc
    return Retry(reason, when=when, sig=signature)
