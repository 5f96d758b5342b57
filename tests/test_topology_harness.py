"""The topology harness itself (tests/redis_topology.py), seen through plain redis-py clients:
the proxy, a switchover, a Sentinel failover and a cluster losing a master."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from contextlib import closing

import pytest
import redis
import redis.cluster
import redis.sentinel
from redis.backoff import NoBackoff
from redis.exceptions import ReadOnlyError
from redis.retry import Retry

from tests import redis_topology
from tests.redis_server import RedisServer
from tests.redis_topology import ClusterHarness, ReplicatedRedis, SentinelGroup, TcpProxy

pytestmark = pytest.mark.topology


def connect(port: int) -> redis.Redis:
    """A client without silent retries: used one command at a time, it keeps one connection
    (opened by its first command), so what that connection talks to stays visible."""
    return redis.Redis(
        host="127.0.0.1",
        port=port,
        socket_timeout=5,
        retry=Retry(NoBackoff(), 0),
        decode_responses=True,
    )


def served_by(client: redis.Redis) -> int:
    """The port of the server at the other end of the client's connection (through a proxy)."""
    return int(client.info("server")["tcp_port"])


@pytest.fixture(scope="module")
def two_servers() -> Iterator[tuple[RedisServer, RedisServer]]:
    first, second = RedisServer(), RedisServer()
    try:
        first.start()
        second.start()
        yield first, second
    finally:
        first.close()
        second.close()


@pytest.fixture(scope="module")
def sentinel_group() -> Iterator[SentinelGroup]:
    with SentinelGroup() as group:
        yield group


@pytest.fixture(scope="module")
def cluster() -> Iterator[ClusterHarness]:
    with ClusterHarness() as harness:
        yield harness


# -- proxy ----------------------------------------------------------------------------------


def test_proxy_switch_moves_only_new_connections(two_servers):
    first, second = two_servers
    with TcpProxy(first.port) as proxy, closing(connect(proxy.port)) as before:
        assert proxy.url == f"redis://127.0.0.1:{proxy.port}/0"
        assert served_by(before) == first.port
        proxy.switch(second.port)
        assert served_by(before) == first.port  # still the old target
        with closing(connect(proxy.port)) as after:
            assert served_by(after) == second.port
            assert proxy.connections == 2
            ids = [client.client_id() for client in (before, after)]
            proxy.drop_all()
            assert proxy.connections == 0
            # redis-py finds its idle connection closed and opens a new one, to the new target.
            assert served_by(before) == second.port
            assert [client.client_id() for client in (before, after)] != ids


def test_proxy_to_a_dead_target_closes_the_connection(two_servers):
    dead = RedisServer()  # never started: nothing listens on its port
    dead.close()
    with TcpProxy(dead.port) as proxy, closing(connect(proxy.port)) as client:
        with pytest.raises(redis.ConnectionError):
            client.ping()
        proxy.switch(two_servers[0].port)
        assert client.ping()  # reconnects, to the new target


def test_proxy_holds_what_a_slow_reader_has_not_taken_yet(two_servers):
    value = os.urandom(8 * 1024 * 1024)  # more than the socket buffers hold
    expected = b"$%d\r\n" % len(value) + value + b"\r\n"
    with TcpProxy(two_servers[0].port) as proxy, closing(connect(proxy.port)) as client:
        assert client.set("large", value)
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as raw:
            raw.sendall(b"GET large\r\n")
            time.sleep(0.3)  # the reply fills the buffers; the proxy waits for room
            reply = bytearray()
            while len(reply) < len(expected):
                chunk = raw.recv(1024 * 1024)
                assert chunk, len(reply)
                reply += chunk
        assert reply == expected
        client.delete("large")


def test_proxy_closes_the_client_when_the_server_closes(two_servers):
    first = two_servers[0]
    with TcpProxy(first.port) as proxy, closing(connect(proxy.port)) as client:
        client_id = client.client_id()
        assert proxy.connections == 1
        with closing(connect(first.port)) as admin:
            admin.client_kill_filter(_id=client_id)
        redis_topology._wait(lambda: proxy.connections == 0, 5, "the proxy closing the link")
        # redis-py finds its idle connection closed and opens a new one.
        assert client.client_id() != client_id
        assert proxy.connections == 1


def test_proxy_process_ends_with_close_or_with_its_parent(two_servers):
    proxy = TcpProxy(two_servers[0].port)
    process = proxy._process
    assert proxy in redis_topology._open and process.poll() is None
    proxy.close()
    proxy.close()
    assert proxy not in redis_topology._open and process.poll() is not None
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", proxy.port), timeout=2).close()

    orphan = TcpProxy(two_servers[0].port)
    try:
        assert orphan._process.stdin is not None
        orphan._process.stdin.close()  # what the parent's death does to the pipe
        assert orphan._process.wait(timeout=5) == 0
    finally:
        orphan.close()


# -- switchover -----------------------------------------------------------------------------


def test_switchover_leaves_old_connections_on_a_read_only_replica():
    with ReplicatedRedis() as pair, TcpProxy(pair.primary.port) as proxy:
        old_primary = pair.primary
        with closing(connect(proxy.port)) as old:
            old.set("counter", 1)
            pair.switchover()
            proxy.switch(pair.primary.port)
            assert pair.replica is old_primary and pair.primary is not old_primary
            assert pair.last_switchover_seconds is not None

            with pytest.raises(ReadOnlyError):
                old.incr("counter")
            assert old.get("counter") == "1"  # reads still work there, replicated
            assert served_by(old) == old_primary.port

            with closing(connect(proxy.port)) as new:
                assert served_by(new) == pair.primary.port
                assert new.incr("counter") == 2
            with closing(connect(old_primary.port)) as direct:
                assert direct.execute_command("ROLE")[0] == "slave"


# -- Sentinel -------------------------------------------------------------------------------


def test_sentinel_failover_moves_the_master(sentinel_group):
    group = sentinel_group
    sentinel = redis.sentinel.Sentinel(group.sentinels, socket_timeout=2)
    try:
        old = group.master_address()
        assert sentinel.discover_master(group.service_name) == old
        new = group.failover(everywhere=True)
        assert new != old
        assert group.master_address() == new
        assert sentinel.discover_master(group.service_name) == new
        for _, port in group.sentinels:
            with closing(connect(port)) as each:
                assert each.sentinel_get_master_addr_by_name(group.service_name) == new
        with closing(sentinel.master_for(group.service_name, socket_timeout=2)) as master:
            assert master.set("after-failover", 1)
        assert group.last_failover_seconds is not None
    finally:
        for client in sentinel.sentinels:
            client.close()


def test_sentinel_kill_master_promotes_the_replica():
    with SentinelGroup(service_name="other") as group:
        old = group.master_address()
        assert group.kill_master() == old[1]
        new = group.master_address()
        assert new != old
        with closing(connect(new[1])) as master:
            assert master.set("after-kill", 1)


# -- cluster --------------------------------------------------------------------------------

TAGS = [f"{{{letter}}}" for letter in "abcdefghijklmnopqrstuvwxyz"]  # {a}, {b}, ...


def test_cluster_spreads_keys_over_three_masters(cluster):
    cluster.flushall()
    assert len(cluster.masters()) == 3
    with closing(redis.cluster.RedisCluster.from_url(cluster.url)) as client:
        for tag in TAGS:
            client.set(tag, tag)
        assert [client.get(tag) for tag in TAGS] == [tag.encode() for tag in TAGS]
        slot = client.keyslot("{a}")
    sizes = cluster.keys_per_master()
    assert sorted(sizes) == sorted(master.port for master in cluster.masters())
    assert sum(sizes.values()) == len(TAGS)
    assert all(count > 0 for count in sizes.values())
    with closing(connect(cluster.node_for_slot(slot))) as owner:
        assert owner.get("{a}") == "{a}"


def test_cluster_kill_master_promotes_its_replica(cluster):
    with closing(cluster.client()) as client:
        client.set("{a}", "before")
        slot = client.keyslot("{a}")
    port = cluster.node_for_slot(slot)
    with closing(connect(port)) as master:
        assert master.wait(1, 5000) == 1  # the replica has the write

    assert cluster.kill_master(port) == port
    assert cluster.last_failover_seconds is not None
    promoted = cluster.node_for_slot(slot)
    assert promoted != port
    for _, node_port in cluster.startup_nodes:
        with closing(connect(node_port)) as node:
            assert "cluster_state:ok" in node.execute_command("CLUSTER", "INFO")
    with closing(connect(promoted)) as node:
        assert node.execute_command("ROLE")[0] == "master"
    with closing(cluster.client()) as client:
        assert client.get("{a}") == b"before"
        client.set("{a}", "after")

    cluster.revive(port)  # back as the replica of the node that replaced it
    with closing(connect(port)) as node:
        assert node.execute_command("ROLE")[0] == "slave"
    assert cluster.node_for_slot(slot) == promoted


# -- clean-up -------------------------------------------------------------------------------


def test_close_kills_everything_and_may_be_repeated():
    group = SentinelGroup()
    processes = [server.process for server in [*group.servers, *group.sentinel_servers]]
    dirs = [server.dir for server in [*group.servers, *group.sentinel_servers]]
    assert group in redis_topology._open
    group.close()
    group.close()
    assert group not in redis_topology._open
    assert all(process is not None and process.poll() is not None for process in processes)
    assert not any(os.path.exists(path) for path in dirs)
