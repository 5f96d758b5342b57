"""What the rejection log keeps of a client or a rule name: text every database accepts."""

from __future__ import annotations

import re

from ..choices import KeyKind
from ..state_keys import digest

DISPLAY_VALUE_CHARS = 64
DISPLAY_CHARS = 100  # the length of Rejection.display
RULE_CHARS = 100  # the length of Rejection.rule
# Of a longer value only this much is looked at: a 1 MB header costs what a short one does.
_LOOKED_AT = 4 * DISPLAY_CHARS
OVERFLOW_KEY = "~other"  # never a digest, whose alphabet is A-Z a-z 0-9 - _
OVERFLOW_DISPLAY = "(other clients)"
UNKNOWN_IDENTITY = "unknown"
ELLIPSIS = "\u2026"

# C0 and C1 controls, zero-width and bidirectional formatting characters.
_HIDDEN = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")
_VALUE_KINDS = (KeyKind.HEADER, KeyKind.PARAM, KeyKind.CUSTOM)


def encodable(text: str) -> str:
    """The text with lone surrogates (``"\\udcff"`` from a JSON body) replaced by U+FFFD.

    UTF-8 cannot encode them, so a database driver refuses the whole statement. A pair of
    surrogates that spells a character becomes that character.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


def _visible(text: str, limit: int) -> tuple[str, bool]:
    """Up to ``limit`` visible, encodable characters of text, and whether some were cut."""
    head = text[:_LOOKED_AT]
    shown = encodable(_HIDDEN.sub("", head))
    return shown[:limit], len(text) > len(head) or len(shown) > limit


def display_of(identity: str) -> str:
    """The identity as the dashboard shows it: values cut short, invisible characters removed."""
    kind, sep, value = identity.partition(":")
    if sep and kind in _VALUE_KINDS:
        shown, cut = _visible(value, DISPLAY_VALUE_CHARS)
        return f"{kind}:{shown}{ELLIPSIS if cut else ''}"
    return _visible(identity, DISPLAY_CHARS)[0]


def storable_rule(name: str) -> str:
    """A rule's name as a row can hold it (a code default's scope may be any string)."""
    return encodable(name.replace("\x00", ""))[:RULE_CHARS]


def escaped(text: str, limit: int) -> str:
    """Plain ASCII, for a row the database refused as it was (its charset, a length)."""
    return text.replace("\x00", "").encode("ascii", "backslashreplace").decode("ascii")[:limit]


def is_complete(display: str, key: str) -> bool:
    """Whether a stored display form is the whole identity (so it can be inspected and reset)."""
    return key != OVERFLOW_KEY and digest(display) == key
