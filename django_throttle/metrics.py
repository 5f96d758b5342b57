"""Prometheus metrics, in prometheus_client's default registry."""

from __future__ import annotations

import bisect
import logging
import math
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

from .conf import conf
from .runtime import Runtime, current

if TYPE_CHECKING:
    from prometheus_client import Counter, Histogram

logger = logging.getLogger("django_throttle")

DECISIONS = "django_throttle_decisions_total"
STORE_SECONDS = "django_throttle_store_seconds"
STORE_AVAILABLE = "django_throttle_store_available"
FALLBACK_DECISIONS = "django_throttle_fallback_decisions_total"
BLOCK_CACHE_DECISIONS = "django_throttle_block_cache_decisions_total"
LOG_FLUSHES = "django_throttle_log_flushes_total"
NEAR_LIMIT = "django_throttle_near_limit_total"
BANNED = "django_throttle_banned_total"

ALLOWED, REJECTED, SHADOW_REJECTED, UNAVAILABLE = (
    "allowed",
    "rejected",
    "shadow_rejected",
    "unavailable",
)
FLUSH_OK, FLUSH_ERROR = "ok", "error"

# A Redis decision on a near machine takes 0.05-0.5 ms; the decision TIMEOUT defaults to
# 100 ms, so a call past 0.1 s is one that timed out (or a slow network).
STORE_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
)

INSTALL_HINT = 'pip install "django-throttle-rules[prometheus]"'


# What the hooks are handed, described by shape: this module sits below the rules and the
# decision, so it cannot import them.
class RuleLike(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def enforcing(self) -> bool: ...


class ResultLike(Protocol):
    @property
    def rule(self) -> RuleLike: ...
    @property
    def allowed(self) -> bool: ...
    @property
    def limit(self) -> int: ...
    @property
    def remaining(self) -> int: ...


class DecisionLike(Protocol):
    @property
    def rule(self) -> str | None: ...
    @property
    def allowed(self) -> bool: ...
    @property
    def unavailable(self) -> bool: ...
    @property
    def results(self) -> tuple[ResultLike, ...]: ...


Increment = Callable[[float], None]  # a metric's inc(amount)


class Instruments:
    """The metric objects, registered in the default registry once per process."""

    def __init__(self) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        self.decisions = Counter(
            DECISIONS,
            "Rule results of throttling decisions, by rule and outcome.",
            ("rule", "outcome"),
        )
        self.store_seconds = Histogram(
            STORE_SECONDS,
            "Seconds a call to the store took, failed calls included.",
            buckets=STORE_BUCKETS,
        )
        # Per process, 0 while its breaker is open; across processes, the lowest.
        self.store_available = Gauge(
            STORE_AVAILABLE,
            "1 while the store is used, 0 while the circuit breaker keeps it out.",
            multiprocess_mode="livemin",
        )
        self.fallback_decisions = Counter(
            FALLBACK_DECISIONS,
            "Rule results decided by the local fallback while the store was unavailable.",
            ("rule", "outcome"),
        )
        self.block_cache_decisions = Counter(
            BLOCK_CACHE_DECISIONS,
            "Rejections decided by the local block cache, without calling the store.",
            ("rule",),
        )
        self.log_flushes = Counter(
            LOG_FLUSHES, "Writes of the rejection log to the database, by result.", ("result",)
        )
        self.near_limit = Counter(
            NEAR_LIMIT,
            "Rule results of admitted decisions past NEAR_LIMIT_RATIO of the rule's limit.",
            ("rule",),
        )
        self.banned = Counter(
            BANNED, "Requests refused (403) because their client is banned, by key kind.", ("kind",)
        )
        self.store_available.set(1)
        self.observe_store = _observer(self.store_seconds)
        # labels() takes a lock and builds a tuple on every call: each child's increment is kept.
        self._increments: dict[tuple[Counter | str, ...], Increment] = {}
        self.state_lock = threading.Lock()

    def show_available(self, available: Callable[[], bool]) -> None:
        with self.state_lock:
            self.store_available.set(1 if available() else 0)

    def count(self, counter: Counter, *labels: str) -> None:
        key: tuple[Counter | str, ...] = (counter, *labels)
        child = self._increments.get(key)
        if child is None:
            child = self._increments[key] = _increment(counter.labels(*labels))
        child(1)

    def count_results(
        self,
        counter: Counter,
        results: Iterable[ResultLike],
        most_remaining: dict[int, int] | None = None,
    ) -> None:
        """Count each result by rule and outcome; with ``most_remaining`` (of an admitted
        decision: the Metrics part's table, by limit, filled in here on a limit's first use),
        each admitted one with at most that many left as near its limit too."""
        # count() inlined, and one pass for both counters: this runs for every rule of every
        # request.
        increments = self._increments
        for result in results:
            rule = result.rule
            if result.allowed:
                key = (counter, rule.name, ALLOWED)
                child = increments.get(key)
                if child is None:
                    child = increments[key] = _increment(counter.labels(rule.name, ALLOWED))
                child(1)
                if most_remaining is None:
                    continue
                limit = result.limit
                most = most_remaining.get(limit)
                if most is None:
                    most = most_remaining[limit] = near_most(limit, conf.NEAR_LIMIT_RATIO)
                if result.remaining <= most:
                    near_key = (self.near_limit, rule.name)
                    child = increments.get(near_key)
                    if child is None:
                        child = increments[near_key] = _increment(self.near_limit.labels(rule.name))
                    child(1)
            else:
                outcome = REJECTED if rule.enforcing else SHADOW_REJECTED
                key = (counter, rule.name, outcome)
                child = increments.get(key)
                if child is None:
                    child = increments[key] = _increment(counter.labels(rule.name, outcome))
                child(1)


# prometheus_client checks on every inc() and observe() that the metric is not the parent of
# labelled children and that a counter's amount is not negative, true of every call here by
# construction. Fed directly, a request's three metric writes cost half as much: about 4 µs
# less under WSGI, 8 to 13 under ASGI (docs/benchmarks.md). Where a release keeps its values
# otherwise, the public methods are used.
def _increment(metric: Any) -> Increment:
    """``metric.inc``, or the ``inc`` of the value object behind it."""
    inc = getattr(getattr(metric, "_value", None), "inc", None)
    return inc if callable(inc) else metric.inc  # type: ignore[no-any-return]


def _observer(histogram: Histogram) -> Increment:
    """``histogram.observe``, or the same writes made to its sum and bucket values directly."""
    total = getattr(getattr(histogram, "_sum", None), "inc", None)
    buckets = getattr(histogram, "_buckets", None)
    bounds = getattr(histogram, "_upper_bounds", None)
    if not (
        callable(total)
        and isinstance(buckets, list)
        and isinstance(bounds, list)
        and len(buckets) == len(bounds)
        and bounds[-1] == math.inf
        and all(callable(getattr(bucket, "inc", None)) for bucket in buckets)
    ):
        return histogram.observe
    add_to_total = total
    add_to_bucket = [bucket.inc for bucket in buckets]
    upper_bounds = list(bounds)

    def observe(amount: float) -> None:
        add_to_total(amount)
        # The first bucket whose upper bound is at least the amount, as observe() finds it.
        add_to_bucket[bisect.bisect_left(upper_bounds, amount)](1)

    return observe


def near_most(limit: int, ratio: float) -> int:
    """The most a result of this limit may have left and be near it: used = limit - remaining
    is at least ``ratio`` of the limit."""
    # The tolerance keeps a product such as 0.7 * 10 = 7.000000000000001 from asking for 8.
    return limit - math.ceil(ratio * limit - 1e-9)


class Metrics:
    """Whether metrics are recorded, read from METRICS when the runtime is built, and the
    instruments (a runtime part; the instruments, registered once per process in the default
    registry, are handed on to every new runtime)."""

    from_code = True

    on: bool  # read on every request: a plain attribute once known (__getattr__ until then)

    def __init__(self) -> None:
        self.instruments: Instruments | None = None
        self.lock = threading.Lock()
        self.failed = False  # a metric could not be recorded: said once
        # Of this runtime's NEAR_LIMIT_RATIO, by limit (rules' and overrides': a few values):
        # the most left for an admitted result to be near it.
        self.most_remaining: dict[int, int] = {}

    def __getattr__(self, name: str) -> bool:
        if name != "on":
            raise AttributeError(name)
        on = self.on = self._resolve()
        return on

    def _resolve(self) -> bool:
        wanted = conf.METRICS
        if wanted is not True and wanted != "auto":
            return False
        try:
            # Imported at each resolution: whether it imports is the setting.
            import prometheus_client  # noqa: F401
        except ImportError:
            if wanted is True:
                logger.error(
                    "django_throttle: METRICS is True but prometheus_client is not installed; "
                    "no metrics are recorded (%s)",
                    INSTALL_HINT,
                )
            return False
        with self.lock:
            if self.instruments is None:
                try:
                    self.instruments = Instruments()
                except Exception:  # PROMETHEUS_MULTIPROC_DIR missing, say: no metrics, no 500s
                    logger.exception(
                        "django_throttle: metrics could not be set up; none are recorded"
                    )
                    return False
        return True

    def handover(self, successor: Runtime) -> None:
        with self.lock:
            if self.instruments is not None:
                successor.part(Metrics).instruments = self.instruments


class _Switch:
    """``switch.on``: whether metrics are recorded (the runtime's Metrics part says)."""

    __slots__ = ()

    @property
    def on(self) -> bool:
        return current.runtime.part(Metrics).on

    @on.setter
    def on(self, value: bool) -> None:
        current.runtime.part(Metrics).on = value


switch = _Switch()


def client_installed() -> bool:
    """Whether prometheus_client can be imported."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        return False
    return True


def _recording() -> Instruments | None:
    part = current.runtime.part(Metrics)
    return part.instruments if part.on else None


def _record(write: Callable[[Instruments], object]) -> None:
    """Call ``write`` with the instruments while metrics are recorded; a failure is said once."""
    m = _recording()
    if m is None:
        return
    try:
        write(m)
    except Exception:
        _failure()


def _failure() -> None:
    # A full disk under PROMETHEUS_MULTIPROC_DIR, say: said once, and the request goes on.
    part = current.runtime.part(Metrics)
    if not part.failed:
        part.failed = True
        logger.exception("django_throttle: a metric could not be recorded")


# -- hooks ------------------------------------------------------------------------------------


def decided(decision: DecisionLike) -> None:
    """Count a decision (free when metrics are off): see decision_counted()."""
    part = current.runtime.part(Metrics)
    if part.on:
        decision_counted(part, decision)


def decision_counted(part: Metrics, decision: DecisionLike) -> None:
    """decided() for a caller that holds its runtime's Metrics part, metrics on (the engine, on
    every decision): one increment per rule result, or one ``unavailable`` for a rule that
    fails closed while the store is down; and, of an admitted one, each rule result past
    NEAR_LIMIT_RATIO of its limit (log-only rules' included: a rule on trial shows how close
    it comes)."""
    m = part.instruments
    if m is None:
        return
    try:
        if decision.unavailable:
            if decision.rule is not None:
                m.count(m.decisions, decision.rule, UNAVAILABLE)
        else:
            near = part.most_remaining if decision.allowed else None
            m.count_results(m.decisions, decision.results, near)
    except Exception:
        _failure()


def store_timed(seconds: float) -> None:
    """Observe one call to the store."""
    part = current.runtime.part(Metrics)
    if part.on:
        store_observed(part, seconds)


def store_observed(part: Metrics, seconds: float) -> None:
    """store_timed() for a caller that holds its runtime's Metrics part, metrics on (the
    store, on every call)."""
    m = part.instruments
    if m is None:
        return
    try:
        m.observe_store(seconds)
    except Exception:
        _failure()


def store_state(available: Callable[[], bool]) -> None:
    """Show the breaker's state. ``available`` is read under a lock, so that of concurrent
    updates the last one shows the newest state."""
    _record(lambda m: m.show_available(available))


def fallback_decided(results: Iterable[ResultLike]) -> None:
    """Count rule results the local fallback decided (they are counted as decisions too)."""
    _record(lambda m: m.count_results(m.fallback_decisions, results))


def block_cache_hit(rule_name: str) -> None:
    """Count a rejection the block cache decided without calling the store."""
    # _recording() and _record() inlined: this is on the decision's path.
    part = current.runtime.part(Metrics)
    m = part.instruments if part.on else None
    if m is None:
        return
    try:
        m.count(m.block_cache_decisions, rule_name)
    except Exception:
        _failure()


def banned(kind: str) -> None:
    """Count a request refused because its client is banned (``kind``: ip, user, header, param)."""
    _record(lambda m: m.count(m.banned, kind))


def log_flushed(ok: bool) -> None:
    """Count a write of the rejection log to the database, done or failed."""
    _record(lambda m: m.count(m.log_flushes, FLUSH_OK if ok else FLUSH_ERROR))
