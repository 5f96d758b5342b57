"""Units of time and the ``"N/unit"`` rate strings of the ``@throttle`` decorator."""

from __future__ import annotations

from typing import NamedTuple

SECOND, MINUTE, HOUR, DAY = "second", "minute", "hour", "day"

UNIT_SECONDS: dict[str, int] = {SECOND: 1, MINUTE: 60, HOUR: 3600, DAY: 86400}

# Accepted spellings of a unit in a rate string, shortest first.
_UNIT_ALIASES: dict[str, str] = {
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
}


class Rate(NamedTuple):
    limit: int
    unit: str

    @property
    def period(self) -> int:
        return UNIT_SECONDS[self.unit]

    def __str__(self) -> str:
        return f"{self.limit}/{self.unit}"


def parse_rate(text: str) -> Rate:
    """Parse ``"30/m"`` (also ``"30/minute"``) into a Rate; raise ValueError with a clear message."""
    count, sep, unit = str(text).strip().partition("/")
    if not sep:
        raise ValueError(f"Rate {text!r} must look like '30/m': a number, '/', and s, m, h or d.")
    try:
        limit = int(count)
    except ValueError:
        raise ValueError(f"Rate {text!r} must start with a whole number of requests.") from None
    if limit < 1:
        raise ValueError(f"Rate {text!r} must allow at least one request.")
    unit_name = _UNIT_ALIASES.get(unit.strip().lower())
    if unit_name is None:
        raise ValueError(f"Rate {text!r} has an unknown unit {unit!r}; use s, m, h or d.")
    return Rate(limit, unit_name)
