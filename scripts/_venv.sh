# Sourced by scripts/test and scripts/demo: make (or reuse) a virtual environment with the
# project installed at the versions of a lock file, and redis-server on the machine.
# Set PYTHON, VENV and LOCK (a file of constraints/, made by scripts/lock) to vary.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON="${PYTHON:-python3}"
VENV="${VENV:-.venv}"
EXTRAS="${EXTRAS:-test,dev}"
LOCK="${LOCK:-constraints/django52.txt}"

if ! command -v redis-server >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "Installing redis-server (Debian package)..." >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
  else
    echo "redis-server is needed: install it (Debian/Ubuntu: sudo apt-get install redis-server)." >&2
    exit 1
  fi
fi

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
# Through the environment, the lock also binds the build of the editable install (hatchling).
export PIP_CONSTRAINT="$PWD/$LOCK"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check pip  # the lock's pip
"$VENV/bin/python" -m pip install -q --disable-pip-version-check -e ".[$EXTRAS]"
