"""A circuit breaker in front of the store: after a failure, stop calling Redis for a while.

While the breaker is open no request waits on Redis at all; when the interval
has passed, one request probes the store and the others keep to the fail
modes until the probe succeeds. State changes are logged once and sent as the
``store_state_changed`` signal.

A probe can never hold the breaker: a probe cut short (a cancelled task, an
exception that is not a store error) gives the probe back at once, and a probe
that never reports (its thread gone) is presumed lost after one interval, when
another request may probe.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from ..signals import store_state_changed

logger = logging.getLogger("django_throttle")

CLOSED, OPEN, PROBING = "closed", "open", "probing"
MIN_PROBE_LEASE = 1.0  # seconds a probe has before another may start, with a tiny interval


class Breaker:
    """``allow()`` hands each call a token: the epoch it began in. A call's verdict counts only
    if no probe began or succeeded since (a call sent before a recovery and failing after it
    says nothing about the store now), and only the probe's success closes the breaker."""

    def __init__(
        self, interval: Callable[[], float], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._interval = interval
        self._clock = clock
        self._lock = threading.Lock()
        self.state = CLOSED
        self._open_until = 0.0
        self._probe_until = 0.0
        self._epoch = 0  # advances when a probe begins and when the breaker closes

    def reset(self) -> None:
        with self._lock:
            self.state = CLOSED
            self._open_until = 0.0
            self._probe_until = 0.0
            self._epoch += 1

    def allow(self) -> int | None:
        """The call's token if this request may call the store, else None (the hot path:
        one attribute read while closed)."""
        if self.state == CLOSED:
            return self._epoch
        with self._lock:
            now = self._clock()
            if (self.state == OPEN and now >= self._open_until) or (
                self.state == PROBING and now >= self._probe_until
            ):
                self.state = PROBING  # this caller is the one probe
                self._probe_until = now + max(self._interval(), MIN_PROBE_LEASE)
                self._epoch += 1
                return self._epoch
            return None

    def abandoned(self, token: int) -> None:
        """The call ended without a verdict on the store (cancelled, interrupted): if it
        was the probe, the next request probes instead."""
        if self.state != PROBING:
            return
        with self._lock:
            if self.state == PROBING and token == self._epoch:
                self.state = OPEN
                self._open_until = self._clock()

    def is_open(self) -> bool:
        """Whether the store failed less than the interval ago (without taking the probe)."""
        return self.state != CLOSED and self._clock() < self._open_until

    @property
    def retry_after(self) -> float:
        """Seconds until the store is tried again (at least 1, for Retry-After)."""
        return max(1.0, self._open_until - self._clock())

    def succeeded(self, token: int) -> None:
        if self.state != PROBING:
            return
        with self._lock:
            if self.state != PROBING or token != self._epoch:
                return
            self.state = CLOSED
            self._epoch += 1
        logger.warning("django_throttle: the store is reachable again; limiting in Redis resumes")
        _changed(available=True)

    def failed(self, exc: BaseException, token: int) -> None:
        with self._lock:
            if token != self._epoch:
                return  # began before the latest probe or recovery
            was = self.state
            self.state = OPEN
            self._open_until = self._clock() + self._interval()
        if was == CLOSED:
            logger.error(
                "django_throttle: the store is unavailable (%r); rules apply their fail modes "
                "and the store is retried every %.1f s",
                exc,
                self._interval(),
            )
            _changed(available=False, error=exc)


def _changed(**kwargs: object) -> None:
    store_state_changed.send(Breaker, **kwargs)
