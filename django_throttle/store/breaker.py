"""Circuit breakers in front of the store (one per cluster master too): after a failure, stop
calling Redis for a while (docs/internals.md, "The circuit breaker and the local fallback")."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection

from ..signals import store_state_changed
from .errors import cut, describe

logger = logging.getLogger("django_throttle")

CLOSED, OPEN, PROBING = "closed", "open", "probing"
MIN_PROBE_LEASE = 1.0  # seconds a probe has before another may start, with a tiny interval


class Breaker:
    """``allow()`` hands each call a token: the epoch it began in. A call's verdict counts only
    if no probe began or succeeded since (a call sent before a recovery and failing after it
    says nothing about the store now), and only the probe's success closes the breaker."""

    def __init__(
        self,
        interval: Callable[[], float],
        clock: Callable[[], float] = time.monotonic,
        node: str | None = None,
    ) -> None:
        self._interval = interval
        self._clock = clock
        self.node = node  # a cluster node's address; None: the whole store
        self._lock = threading.Lock()
        self.state = CLOSED
        self._open_until = 0.0
        self._probe_until = 0.0
        # Advances when a probe begins and when the breaker closes: a closed breaker's token
        # (the store reads it without calling allow(), on every decision).
        self.epoch = 0
        # Until when connections cut mid-command are taken for one event (see failed()).
        self._cuts_until = -1e18

    def reset(self) -> None:
        with self._lock:
            self.state = CLOSED
            self._open_until = 0.0
            self._probe_until = 0.0
            self.epoch += 1

    def allow(self) -> int | None:
        """The call's token if this request may call the store, else None (the hot path:
        one attribute read while closed)."""
        if self.state == CLOSED:
            return self.epoch
        with self._lock:
            now = self._clock()
            if (self.state == OPEN and now >= self._open_until) or (
                self.state == PROBING and now >= self._probe_until
            ):
                self.state = PROBING  # this caller is the one probe
                self._probe_until = now + max(self._interval(), MIN_PROBE_LEASE)
                self.epoch += 1
                return self.epoch
            return None

    def abandoned(self, token: int) -> None:
        """The call ended without a verdict on the store (cancelled, interrupted): if it
        was the probe, the next request probes instead."""
        if self.state != PROBING:
            return
        with self._lock:
            if self.state == PROBING and token == self.epoch:
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
            if self.state != PROBING or token != self.epoch:
                return
            self.state = CLOSED
            self.epoch += 1
        if self.node is None:
            logger.warning(
                "django_throttle: the store is reachable again; limiting in Redis resumes"
            )
            _changed(available=True)
        else:
            logger.warning(
                "django_throttle: the Redis Cluster node %s is reachable again; limiting of the "
                "clients whose slots it holds resumes",
                self.node,
            )
            _changed(available=True, node=self.node)

    def failed(self, exc: BaseException, token: int) -> None:
        if self.state == CLOSED and cut(exc) and self._forgive(exc):
            return
        with self._lock:
            if token != self.epoch:
                return  # began before the latest probe or recovery
            was = self.state
            self.state = OPEN
            self._open_until = self._clock() + self._interval()
        if was != CLOSED:
            return
        if self.node is None:
            logger.error(
                "django_throttle: the store is unavailable (%s); rules apply their fail modes "
                "and the store is retried every %.1f s",
                describe(exc),
                self._interval(),
            )
            _changed(available=False, error=exc)
        else:
            logger.error(
                "django_throttle: the Redis Cluster node %s is unavailable (%s); rules apply "
                "their fail modes to the clients whose slots it holds, and it is retried every "
                "%.1f s",
                self.node,
                describe(exc),
                self._interval(),
            )
            _changed(available=False, error=exc, node=self.node)

    def _forgive(self, exc: BaseException) -> bool:
        """Whether a connection cut mid-command leaves the breaker closed.

        A server that closes its clients' connections at once (Sentinel demoting a primary,
        CLIENT KILL, a restart) cuts every decision in flight: each fails alone, and the next
        ones connect again, to the new primary, or fail to connect, which opens the breaker.
        Cuts are forgiven for one breaker interval from the first; a server that keeps cutting
        past it opens the breaker, and none is forgiven again for another interval."""
        now = self._clock()
        with self._lock:
            if now >= self._cuts_until + self._interval():
                self._cuts_until = now + self._interval()
                first = True
            elif now < self._cuts_until:
                first = False
            else:
                return False
        if first:
            where = "the store" if self.node is None else f"the Redis Cluster node {self.node}"
            logger.warning(
                "django_throttle: a connection to %s was cut mid-decision (%s); that request "
                "takes its rule's fail mode, the next ones connect again",
                where,
                describe(exc),
            )
        return True


class NodeBreakers:
    """A breaker per Redis Cluster node, by address (``host:port``): made when a node is
    first seen, forgotten when the slot map no longer names it, so there are never more
    than the cluster has nodes (plus those seen since its map was last read)."""

    def __init__(
        self, interval: Callable[[], float], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._interval = interval
        self._clock = clock
        self._breakers: dict[str, Breaker] = {}

    def of(self, node: str) -> Breaker:
        """The node's breaker (closed when new)."""
        found = self._breakers.get(node)
        if found is None:
            made = Breaker(self._interval, self._clock, node=node)
            found = self._breakers.setdefault(node, made)  # one breaker if threads race
        return found

    def keep(self, nodes: Collection[str]) -> None:
        """Forget the breakers of nodes that are not among ``nodes`` (the slot map's)."""
        for node in list(self._breakers):
            if node not in nodes:
                self._breakers.pop(node, None)

    def is_open(self, node: str) -> bool:
        """Whether this node failed less than the interval ago (without taking the probe)."""
        found = self._breakers.get(node)
        return found is not None and found.is_open()

    def all_closed(self) -> bool:
        return all(b.state == CLOSED for b in list(self._breakers.values()))

    def nodes(self) -> list[str]:
        """The nodes that have a breaker now."""
        return list(self._breakers)

    def reset(self) -> None:
        """Forget every node's breaker: all closed again."""
        self._breakers.clear()


def _changed(**kwargs: object) -> None:
    store_state_changed.send(Breaker, **kwargs)
