"""Figures of the package's structure: module-level state, sync/async twins, lines, one request's path.

    .venv/bin/python scripts/structure.py            # every figure
    .venv/bin/python scripts/structure.py --list     # and what each counts, by name

The request's path needs a redis-server on PATH: one is started on a free port, a rule written
to a throwaway SQLite database, and the second request through ThrottleMiddleware traced.
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "django_throttle"

# Calls that make a mutable object (the package's own stateful classes are listed too).
MUTABLE_CALLS = frozenset(
    ("dict", "list", "set", "defaultdict", "OrderedDict", "deque", "Counter", "Lock", "RLock")
    + ("Condition", "Event", "Semaphore", "local", "WeakKeyDictionary", "WeakValueDictionary")
    + ("WeakSet",)
)
# Pure functions' memo caches (functools.lru_cache) are not counted: they change no behaviour.
IMMUTABLE_CALLS = frozenset(
    ("frozenset", "tuple", "MappingProxyType", "TypeVar", "Signal", "ContextVar")
)


def modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "migrations" not in p.parts)


def stateful_classes() -> set[str]:
    """The package's classes that are not frozen dataclasses and define an __init__ or slots."""
    found = set()
    for path in modules():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef):
                frozen = any("frozen=True" in ast.unparse(d) for d in node.decorator_list)
                methods = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
                if not frozen and "__init__" in methods:
                    found.add(node.name)
    return found


def module_state() -> list[str]:
    """Module-level names bound to a mutable object or rebound through ``global``."""
    stateful = stateful_classes()
    found = []
    for path in modules():
        tree = ast.parse(path.read_text())
        rebound = {n for node in ast.walk(tree) if isinstance(node, ast.Global) for n in node.names}
        for node in tree.body:
            if isinstance(node, ast.Assign):
                targets, value = node.targets, node.value
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                targets, value = [node.target], node.value
            else:
                continue
            for target in targets:
                if not isinstance(target, ast.Name):
                    continue
                mutable = isinstance(
                    value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)
                )
                if isinstance(value, ast.Call):
                    func = value.func
                    name = getattr(func, "id", None) or getattr(func, "attr", "")
                    mutable = name in MUTABLE_CALLS or (
                        name in stateful and name not in IMMUTABLE_CALLS
                    )
                if mutable or target.id in rebound:
                    where = path.relative_to(ROOT)
                    found.append(f"{where}:{node.lineno} {target.id}")
    return found


def _lines(node: ast.AST) -> int:
    return (node.end_lineno or node.lineno) - node.lineno + 1  # type: ignore[attr-defined]


def _functions(body: list[ast.stmt]) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    return {n.name: n for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def _async_twin(name: str, candidates: dict[str, ast.FunctionDef | ast.AsyncFunctionDef]):  # type: ignore[no-untyped-def]
    bare = name.lstrip("_")
    lead = name[: len(name) - len(bare)]
    return candidates.get(lead + "a" + bare)


def twins() -> list[tuple[str, int]]:
    """Sync/async pairs: ``f``/``af`` (or ``_f``/``_af``) side by side, and the methods of a
    class ``X`` with their namesakes (or ``a``-named) in ``AsyncX``; lines of both."""
    pairs = []
    for path in modules():
        tree = ast.parse(path.read_text())
        where = path.relative_to(ROOT)
        scopes = [("", tree.body)]
        classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
        scopes += [(f"{name}.", cls.body) for name, cls in classes.items()]
        for prefix, body in scopes:
            functions = _functions(body)
            for name, node in functions.items():
                other = _async_twin(name, functions)
                if isinstance(other, ast.AsyncFunctionDef) and not isinstance(
                    node, ast.AsyncFunctionDef
                ):
                    pairs.append((f"{where}:{prefix}{name}", _lines(node) + _lines(other)))
        for name, cls in classes.items():
            twin = classes.get("Async" + name)
            if twin is None:
                continue
            mine, theirs = _functions(cls.body), _functions(twin.body)
            for method, node in mine.items():
                other = theirs.get(method) or _async_twin(method, theirs)
                if other is not None:
                    pairs.append(
                        (f"{where}:{name}/Async{name}.{method}", _lines(node) + _lines(other))
                    )
    return pairs


def package_lines() -> tuple[int, int]:
    python = sum(len(p.read_text().splitlines()) for p in modules())
    lua = sum(len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.lua"))
    return python, lua


def request_path() -> tuple[list[str], list[str]]:
    """The package's files one throttled request enters, middleware to store and back: each
    entry into a file, and each move (a call from one of the package's files into another)."""
    sys.path.insert(0, str(ROOT))
    from tests.redis_server import RedisServer

    server = RedisServer(None)
    server.start()
    handle, database = tempfile.mkstemp(suffix=".sqlite3")
    os.close(handle)
    try:
        os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
        os.environ["THROTTLE_TEST_SQLITE"] = database
        import django
        from django.conf import settings

        settings.CACHES["default"]["LOCATION"] = server.url
        settings.DATABASES["default"]["NAME"] = database
        settings.MIDDLEWARE = [
            *settings.MIDDLEWARE,
            "django_throttle.middleware.ThrottleMiddleware",
        ]
        django.setup()
        from django.core.management import call_command
        from django.test import Client

        call_command("migrate", verbosity=0)
        from django_throttle.models import Rule

        Rule.objects.create(name="api", scope="/api/", limit=1000, per=1, unit="minute")
        client = Client()
        client.get("/api/items/")  # rules loaded, connections made, scripts known
        moves: list[str] = []
        entered: list[str] = []
        here = str(PACKAGE) + os.sep
        stack: list[str | None] = [None]

        def profile(frame, event, arg):  # type: ignore[no-untyped-def]
            name = frame.f_code.co_filename
            mine = name.startswith(here) and "migrations" not in name
            where = name[len(here) :] if mine else None
            if event in ("call", "c_call"):
                if event == "call":
                    caller = stack[-1]
                    if where is not None and where != caller and caller is not None:
                        moves.append(f"{caller} -> {where}")
                    if where is not None and where != caller:
                        entered.append(where)
                    stack.append(where if where is not None else caller)
            elif event == "return" and len(stack) > 1:
                stack.pop()

        sys.setprofile(profile)
        try:
            response = client.get("/api/items/")
        finally:
            sys.setprofile(None)
        assert response.status_code == 200, response.status_code
        return entered, moves
    finally:
        server.close()
        os.unlink(database)


def layers() -> dict[str, int]:
    """Each top-level module or package of the package -> its layer in the import-linter
    layers contract (pyproject.toml), 0 the top."""
    text = (ROOT / "pyproject.toml").read_text()
    listed = re.search(r"^layers = \[(.*?)^\]", text, re.MULTILINE | re.DOTALL)
    assert listed is not None, "pyproject.toml has no layers contract"
    groups = re.findall(r'"([^"]+)"', listed.group(1))
    return {name.strip(): depth for depth, group in enumerate(groups) for name in group.split("|")}


def climbs(moves: list[str]) -> list[str]:
    """The moves into a file of a higher layer than the file entered just before, within one
    call from the middleware (each of its hooks starts afresh: going back up into the
    response is not a climb)."""
    depth = layers()

    def layer(path: str) -> int:
        return depth[path.split("/")[0].removesuffix(".py")]

    found = []
    previous: int | None = None
    for move in moves:
        caller, callee = move.split(" -> ")
        if caller == "middleware.py":
            previous = layer(callee)
            continue
        if previous is not None and layer(callee) < previous:  # a smaller index is higher
            found.append(move)
        previous = layer(callee)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="name what each figure counts")
    parser.add_argument("--no-request", action="store_true", help="skip the request's path")
    options = parser.parse_args()
    state = module_state()
    pairs = twins()
    python, lua = package_lines()
    print(f"module-level mutable names: {len(state)}")
    if options.list:
        print("\n".join("  " + s for s in state))
    print(f"sync/async twins: {len(pairs)} pairs, {sum(n for _, n in pairs)} lines")
    if options.list:
        print("\n".join(f"  {n:4} {name}" for name, n in pairs))
    print(f"package lines (outside migrations): {python} Python, {lua} Lua")
    if not options.no_request:
        entered, moves = request_path()
        files = sorted(set(entered))
        print(f"one request through ThrottleMiddleware: {len(files)} files, {len(moves)} moves")
        counts = {f: entered.count(f) for f in files}
        print(
            "  entered: "
            + ", ".join(f"{f} {n}" for f, n in sorted(counts.items(), key=lambda x: -x[1]))
        )
        if options.list:
            print("\n".join("  " + m for m in moves))
        up = climbs(moves)
        print(f"  climbs back up a layer within a middleware hook: {len(up)}")
        if options.list:
            print("\n".join("    " + m for m in up))


if __name__ == "__main__":
    main()
