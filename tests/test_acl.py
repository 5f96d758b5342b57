"""The ACL users of docs/deploying.md can do everything django-throttle does, and no more is
needed: each is applied as written there, then every algorithm decides, a rule change is
announced, a key is reset, across cluster slots too."""

from __future__ import annotations

import re
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster

from django_throttle import block_key, check, check_key, refund, refund_key
from django_throttle.compiled import build_rule
from django_throttle.rules.cache import RedisVersion
from django_throttle.store import Check, ClusterStore, get_store
from django_throttle.store.redis import DECIDE_SHA
from tests.engine_helpers import ALGORITHMS
from tests.helpers import rule
from tests.redis_server import RedisServer
from tests.redis_topology import ClusterHarness, SentinelGroup

DOC = Path(__file__).resolve().parent.parent / "docs" / "deploying.md"
PASSWORD = "change-me"


def acl_lines() -> list[list[str]]:
    """The ``ACL SETUSER throttle ...`` lines of the guide, as arguments after ``ACL``."""
    lines = re.findall(r"^ACL SETUSER throttle .*$", DOC.read_text(), flags=re.M)
    assert len(lines) == 2, "docs/deploying.md gives one user for a primary, one for a cluster"
    return [line.split()[1:] for line in lines]


def set_user(port: int, arguments: list[str]) -> None:
    with closing(redis.Redis(port=port, socket_timeout=5)) as admin:
        admin.execute_command("ACL", *arguments)


def denied(port: int) -> list[Any]:
    with closing(redis.Redis(port=port, socket_timeout=5)) as admin:
        return list(admin.execute_command("ACL", "LOG"))


@pytest.mark.django_db
def test_the_primary_user_is_enough(settings: Any, rf: Any, redis_server: RedisServer) -> None:
    if not redis_server.managed:
        pytest.skip("changes the users of a redis-server the harness runs; unset REDIS_URL")
    single, _ = acl_lines()
    set_user(redis_server.port, single)
    try:
        url = f"redis://throttle:{PASSWORD}@127.0.0.1:{redis_server.port}/0"
        settings.CACHES = {
            **settings.CACHES,
            "default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": url},
        }
        for n, algorithm in enumerate(ALGORITHMS):
            rule(f"r{n}", f"scope{n}", 2, algorithm=algorithm, fail_mode="closed", block_seconds=60)
            rule(f"g{n}", f"given{n}", 1, algorithm=algorithm, fail_mode="closed")
        rule("leases", "leases", 1, algorithm="concurrency")
        RedisVersion().bump()
        with closing(redis.Redis(port=redis_server.port)) as admin:
            admin.script_flush()  # the first decision runs the script with EVAL
        for n in range(len(ALGORITHMS)):
            decisions = [check(rf.get("/"), f"scope{n}") for _ in range(3)]
            assert [d.allowed for d in decisions] == [True, True, False]
            assert not decisions[-1].unavailable  # rejected by the limit, not by a refusal
        for n in range(len(ALGORITHMS)):  # refunds: of a decision, and of the newest state
            request = rf.get("/")
            assert check(request, f"given{n}").allowed
            assert refund(request, f"given{n}") == 1
            assert check(rf.get("/"), f"given{n}").allowed  # the unit was given back
            assert refund_key(f"given{n}", "ip:127.0.0.1") == 1
            assert check(rf.get("/"), f"given{n}", dry_run=True).allowed
        assert check_key("leases", "job:1").allowed
        assert refund_key("leases", "job:1") == 1
        assert check_key("leases", "job:1").allowed  # the slot was given back
        assert block_key("given0", "ip:192.0.2.1", 60) == 1  # the held key, then the block
        assert not check_key("given0", "ip:192.0.2.1").allowed
        store = get_store().backend()
        limit = build_rule(id=99, name="x", algorithm="fixed_window", limit=1, period=60)
        store.decide([Check(limit, "ip:1")])
        store.reset(limit, "ip:1")
        assert store.decide([Check(limit, "ip:1")])[0].allowed
        assert denied(redis_server.port) == []
    finally:
        with closing(redis.Redis(port=redis_server.port)) as admin:
            admin.execute_command("ACL", "DELUSER", "throttle")
            admin.execute_command("ACL", "LOG", "RESET")


@pytest.mark.django_db
def test_a_user_without_eval_still_reloads_the_script(
    settings: Any, rf: Any, redis_server: RedisServer
) -> None:
    """The guide's user before it allowed EVAL: after NOSCRIPT the script is loaded, then
    run, in two round trips."""
    if not redis_server.managed:
        pytest.skip("changes the users of a redis-server the harness runs; unset REDIS_URL")
    single, _ = acl_lines()
    set_user(redis_server.port, [a for a in single if a != "+eval"])
    try:
        url = f"redis://throttle:{PASSWORD}@127.0.0.1:{redis_server.port}/0"
        settings.CACHES = {
            **settings.CACHES,
            "default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": url},
        }
        rule("r", "scope", 2, algorithm="fixed_window", fail_mode="closed")
        with closing(redis.Redis(port=redis_server.port)) as admin:
            admin.script_flush()
            decisions = [check(rf.get("/"), "scope") for _ in range(3)]
            assert [d.allowed for d in decisions] == [True, True, False]
            assert not decisions[-1].unavailable
            assert admin.script_exists(DECIDE_SHA) == [True]
        assert denied(redis_server.port) != []  # EVAL, refused: then SCRIPT LOAD and EVALSHA
    finally:
        with closing(redis.Redis(port=redis_server.port)) as admin:
            admin.execute_command("ACL", "DELUSER", "throttle")
            admin.execute_command("ACL", "LOG", "RESET")


@pytest.mark.topology
def test_the_cluster_user_is_enough() -> None:
    _, clustered = acl_lines()
    with ClusterHarness() as cluster:
        for node in cluster.alive:
            set_user(node.port, clustered)
        port = cluster.alive[0].port
        store = ClusterStore(RedisCluster.from_url(f"redis://throttle:{PASSWORD}@127.0.0.1:{port}"))
        try:
            for n, algorithm in enumerate(ALGORITHMS, 1):
                limit = build_rule(
                    id=n, name=f"r{n}", algorithm=algorithm, limit=2, period=60, block=60
                )
                tight = build_rule(
                    id=50 + n, name="t", algorithm="fixed_window", limit=1, period=60
                )
                # Two slots, the second rejecting from the second call on: refunds run too.
                outcomes = [
                    [r.allowed for r in store.decide([Check(limit, "ip:1"), Check(tight, "u:7")])]
                    for _ in range(3)
                ]
                assert outcomes == [[True, True], [True, False], [True, False]]
                store.reset(limit, "ip:1")
            store.client.set("thr:rules:version", "v")
            assert all(denied(node.port) == [] for node in cluster.alive)
        finally:
            store.close()


@pytest.mark.topology
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("info", [True, False], ids=["with-info", "without-info"])
def test_the_fence_needs_info_beside_the_primary_user(settings: Any, info: bool) -> None:
    """With the fence of docs/deploying.md (a Sentinel group, min-replicas-to-write on the
    primary) the primary's user also needs +info, as the guide says: a decision refused with
    NOREPLICAS finds the promoted server by reading INFO replication. With it, every
    decision through a SENTINEL FAILOVER is made and the servers deny the user nothing;
    without it, the first decision after the promotion follows its fail mode."""
    single, _ = acl_lines()
    with SentinelGroup(service_name=f"aclfence{int(info)}", fenced=True) as group:
        for server in group.servers:  # ACLs are not replicated: every data node gets the user
            set_user(server.port, [*single, *(["+info"] if info else [])])
        settings.CACHES = {
            **settings.CACHES,
            "default": {
                "BACKEND": "django_redis.cache.RedisCache",
                "LOCATION": f"redis://throttle:{PASSWORD}@{group.service_name}/0",
                "OPTIONS": {
                    "CONNECTION_FACTORY": "django_redis.pool.SentinelConnectionFactory",
                    "SENTINELS": group.sentinels,
                },
            },
        }
        settings.DJANGO_THROTTLE = {
            **settings.DJANGO_THROTTLE,
            "RULES_REFRESH": 3600.0,  # the promoted server found from NOREPLICAS alone
            "FLUSH_INTERVAL": 3600.0,
            "BLOCK_CACHE": False,
        }
        rule("fenced", "fenced", 1000, unit="hour", fail_mode="closed", algorithm="fixed_window")
        assert check_key("fenced", "acme").allowed
        group.failover()
        after = [check_key("fenced", "acme") for _ in range(3)]
        refused = []
        for server in group.servers:
            with closing(redis.Redis(port=server.port, socket_timeout=5)) as admin:
                refused += admin.acl_log()
    if info:
        assert [d.allowed for d in after] == [True] * 3
        assert refused == []
    else:
        assert after[0].unavailable
        assert refused and {entry["object"] for entry in refused} == {"info"}
