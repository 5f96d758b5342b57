"""Command arguments in the Redis wire format (RESP): framed once, joined per request."""

from __future__ import annotations


def bulk(*values: str | int) -> bytes:
    """Each value as a RESP bulk string, as every client sends command arguments."""
    out = []
    for value in values:
        data = str(value).encode("utf-8", "surrogatepass")
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


def array(length: int) -> bytes:
    """The head of a command of ``length`` arguments."""
    return b"*%d\r\n" % length
