"""What some test groups need from the machine beyond the Python packages, and a one-line
report of the groups that cannot run here (scripts/test prints it before the run).

Outside CI such a group is skipped; under CI (``CI`` set) it fails, since .ci/run installs
what it needs."""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
SPECTRAL = Path(__file__).resolve().parent / "spectral" / "node_modules" / ".bin" / "spectral"

# group: (what it is, how to get what it needs)
GROUPS = {
    "browser": ("the browser tests", "apt-get install chromium"),
    "gettext": ("the catalogue test that runs makemessages", "apt-get install gettext"),
    "spectral": (
        "the OWASP rate-limit checks of the example project's schemas",
        "npm ci --prefix tests/spectral",
    ),
}


def missing(group: str) -> list[str]:
    """What the machine lacks for a group of tests; empty if it can run."""
    if group == "browser":
        lacks = [] if os.path.exists(CHROMIUM) else [CHROMIUM]
        if importlib.util.find_spec("playwright") is None:
            lacks.append("the playwright package")
        return lacks
    if group == "gettext":
        return [tool for tool in ("xgettext", "msgmerge") if shutil.which(tool) is None]
    if group == "spectral":
        return [] if SPECTRAL.exists() else [str(SPECTRAL.relative_to(Path.cwd().resolve()))]
    raise ValueError(group)


def require(group: str) -> None:
    """Skip the calling test if the machine cannot run its group (fail under CI)."""
    lacks = missing(group)
    if not lacks:
        return
    what, remedy = GROUPS[group]
    message = f"{what} need {' and '.join(lacks)} ({remedy})"
    if os.environ.get("CI"):
        pytest.fail(message + "; .ci/run installs it")
    pytest.skip(message)


def report() -> str:
    """One line naming the groups this machine cannot run, and why; empty if none."""
    parts = []
    for group, (what, remedy) in GROUPS.items():
        lacks = missing(group)
        if lacks:
            parts.append(f"{what} (no {' or '.join(lacks)}: {remedy})")
    return "Not run on this machine: " + "; ".join(parts) if parts else ""


if __name__ == "__main__":
    line = report()
    if line:
        print(line)
