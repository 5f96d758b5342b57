"""The in-process rule cache: matching, zero queries per request, propagation, outages."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest
import redis
from django.conf import settings
from django.db import connection, connections, transaction
from django.test import Client, override_settings

from django_throttle import patterns
from django_throttle.conf import conf
from django_throttle.models import Rule
from django_throttle.rules import (
    CompiledRule,
    RedisVersion,
    RuleSet,
    compile_rule,
    get_rules,
    rule_cache,
)

pytestmark = pytest.mark.db_matters

ROOT = Path(__file__).resolve().parent.parent
MARGIN = 1.5  # seconds allowed on top of RULES_REFRESH for a change to show


def compiled(pk: int, scope: str, methods: str = "") -> CompiledRule:
    return compile_rule(Rule(pk=pk, name=f"r{pk}", scope=scope, methods=methods, limit=10))


def names(rules: Iterable[CompiledRule]) -> set[str]:
    return {rule.name for rule in rules}


def in_force() -> dict[str, int]:
    """Name -> limit of the rules this process enforces now."""
    return {rule.name: rule.limit for rule in get_rules().rules}


def wait_for(predicate: Callable[[], object], within: float) -> None:
    """Serve requests (get_rules) until predicate() is true; fail if not within `within` s."""
    deadline = time.monotonic() + within
    while True:
        get_rules()
        if predicate():
            return
        assert time.monotonic() < deadline, f"still false after {within} s"
        time.sleep(0.01)


def keep_calling(fn: Callable[[], object], refreshes: float = 3) -> list[object]:
    """Call fn repeatedly for this many RULES_REFRESH intervals; return what it returned."""
    results = []
    deadline = time.monotonic() + refreshes * conf.RULES_REFRESH
    while time.monotonic() < deadline:
        results.append(fn())
        time.sleep(0.005)
    return results


def errors_logged(caplog: pytest.LogCaptureFixture, text: str) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == "django_throttle" and r.levelno >= logging.ERROR and text in r.getMessage()
    ]


def warnings_logged(caplog: pytest.LogCaptureFixture, text: str) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == "django_throttle" and r.levelno == logging.WARNING and text in r.getMessage()
    ]


def version_token(redis_client: redis.Redis) -> bytes | None:
    return redis_client.get(RedisVersion().key)


def run_elsewhere(code: str, *args: str) -> str:
    """Run code in another Python process set up like this one (same settings, same Redis)."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    assert env["REDIS_URL"]  # the harness's server, which the other process must use too
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def raw_sql(sql: str, params: list[object]) -> None:
    """Write behind the ORM's back: no signal fires, nothing is announced."""
    table = connection.ops.quote_name(Rule._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(sql.format(table=table), params)


# -- matching -----------------------------------------------------------------


def test_star_scope_matches_every_path_and_method():
    rules = RuleSet([compiled(1, "*")])
    for path in ("/", "/api/x", "/admin/login/"):
        for method in ("GET", "POST", "DELETE"):
            assert names(rules.for_path(path, method)) == {"r1"}


def test_path_prefix_matches_paths_under_it_and_nothing_else():
    rules = RuleSet([compiled(1, "/api/")])
    assert names(rules.for_path("/api/x", "GET")) == {"r1"}
    assert names(rules.for_path("/api/", "GET")) == {"r1"}
    assert names(rules.for_path("/api/v1/users/7", "GET")) == {"r1"}
    assert rules.for_path("/apix", "GET") == []
    assert rules.for_path("/api", "GET") == []
    assert rules.for_path("/v1/api/x", "GET") == []
    assert rules.for_path("/", "GET") == []


def test_prefixes_of_different_lengths_all_match():
    rules = RuleSet(
        [
            compiled(1, "/a"),
            compiled(2, "/api/"),
            compiled(3, "/api/v1/"),
            compiled(4, "/api/"),  # two rules on one prefix
            compiled(5, "/zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz/"),  # longer than the paths below
        ]
    )
    assert names(rules.for_path("/api/v1/users", "GET")) == {"r1", "r2", "r3", "r4"}
    assert names(rules.for_path("/api/v2/", "GET")) == {"r1", "r2", "r4"}
    assert names(rules.for_path("/about", "GET")) == {"r1"}
    assert rules.for_path("/b", "GET") == []


def test_regex_scope_matches_from_the_start_of_the_path():
    rules = RuleSet([compiled(1, r"^/users/\d+/$"), compiled(2, "^/shop")])
    assert names(rules.for_path("/users/42/", "GET")) == {"r1"}
    assert rules.for_path("/users/x/", "GET") == []
    assert rules.for_path("/users/42/edit/", "GET") == []
    assert rules.for_path("/x/users/42/", "GET") == []
    assert names(rules.for_path("/shopping/cart", "GET")) == {"r2"}


def test_regexes_are_compiled_once_when_the_rule_set_is_built(monkeypatch):
    rules = RuleSet([compiled(1, r"^/users/\d+/$"), compiled(2, "^/shop"), compiled(3, "/x/")])
    assert [rule.name for rule in rules._regexes] == ["r1", "r2"]

    def no_compiling(*args, **kwargs):
        raise AssertionError("a regex was compiled while matching a request")

    for name in ("compile", "match", "search", "fullmatch"):
        monkeypatch.setattr(re, name, no_compiling)
        monkeypatch.setattr(patterns.re2, name, no_compiling)
    monkeypatch.setattr(patterns.re2, "Set", no_compiling)
    monkeypatch.setattr(patterns, "translate", no_compiling)
    assert names(rules.for_path("/users/7/", "GET")) == {"r1"}
    assert names(rules.for_path("/shop/", "GET")) == {"r2"}


def test_scopes_are_looked_up_as_written():
    rules = RuleSet(
        [compiled(1, "login"), compiled(2, "login"), compiled(3, "api:search"), compiled(4, "*")]
    )
    assert names(rules.for_scope("login", "POST")) == {"r1", "r2"}
    assert names(rules.for_scope("api:search", "GET")) == {"r3"}
    assert rules.for_scope("export", "GET") == []
    assert rules.has_scope("login")
    assert rules.has_scope("api:search")
    assert not rules.has_scope("export")
    # for_scope() finds a rule by its scope as written, whatever its form (reset("*", ...)).
    assert rules.has_scope("*")
    assert names(rules.for_scope("*")) == {"r4"}
    # A scope name is not a path: it is never matched against the request path.
    assert names(rules.for_path("/login", "POST")) == {"r4"}
    assert names(rules.for_path("login", "POST")) == {"r4"}


def test_rule_with_methods_applies_to_those_methods_only():
    rules = RuleSet(
        [
            compiled(1, "*", methods="POST"),
            compiled(2, "/api/", methods="POST,PUT"),
            compiled(3, "^/api/", methods="DELETE"),
            compiled(4, "login", methods="POST"),
        ]
    )
    assert rules.for_path("/api/x", "GET") == []
    assert names(rules.for_path("/api/x", "POST")) == {"r1", "r2"}
    assert names(rules.for_path("/api/x", "PUT")) == {"r2"}
    assert names(rules.for_path("/api/x", "DELETE")) == {"r3"}
    assert rules.for_scope("login", "GET") == []
    assert names(rules.for_scope("login", "POST")) == {"r4"}


# -- loading ------------------------------------------------------------------


@pytest.mark.django_db
def test_disabled_rules_are_not_loaded():
    Rule.objects.create(name="on", scope="/api/", limit=5)
    Rule.objects.create(name="off", scope="/api/", limit=1, enabled=False)
    Rule.objects.create(name="off-login", scope="login", limit=1, enabled=False)
    rules = get_rules()
    assert names(rules.rules) == {"on"}
    assert names(rules.for_path("/api/x", "GET")) == {"on"}
    assert not rules.has_scope("off-login")


@pytest.mark.django_db
def test_methods_written_with_spaces_by_a_bulk_update_still_apply():
    # QuerySet.update() skips Rule.clean(), so the stored text may not be normalised.
    Rule.objects.create(name="writes", scope="/api/", limit=5)
    Rule.objects.filter(name="writes").update(methods="post, put")
    rules = get_rules()
    assert names(rules.for_path("/api/x", "PUT")) == {"writes"}
    assert names(rules.for_path("/api/x", "POST")) == {"writes"}
    assert rules.for_path("/api/x", "GET") == []


@pytest.mark.django_db
@pytest.mark.parametrize(
    "key_functions",
    [{"tenant": "tests.keys.no_such_function"}, {}],
    ids=["not-importable", "unregistered"],
)
def test_rule_whose_key_function_is_gone_is_skipped_with_one_error(caplog, key_functions):
    Rule.objects.create(
        name="per-tenant", scope="/api/", key_kind="custom", key_arg="tenant", limit=5
    )
    Rule.objects.create(name="per-ip", scope="/api/", limit=50)
    Rule.objects.create(name="login", scope="login", limit=3)
    from tests.keys import tenant

    loaded = {rule.name: rule for rule in get_rules().rules}
    assert loaded["per-tenant"].key_function is tenant

    with override_settings(
        DJANGO_THROTTLE={**settings.DJANGO_THROTTLE, "KEY_FUNCTIONS": key_functions}
    ):
        for _ in range(20):
            rules = get_rules()
            assert names(rules.rules) == {"per-ip", "login"}
            assert names(rules.for_path("/api/x", "GET")) == {"per-ip"}
        skipped = errors_logged(caplog, "cannot be enforced")
        assert len(skipped) == 1
        assert "'per-tenant'" in skipped[0].getMessage()
        assert skipped[0].exc_info is not None


# -- steady state: no database query per request ------------------------------


@pytest.mark.django_db
def test_steady_state_makes_no_database_query(django_assert_num_queries, redis_client):
    Rule.objects.create(name="everything", scope="*", limit=100)
    Rule.objects.create(name="api", scope="/api/", limit=10)
    Rule.objects.create(name="login", scope="login", limit=3)
    get_rules()  # warm-up: the one load
    start = time.monotonic()
    redis_client.config_resetstat()

    with django_assert_num_queries(0):
        for _ in range(2000):
            rules = get_rules()
            assert names(rules.for_path("/api/x", "GET")) == {"everything", "api"}
            assert names(rules.for_scope("login", "POST")) == {"login"}
        # Across several RULES_REFRESH intervals in which nothing changes.
        for rules in keep_calling(get_rules, refreshes=3):
            assert names(rules.rules) == {"everything", "api", "login"}

    elapsed = time.monotonic() - start
    stats = redis_client.info("commandstats")
    # All it took was one MGET of the version and blocks token per refresh, not one per
    # request.
    reads = stats["cmdstat_mget"]["calls"]
    assert 2 <= reads <= elapsed / conf.RULES_REFRESH + 1
    others = {k for k in stats if not k.startswith(("cmdstat_info", "cmdstat_config"))}
    assert others == {"cmdstat_mget"}


# -- a change in this process -------------------------------------------------


def _create():
    Rule.objects.create(name="c", scope="/c/", limit=1)


def _save():
    rule = Rule.objects.get(name="a")
    rule.limit = 9
    rule.save()


def _disable():
    rule = Rule.objects.get(name="b")
    rule.enabled = False
    rule.save()


def _delete():
    Rule.objects.get(name="b").delete()


def _queryset_update():
    Rule.objects.filter(name="a").update(limit=2)


def _queryset_delete():
    Rule.objects.filter(name="b").delete()


def _bulk_create():
    Rule.objects.bulk_create(
        [Rule(name="c", scope="/c/", limit=1), Rule(name="d", scope="login", limit=4)]
    )


def _bulk_update():
    rules = list(Rule.objects.all())
    for rule in rules:
        rule.limit = 3
    Rule.objects.bulk_update(rules, ["limit"])


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("change", "expected"),
    [
        pytest.param(_create, {"a": 5, "b": 5, "c": 1}, id="create"),
        pytest.param(_save, {"a": 9, "b": 5}, id="save"),
        pytest.param(_disable, {"a": 5}, id="disable"),
        pytest.param(_delete, {"a": 5}, id="delete"),
        pytest.param(_queryset_update, {"a": 2, "b": 5}, id="queryset-update"),
        pytest.param(_queryset_delete, {"a": 5}, id="queryset-delete"),
        pytest.param(_bulk_create, {"a": 5, "b": 5, "c": 1, "d": 4}, id="bulk-create"),
        pytest.param(_bulk_update, {"a": 3, "b": 3}, id="bulk-update"),
    ],
)
def test_change_in_this_process_is_in_force_at_once_after_commit(change, expected, redis_client):
    Rule.objects.create(name="a", scope="/a/", limit=5)
    Rule.objects.create(name="b", scope="/b/", limit=5)
    assert in_force() == {"a": 5, "b": 5}
    before = version_token(redis_client)
    assert before is not None

    change()  # autocommit: committed when it returns

    assert in_force() == expected
    after = version_token(redis_client)
    assert after is not None and after != before  # announced to the other processes


@pytest.mark.django_db(transaction=True)
def test_change_inside_a_transaction_is_announced_when_it_commits(redis_client):
    Rule.objects.create(name="a", scope="/a/", limit=5)
    assert in_force() == {"a": 5}
    before = version_token(redis_client)
    with transaction.atomic():
        Rule.objects.filter(name="a").update(limit=1)
        Rule.objects.create(name="b", scope="/b/", limit=2)
        assert version_token(redis_client) == before  # not yet: it could still roll back
    assert version_token(redis_client) != before
    assert in_force() == {"a": 1, "b": 2}


# -- a change in another process ----------------------------------------------

BUMP_ELSEWHERE = """
import os, django
django.setup()
from django_throttle.rules import RedisVersion
RedisVersion().bump()
print(os.getpid())
"""


@pytest.mark.django_db
def test_change_announced_by_another_process_is_seen_within_rules_refresh():
    Rule.objects.create(name="a", scope="/a/", limit=5)
    Rule.objects.create(name="b", scope="/b/", limit=5, enabled=False)
    assert in_force() == {"a": 5}

    # Another process's write reaches the shared database without this process knowing...
    raw_sql("UPDATE {table} SET enabled = %s WHERE name = %s", [True, "b"])
    raw_sql('UPDATE {table} SET "limit" = %s WHERE name = %s', [1, "a"])
    # ...and is not picked up while the version stays the same: nothing re-reads the table.
    for rules in keep_calling(in_force, refreshes=2.5):
        assert rules == {"a": 5}

    other_pid = int(run_elsewhere(BUMP_ELSEWHERE))
    assert other_pid != os.getpid()

    wait_for(lambda: in_force() == {"a": 1, "b": 5}, within=conf.RULES_REFRESH + MARGIN)


WRITE_ELSEWHERE = """
import sys, django
from django.conf import settings
settings.DATABASES["default"]["NAME"] = sys.argv[1]  # the test database of the parent
django.setup()
from django_throttle.models import Rule
rule = Rule.objects.get(name="b")
rule.enabled = True
rule.save()
Rule.objects.filter(name="a").update(limit=1)
Rule.objects.create(name="c", scope="login", limit=2)
"""

SHARED_DATABASE = not (connection.vendor == "sqlite" and connection.is_in_memory_db())

if SHARED_DATABASE:  # e.g. THROTTLE_TEST_DB=postgres: another process can write the rules too

    @pytest.mark.django_db(transaction=True)
    def test_rule_written_by_another_process_is_seen_within_rules_refresh():
        Rule.objects.create(name="a", scope="/a/", limit=5)
        Rule.objects.create(name="b", scope="/b/", limit=5, enabled=False)
        assert in_force() == {"a": 5}

        run_elsewhere(WRITE_ELSEWHERE, connection.settings_dict["NAME"])

        expected = {"a": 1, "b": 5, "c": 2}
        wait_for(lambda: in_force() == expected, within=conf.RULES_REFRESH + MARGIN)
        assert names(get_rules().for_scope("login", "GET")) == {"c"}


# -- outages ------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_database_error_keeps_the_last_rules_and_is_logged_once(caplog):
    Rule.objects.create(name="a", scope="/a/", limit=5)
    assert in_force() == {"a": 5}
    raw_sql('UPDATE {table} SET "limit" = %s WHERE name = %s', [1, "a"])

    # The rule table cannot be read: every load raises a real DatabaseError.
    table = Rule._meta.db_table
    quote = connection.ops.quote_name
    moved = f"{table}_away"
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {quote(table)} RENAME TO {quote(moved)}")
    try:
        RedisVersion().bump()  # a refresh is due: the rules must be re-read
        for rules in keep_calling(in_force, refreshes=4):
            assert rules == {"a": 5}
        assert len(errors_logged(caplog, "could not load rules from the database")) == 1
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER TABLE {quote(moved)} RENAME TO {quote(table)}")

    wait_for(lambda: in_force() == {"a": 1}, within=conf.RULES_REFRESH + MARGIN)
    assert len(warnings_logged(caplog, "rules loaded again")) == 1
    assert len(errors_logged(caplog, "could not load rules from the database")) == 1


@pytest.mark.django_db
def test_redis_unreachable_keeps_the_last_rules_and_is_logged_once_per_outage(caplog, redis_server):
    Rule.objects.create(name="a", scope="/a/", limit=5)
    Rule.objects.create(name="login", scope="login", limit=3)
    assert in_force() == {"a": 5, "login": 3}

    for outage in (1, 2):
        redis_server.kill()
        for rules in keep_calling(get_rules, refreshes=3):  # no exception escapes
            assert names(rules.rules) == {"a", "login"}
            assert rules.has_scope("login")
        assert len(errors_logged(caplog, "could not read the rules version")) == outage

        redis_server.start()
        wait_for(
            lambda n=outage: len(warnings_logged(caplog, "rules version can be read again")) == n,
            within=conf.RULES_REFRESH + MARGIN,
        )

    # And changes announced through it are followed again.
    raw_sql('UPDATE {table} SET "limit" = %s WHERE name = %s', [1, "a"])
    RedisVersion().bump()
    wait_for(lambda: in_force() == {"a": 1, "login": 3}, within=conf.RULES_REFRESH + MARGIN)


@pytest.mark.django_db(transaction=True)
def test_change_committed_while_redis_is_down_is_announced_when_it_is_back(
    caplog, redis_server, redis_client
):
    Rule.objects.create(name="a", scope="/a/", limit=5)
    assert in_force() == {"a": 5}
    before = version_token(redis_client)
    assert before is not None

    redis_server.kill()
    Rule.objects.create(name="b", scope="/b/", limit=2)  # commits; the announce fails
    cache = rule_cache()
    assert cache.bump_pending
    # This process enforces its own change at once all the same.
    assert in_force() == {"a": 5, "b": 2}
    for rules in keep_calling(in_force, refreshes=3):  # retried at each refresh, quietly
        assert rules == {"a": 5, "b": 2}
    assert cache.bump_pending
    assert len(errors_logged(caplog, "could not announce a rule change")) == 1

    redis_server.start()  # empty, as after a crash without persistence
    wait_for(
        lambda: version_token(redis_client) is not None,
        within=conf.RULES_REFRESH + MARGIN,
    )
    assert not cache.bump_pending
    assert in_force() == {"a": 5, "b": 2}
    assert len(errors_logged(caplog, "could not announce a rule change")) == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("throttle_middleware")
def test_sixteen_threads_right_after_a_change_decide_on_the_new_rules(client, redis_client):
    """A rule enabled by another process: once RULES_REFRESH has passed, not one request of
    any thread is decided on the old rules (while one thread reloads, the others wait)."""
    Rule.objects.create(name="api", scope="/api/", limit=100, enabled=False)
    assert client.get("/api/items/").status_code == 200  # this process holds the old rules
    raw_sql("UPDATE {table} SET enabled = %s WHERE name = %s", [True, "api"])
    RedisVersion().bump()  # as the other process announces it
    time.sleep(conf.RULES_REFRESH * 1.5)
    barrier = threading.Barrier(16)
    admitted: list[int] = []

    def burst() -> None:
        mine = Client()
        barrier.wait()
        try:
            admitted.append(sum(mine.get("/api/items/").status_code == 200 for _ in range(10)))
        finally:
            connections.close_all()  # this thread's, opened by the one that reloads

    threads = [threading.Thread(target=burst) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(admitted) == 100


# -- a reload under way -------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_reload_runs_while_requests_are_decided_on_the_rules_in_force():
    """In a busy process, the request that finds a change starts the reload and goes on,
    as do the others, with the rules in force until the new ones are ready."""
    from django_throttle.rules import RuleCache, load_rules

    Rule.objects.create(name="a", scope="/a/", limit=5)
    loading, release = threading.Event(), threading.Event()
    now = [0.0]
    loads = []

    def loader(*args):
        loads.append(1)
        if len(loads) > 1:  # the reload: held until released
            loading.set()
            release.wait(5)
        return load_rules(*args)

    cache = RuleCache(RedisVersion(), loader=loader, clock=lambda: now[0])
    old = cache.get()
    Rule.objects.filter(name="a").update(limit=1)  # as another process would, announced
    now[0] += conf.RULES_REFRESH

    assert cache.get() is old  # found the change: the reload is not waited for...
    assert loading.wait(5)  # ...it runs meanwhile
    served = []
    for _ in range(3):  # however long it takes
        now[0] += conf.RULES_REFRESH
        served.append(cache.get())
    assert served == [old] * 3

    release.set()
    deadline = time.monotonic() + 10
    while cache.get() is old:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert {r.name: r.limit for r in cache.get().rules} == {"a": 1}
    assert len(loads) == 2


@pytest.mark.django_db(transaction=True)
def test_after_a_reload_failed_requests_still_go_on_while_it_is_retried():
    """A reload that failed (the database down) is retried at the next refresh, again beside
    the requests: none of them waits on the database meanwhile."""
    from django.db import OperationalError

    from django_throttle.rules import RuleCache, load_rules

    Rule.objects.create(name="a", scope="/a/", limit=5)
    now = [0.0]
    loads: list[threading.Thread] = []
    failing = [False]

    def loader(*args):
        loads.append(threading.current_thread())
        if failing[0]:
            raise OperationalError("the database is down")
        return load_rules(*args)

    cache = RuleCache(RedisVersion(), loader=loader, clock=lambda: now[0])
    old = cache.get()
    Rule.objects.filter(name="a").update(limit=1)
    failing[0] = True
    for _ in range(3):  # each refresh finds the change and tries again: the load fails
        now[0] += conf.RULES_REFRESH
        assert cache.get() is old
        deadline = time.monotonic() + 5
        while cache._reloading:
            assert time.monotonic() < deadline
            time.sleep(0.01)
    assert len(loads) == 4
    assert all(thread is not threading.main_thread() for thread in loads[1:])


@pytest.mark.django_db(transaction=True)
def test_a_process_idle_since_a_change_waits_for_the_new_rules():
    """Its rules are more than a quarter of RULES_REFRESH overdue: the request that finds the
    change loads it before deciding."""
    from django_throttle.rules import RuleCache, load_rules

    Rule.objects.create(name="a", scope="/a/", limit=5)
    now = [0.0]
    cache = RuleCache(RedisVersion(), loader=load_rules, clock=lambda: now[0])
    old = cache.get()
    Rule.objects.filter(name="a").update(limit=1)
    now[0] += conf.RULES_REFRESH * 1.3
    rules = cache.get()
    assert rules is not old and {r.name: r.limit for r in rules.rules} == {"a": 1}


@pytest.mark.parametrize("prefix", ["thr", "site-1", "{tenant}"])
def test_the_blocks_token_lives_beside_the_version_under_key_prefix(settings, prefix):
    """One MGET reads both on a Redis Cluster too (one slot), and an ACL user limited to
    KEY_PREFIX's keys reaches both."""
    from redis.crc import key_slot

    settings.DJANGO_THROTTLE = {**settings.DJANGO_THROTTLE, "KEY_PREFIX": prefix}
    version = RedisVersion()
    assert version.key.startswith(prefix + ":") and version.blocks_key.startswith(prefix + ":")
    assert key_slot(version.key.encode()) == key_slot(version.blocks_key.encode())
    assert version.key != version.blocks_key
