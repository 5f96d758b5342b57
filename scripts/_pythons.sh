# Sourced by scripts/lock and .ci/run: find the Pythons of the lock files besides the machine's.
# pyenv puts shims for every installed version on PATH that fail unless selected, so each
# candidate is asked to run.

find_python312plus() {
  local candidate
  for candidate in "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.13*/bin/python \
                   "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python \
                   "$(command -v python3.13)" "$(command -v python3.12)"; do
    if [ -x "$candidate" ] && "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
      echo "$candidate"
      return
    fi
  done
}

find_python310() {
  local candidate
  for candidate in "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.10*/bin/python "$(command -v python3.10)"; do
    if [ -x "$candidate" ] && "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 10))' 2>/dev/null; then
      echo "$candidate"
      return
    fi
  done
}
