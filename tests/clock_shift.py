"""A real redis-server whose wall clock is moved (tests/native/clock_shift.c, built here with
the machine's C compiler): decisions at a month boundary or a daylight-saving change, with
time read where Redis reads it, not mocked in Python."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SOURCE = Path(__file__).resolve().parent / "native" / "clock_shift.c"


@functools.cache
def library() -> str:
    """The shared library, compiled once per test session."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError("a C compiler (cc or gcc) is needed to build tests/native/clock_shift.c")
    target = Path(tempfile.mkdtemp(prefix="clock-shift-")) / "clock_shift.so"
    subprocess.run(
        [compiler, "-shared", "-fPIC", "-O2", "-o", str(target), str(SOURCE)],
        check=True,
        capture_output=True,
    )
    return str(target)


def shifted(seconds: float) -> dict[str, str]:
    """The environment of a process whose wall clock runs ``seconds`` ahead (or behind)."""
    return {
        **os.environ,
        "LD_PRELOAD": library(),
        "CLOCK_SHIFT_US": str(round(seconds * 1_000_000)),
    }


class MovableClock:
    """The wall clock of processes started with ``env()``, moved forward while they run:
    ``advance(60)`` and a real redis-server's TIME and key expiry are a minute later."""

    def __init__(self) -> None:
        handle, self.path = tempfile.mkstemp(prefix="clock-shift-")
        os.write(handle, (0).to_bytes(8, sys.byteorder, signed=True))
        os.close(handle)
        self.us = 0

    def env(self) -> dict[str, str]:
        return {**shifted(0), "CLOCK_SHIFT_FILE": self.path}

    def advance(self, seconds: float) -> None:
        self.us += round(seconds * 1_000_000)
        with open(self.path, "r+b") as file:
            file.write(self.us.to_bytes(8, sys.byteorder, signed=True))

    def close(self) -> None:
        os.unlink(self.path)
