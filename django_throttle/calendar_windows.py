"""Calendar windows (weeks from Monday, months from the 1st, in TIME_ZONE) as epoch seconds."""

from __future__ import annotations

from datetime import date, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from .rates import MONTH, WEEK

SPAN = 4  # window starts handed to decide.lua: the previous, this, the next and the one after
_FIRST_MONDAY = date(1970, 1, 5)  # weeks of ``per`` are counted from here: aligned in any zone


def time_zone(name: str) -> ZoneInfo:
    """The zone named ``name``; ValueError if there is none."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        raise ValueError(
            f"{name!r} is not a time zone name (use an IANA name such as 'Europe/Berlin')"
        ) from None


class CalendarWindows:
    """The windows of ``per`` weeks or months in one zone: a month rule's windows are the
    months, a rule of 3 months counts quarters (January, April, July, October)."""

    __slots__ = ("unit", "per", "zone", "_span")

    def __init__(self, unit: str, per: int, zone_name: str) -> None:
        if unit not in (WEEK, MONTH):
            raise ValueError(f"{unit!r} is not a calendar unit")
        self.unit = unit
        self.per = per
        self.zone = time_zone(zone_name)
        # (starts, encoded) around the last moment asked for; replaced whole, so a thread
        # never reads half of it.
        self._span: tuple[tuple[int, ...], str] | None = None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CalendarWindows) and (self.unit, self.per, self.zone) == (
            other.unit,
            other.per,
            other.zone,
        )

    def __hash__(self) -> int:
        return hash((self.unit, self.per, self.zone))

    def __repr__(self) -> str:
        return f"CalendarWindows({self.unit!r}, {self.per}, {self.zone.key!r})"

    def starts(self, moment: float) -> tuple[int, ...]:
        """The starts of SPAN consecutive windows, the second holding ``moment``."""
        return self._span_at(moment)[0]

    def encoded(self, moment: float) -> str:
        """``starts(moment)`` as decide.lua reads them: ``"s1:s2:s3:s4"``."""
        return self._span_at(moment)[1]

    def _span_at(self, moment: float) -> tuple[tuple[int, ...], str]:
        span = self._span
        if span is None or not span[0][1] <= moment < span[0][2]:
            number = self._number(moment)
            starts = tuple(self._start(number + k) for k in range(-1, SPAN - 1))
            span = self._span = (starts, ":".join(map(str, starts)))
        return span

    def window(self, moment: float) -> tuple[int, int]:
        """(start, end) in epoch seconds of the window holding ``moment``."""
        starts = self.starts(moment)
        return starts[1], starts[2]

    def _number(self, moment: float) -> int:
        """Which window holds ``moment``: windows are numbered from the epoch."""
        local = datetime.fromtimestamp(moment, self.zone).date()
        if self.unit == WEEK:
            return (local - _FIRST_MONDAY).days // (7 * self.per)
        return (local.year * 12 + local.month - 1) // self.per

    def _start(self, number: int) -> int:
        """The epoch second window ``number`` starts at: midnight, local time, of its first day
        (or the first moment after it, where a daylight-saving gap skips midnight)."""
        if self.unit == WEEK:
            day = _FIRST_MONDAY + timedelta(days=7 * self.per * number)
        else:
            year, month = divmod(number * self.per, 12)
            day = date(year, month + 1, 1)
        return int(datetime(day.year, day.month, day.day, tzinfo=self.zone).timestamp())
