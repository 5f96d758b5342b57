"""A real redis-server whose wall clock is moved (tests/native/clock_shift.c, built here with
the machine's C compiler): decisions at a month boundary or a daylight-saving change, with
time read where Redis reads it, not mocked in Python."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
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
