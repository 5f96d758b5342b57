"""Units of time and the ``"N/unit"`` and ``"N/<count><unit>"`` rate strings of ``@throttle``."""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import NamedTuple

from django.utils.translation import gettext, ngettext, pgettext

SECOND, MINUTE, HOUR, DAY, WEEK, MONTH = "second", "minute", "hour", "day", "week", "month"

# A week or a month is a calendar window (calendar_windows.py): its length in seconds varies
# with daylight saving and the month; the figure here is its nominal length (a month: the
# mean Gregorian month), for the window's size in headers and range checks.
UNIT_SECONDS: Mapping[str, int] = MappingProxyType(
    {
        SECOND: 1,
        MINUTE: 60,
        HOUR: 3600,
        DAY: 86400,
        WEEK: 7 * 86400,
        MONTH: 2_629_746,
    }
)
CALENDAR_UNITS = frozenset({WEEK, MONTH})

# Accepted spellings of a unit in a rate string, shortest first.
_UNIT_ALIASES: Mapping[str, str] = MappingProxyType(
    {
        "s": SECOND,
        "sec": SECOND,
        "second": SECOND,
        "m": MINUTE,
        "min": MINUTE,
        "minute": MINUTE,
        "h": HOUR,
        "hour": HOUR,
        "d": DAY,
        "day": DAY,
        "w": WEEK,
        "week": WEEK,
        "mo": MONTH,
        "month": MONTH,
    }
)


MAX_PER = 1_000_000  # units in one window
MAX_WINDOW = 10 * 366 * 86400  # seconds: ten years
_WINDOW_RE = re.compile(r"^\s*(\d+)?\s*([a-z]+)\s*$")


class Rate(NamedTuple):
    limit: int
    unit: str
    per: int = 1  # the window is ``per`` units long: 100 per 15 minutes

    @property
    def calendar(self) -> bool:
        """Whether the window is a calendar week or month (fixed window only)."""
        return self.unit in CALENDAR_UNITS

    @property
    def period(self) -> int:
        return self.per * UNIT_SECONDS[self.unit]

    def __str__(self) -> str:
        return (
            f"{self.limit}/{self.unit}" if self.per == 1 else f"{self.limit}/{self.per}{self.unit}"
        )


def describe(limit: int, per: int, unit: str) -> str:
    """``100 per 15 minutes``, ``5 per minute``: a rule's rate in words."""
    return gettext("%(limit)s per %(window)s") % {"limit": limit, "window": window_words(per, unit)}


def window_words(per: int, unit: str) -> str:
    """``minute``, ``15 minutes``: a window as it follows "per" (in the active language)."""
    if per == 1:
        words = {
            SECOND: pgettext("per ...", "second"),
            MINUTE: pgettext("per ...", "minute"),
            HOUR: pgettext("per ...", "hour"),
            DAY: pgettext("per ...", "day"),
            WEEK: pgettext("per ...", "week"),
            MONTH: pgettext("per ...", "month"),
        }
        return words.get(unit, unit)
    return count_of(per, unit)


def count_of(count: int, unit: str) -> str:
    """``1 hour``, ``15 minutes``: a number of units (in the active language)."""
    phrases = {
        SECOND: ngettext("%(n)d second", "%(n)d seconds", count),
        MINUTE: ngettext("%(n)d minute", "%(n)d minutes", count),
        HOUR: ngettext("%(n)d hour", "%(n)d hours", count),
        DAY: ngettext("%(n)d day", "%(n)d days", count),
        WEEK: ngettext("%(n)d week", "%(n)d weeks", count),
        MONTH: ngettext("%(n)d month", "%(n)d months", count),
    }
    return phrases.get(unit, f"%(n)d {unit}") % {"n": count}


def parse_rate(text: str) -> Rate:
    """Parse ``"30/m"``, ``"30/minute"``, ``"100/15m"``, ``"1000/6 hours"`` or ``"10000/month"``
    into a Rate; raise
    ValueError with a clear message."""
    count, sep, window = str(text).strip().partition("/")
    if not sep:
        raise ValueError(
            f"Rate {text!r} must look like '30/m' or '100/15m': a number, '/', an optional "
            "count and s, m, h, d, w or mo."
        )
    try:
        limit = int(count)
    except ValueError:
        raise ValueError(f"Rate {text!r} must start with a whole number of requests.") from None
    if limit < 1:
        raise ValueError(f"Rate {text!r} must allow at least one request.")
    match = _WINDOW_RE.match(window.lower())
    unit_name = None
    if match is not None:
        word = match.group(2)
        plural = len(word) > 3 and word.endswith("s")  # "hours", "mins"; never "ms"
        unit_name = _UNIT_ALIASES.get(word) or (_UNIT_ALIASES.get(word[:-1]) if plural else None)
    if match is None or unit_name is None:
        raise ValueError(f"Rate {text!r} has an unknown unit {window!r}; use s, m, h, d, w or mo.")
    per = int(match.group(1) or 1)
    if not 1 <= per <= MAX_PER or per * UNIT_SECONDS[unit_name] > MAX_WINDOW:
        raise ValueError(
            f"Rate {text!r}: a window lasts from 1 unit to {MAX_WINDOW // 86400} days."
        )
    return Rate(limit, unit_name, per)
