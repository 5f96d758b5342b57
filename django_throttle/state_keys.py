"""How keys look in the store: state ``thr:<rule><algorithm>:{<digest of the client>}``, a
block ``thr:<rule>:<digest of its name>:{<digest of the client>}:b``."""

from __future__ import annotations

import base64
import functools
import hashlib
from collections.abc import Mapping
from types import MappingProxyType

from .choices import Algorithm
from .conf import conf

ALGORITHM_CODES: Mapping[str, str] = MappingProxyType(
    {
        Algorithm.FIXED_WINDOW: "f",
        Algorithm.SLIDING_WINDOW_LOG: "l",
        Algorithm.SLIDING_WINDOW_COUNTER: "c",
        Algorithm.TOKEN_BUCKET: "t",
        Algorithm.LEAKY_BUCKET: "b",
        Algorithm.CONCURRENCY: "n",
    }
)

CALENDAR_CODE = "k"  # decide.lua's code of a fixed window of weeks or months (state: "f")
BLOCK_SUFFIX = ":b"  # ends a block key (cluster.py tells one from a state key by it)
# After a state prefix's algorithm letter, the state of a rule's counted outcomes (compiled.
# outcomes_rule()): no algorithm's letter, so no rule's state prefix ends so.
OUTCOMES_MARK = "o"
DIGEST_BYTES = 9  # 72 bits: 12 characters of base64, collision-free for any realistic client count


def same_slot(key: str, suffix: str) -> str:
    """A key beside ``key`` in its Redis Cluster slot (one MGET reads both), under
    KEY_PREFIX (an ACL user's key pattern covers it)."""
    start = key.find("{")
    if start != -1 and key.find("}", start + 2) != -1:
        return f"{key}:{suffix}"  # key's own hash tag places both
    # A key without a tag hashes whole, as this tag does.
    return f"{conf.KEY_PREFIX}:{{{key}}}:{suffix}"


def version_key() -> str:
    """The rules version: a token every process reads each RULES_REFRESH."""
    return f"{conf.KEY_PREFIX}:rules:version"


def held_key() -> str:
    """Lives as long as the longest block written by block.lua (``block_key()``, the
    dashboard's Block): while it does, every decision reads every rule's block key. Read
    with the rules version (its slot)."""
    return same_slot(version_key(), "held")


def state_prefix(rule_key: str, algorithm: str) -> str:
    """``thr:12f:``: the key prefix of one rule's per-client state.

    The algorithm's letter keeps state of another shape apart when a rule's
    algorithm is changed.
    """
    return f"{conf.KEY_PREFIX}:{rule_key}{ALGORITHM_CODES[algorithm]}:"


def block_prefix(rule_key: str, name: str) -> str:
    """``thr:12:AbCd0123:``: the key prefix of one rule's blocks of clients.

    Without the algorithm's letter, so a block outlives a change of the rule's algorithm or
    limit (its state does not); with its name, so renaming the rule ends its blocks, as
    deleting it does. A state prefix has a letter before its colon and is followed by the
    client's tag: no block key is ever a state key.
    """
    named = hashlib.blake2b(name.encode("utf-8", "surrogatepass"), digest_size=6).digest()
    return f"{conf.KEY_PREFIX}:{rule_key}:{base64.urlsafe_b64encode(named).decode('ascii')}:"


@functools.lru_cache(maxsize=16_384)  # clients come back: a hash per client, not per request
def client_tag(identity: str) -> str:
    """``{AbCd0123-_xy}``: the part of a state key that names the client, a hash tag."""
    return "{" + digest(identity) + "}"


def digest(identity: str) -> str:
    """A fixed-length, key-safe digest of a client identity, whatever its length or characters."""
    raw = hashlib.blake2b(identity.encode("utf-8", "surrogatepass"), digest_size=DIGEST_BYTES)
    return base64.urlsafe_b64encode(raw.digest()).decode("ascii")


def base36(number: int) -> str:
    """A rule's primary key as it appears in its state keys (short, for the hot path)."""
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        number, rest = divmod(number, 36)
        out = digits[rest] + out
        if not number:
            return out
