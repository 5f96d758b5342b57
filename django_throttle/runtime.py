"""The process's state in one object, built on first use and replaced whole when settings change.

Like ``django.db.connections``: code asks the runtime in force for its part (the store, the rule
cache...) instead of keeping a module global; a test resets everything by replacing it."""

from __future__ import annotations

import threading
from typing import Any, TypeVar

from django.core.signals import setting_changed

P = TypeVar("P")

# Settings whose change replaces the runtime: what every part is built from.
SETTINGS = frozenset({"DJANGO_THROTTLE", "CACHES"})


class Runtime:
    """One instance of each part of this process's state, and the settings' values in force.

    A part may define ``handover(successor)``, called when the runtime is replaced, to pass on
    what settings do not make (rejection counts not yet written; with ``from_code`` True on its
    class, what code registered at import, handed on even to a fresh runtime), and ``close()``,
    called once its runtime is replaced.
    """

    __slots__ = ("_lock", "_parts", "settings")

    def __init__(self) -> None:
        self.settings: dict[str, Any] = {}  # conf's values, read from the settings once each
        self._parts: dict[type[Any], Any] = {}
        # Reentrant: a part's constructor may ask for another part.
        self._lock = threading.RLock()

    def part(self, kind: type[P]) -> P:
        """This runtime's instance of ``kind``, made on first use."""
        try:
            return self._parts[kind]  # type: ignore[no-any-return]
        except KeyError:
            pass
        with self._lock:
            part = self._parts.get(kind)
            if part is None:
                part = self._parts[kind] = kind()
            return part

    def put(self, part: object) -> None:
        """Make ``part`` this runtime's instance of its class (a benchmark's own rule cache)."""
        with self._lock:
            self._parts[type(part)] = part

    def built(self, kind: type[P]) -> P | None:
        """This runtime's instance of ``kind`` if it was made already (never makes one)."""
        return self._parts.get(kind)

    def _handover(self, successor: Runtime, state: bool) -> None:
        with self._lock:
            parts = list(self._parts.values())
        for part in parts:
            handover = getattr(part, "handover", None)
            if handover is not None and (state or getattr(part, "from_code", False)):
                handover(successor)

    def close(self) -> None:
        with self._lock:
            parts, self._parts = list(self._parts.values()), {}
        for part in reversed(parts):  # the last made may use the first (the store)
            close = getattr(part, "close", None)
            if close is not None:
                close()


class Current:
    """The one mutable binding of the package: which runtime is in force (``current.runtime``
    is what ``runtime()`` returns, read without a call where every request reads it)."""

    __slots__ = ("lock", "runtime")

    def __init__(self) -> None:
        self.runtime = Runtime()
        self.lock = threading.Lock()


current = Current()


def runtime() -> Runtime:
    """The runtime in force."""
    return current.runtime


def replace_runtime(handover: bool = True) -> Runtime:
    """Put a new runtime in force and close the old one; with ``handover`` its parts pass on
    what they keep across a settings change (tests pass False to start afresh: only what code
    registered at import is kept)."""
    with current.lock:
        old, new = current.runtime, Runtime()
        old._handover(new, state=handover)
        current.runtime = new
    old.close()
    return new


def _settings_changed(setting: str, **kwargs: Any) -> None:
    if setting in SETTINGS:
        replace_runtime()


setting_changed.connect(_settings_changed, dispatch_uid="django_throttle.runtime")
