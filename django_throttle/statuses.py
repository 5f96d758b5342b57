"""The statuses a rule counts (``count_statuses``): ``"401,403"``, ``"4xx"``, ``"5xx,429"``.

Compiled once into a set of every status it names, classes spelled out, so deciding whether a
response counts is one membership test."""

from __future__ import annotations

LOWEST, HIGHEST = 100, 599  # RFC 9110 statuses: three digits, 1xx to 5xx
_CLASSES = frozenset("12345")


def status_items(text: str) -> list[str]:
    """The items of a ``count_statuses`` text, as a rule keeps them: stripped, lower case,
    each once, empty ones dropped (``" 401, 4XX,,401"``: ``["401", "4xx"]``)."""
    items = (item.strip().lower() for item in (text or "").split(","))
    return list(dict.fromkeys(item for item in items if item))


def is_status_number(item: str) -> bool:
    """Whether an item is written as a number (a wrong one is out of range, not unreadable)."""
    return item.isascii() and item.isdigit()


def item_statuses(item: str) -> range:
    """The statuses one item names (``"401"``, ``"4xx"``); ValueError if it names none."""
    if len(item) == 3 and item[0] in _CLASSES and item[1:] == "xx":
        start = int(item[0]) * 100
        return range(start, start + 100)
    if is_status_number(item):
        status = int(item)
        if LOWEST <= status <= HIGHEST:
            return range(status, status + 1)
        raise ValueError(f"{item} is not an HTTP status: statuses run from {LOWEST} to {HIGHEST}")
    raise ValueError(f"{item!r} is neither an HTTP status (401) nor a class of statuses (4xx)")


def parse_statuses(text: str) -> frozenset[int] | None:
    """Every status ``text`` names (None when it is empty: every response counts);
    ValueError for an item that names none."""
    items = status_items(text)
    if not items:
        return None
    return frozenset(status for item in items for status in item_statuses(item))


def shown(text: str) -> str:
    """``count_statuses`` as a sentence shows it: ``401, 403``."""
    return ", ".join(status_items(text))
