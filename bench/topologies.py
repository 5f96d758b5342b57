"""The Redis topologies bench/topology.py and bench/cluster_faults.py run on."""

from __future__ import annotations

import multiprocessing
import random
import secrets
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any

import redis
from harness import HOST, RedisServer, free_port
from redis.backoff import NoBackoff
from redis.retry import Retry

# Full syncs through an RDB file: a diskless one waits 5 s for more replicas first.
REPLICATION = ("--repl-diskless-sync", "no")


def replica_of(port: int) -> list[str]:
    return [*REPLICATION, "--replicaof", HOST, str(port)]


@contextmanager
def admin(port: int, timeout: float = 2.0) -> Iterator[redis.Redis]:
    """A short-lived client that fails at once (no retries) and decodes replies."""
    client = redis.Redis(
        host=HOST,
        port=port,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        retry=Retry(NoBackoff(), 0),
        decode_responses=True,
    )
    try:
        yield client
    finally:
        client.close()


def wait(condition: Callable[[], object], timeout: float, what: str, step: float = 0.01) -> None:
    """Poll ``condition`` until it is true; a Redis or socket error counts as not yet."""
    deadline = time.monotonic() + timeout
    while True:
        with suppress(redis.RedisError, OSError):
            if condition():
                return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout} s")
        time.sleep(step)


def link_up(port: int) -> bool:
    """The replica on ``port`` is connected to its primary and has loaded its data."""
    with admin(port) as client:
        replication = client.info("replication")
        loading = client.info("persistence")["loading"]
    return replication.get("master_link_status") == "up" and loading == 0


def writable_master(port: int) -> bool:
    with admin(port) as client:
        role = client.execute_command("ROLE")[0]
        loading = client.info("persistence")["loading"]
    return bool(role == "master" and loading == 0)


def destroy(servers: list[RedisServer]) -> None:
    """SIGKILL and remove: a SIGTERM'd master would wait for its replicas first."""
    for server in servers:
        server.kill()
        server.close()


# -- a primary and its replica ------------------------------------------------------------------


class ReplicatedRedis:
    """A primary and one replica; ``switchover()`` swaps them, as a managed Redis does."""

    def __init__(self, timeout: float = 10.0) -> None:
        self.primary = RedisServer(args=REPLICATION)
        self.replica = RedisServer(args=replica_of(self.primary.port))
        self.last_switchover_seconds: float | None = None
        try:
            self.primary.start()
            self.replica.start()
            wait(lambda: link_up(self.replica.port), timeout, "the replica's link")
        except BaseException:
            self.close()
            raise

    def switchover(self, timeout: float = 10.0) -> None:
        """Promote the replica and make the old primary its replica. Writes to the old primary
        are paused meanwhile (as Redis's own FAILOVER does), so none is lost; they get READONLY
        once it is a replica. Connections to it stay open."""
        old, new = self.primary, self.replica
        started = time.monotonic()
        with admin(old.port) as old_client, admin(new.port) as new_client:
            old_client.execute_command("CLIENT", "PAUSE", int(timeout * 1000), "WRITE")
            try:
                offset = old_client.info("replication")["master_repl_offset"]
                wait(
                    lambda: new_client.info("replication")["slave_repl_offset"] >= offset,
                    timeout,
                    "the replica catching up",
                    step=0.002,
                )
                new_client.execute_command("REPLICAOF", "NO", "ONE")
                old_client.execute_command("REPLICAOF", HOST, new.port)
            finally:
                old_client.execute_command("CLIENT", "UNPAUSE")
        self.primary, self.replica = new, old
        wait(lambda: link_up(old.port), timeout, "the old primary's link to the new one")
        self.last_switchover_seconds = time.monotonic() - started

    def close(self) -> None:
        destroy([self.primary, self.replica])

    def __enter__(self) -> ReplicatedRedis:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- Sentinel -----------------------------------------------------------------------------------


class SentinelGroup:
    """A primary, one replica and three Sentinels (quorum 2). Each Sentinel's config names the
    replica and the other Sentinels, so the group is ready for a failover as soon as it is up
    instead of after Sentinel's hello and INFO periods."""

    def __init__(self, service_name: str = "mymaster", timeout: float = 15.0) -> None:
        self.service_name = name = service_name
        self.servers: list[RedisServer] = []
        self.last_failover_seconds: float | None = None
        try:
            primary = RedisServer(args=REPLICATION)
            self.servers.append(primary)
            primary.start()
            replica = RedisServer(args=replica_of(primary.port))
            self.servers.append(replica)
            replica.start()
            wait(lambda: link_up(replica.port), timeout, "the replica's link")
            ports = [free_port() for _ in range(3)]
            ids = [secrets.token_hex(20) for _ in ports]
            for index, port in enumerate(ports):
                lines = [
                    "sentinel resolve-hostnames no",
                    f"sentinel myid {ids[index]}",
                    f"sentinel monitor {name} {HOST} {primary.port} 2",
                    f"sentinel down-after-milliseconds {name} 1000",
                    f"sentinel failover-timeout {name} 3000",
                    f"sentinel known-replica {name} {HOST} {replica.port}",
                    *(
                        f"sentinel known-sentinel {name} {HOST} {other} {ids[o]}"
                        for o, other in enumerate(ports)
                        if o != index
                    ),
                ]
                sentinel = RedisServer(
                    config="\n".join(lines) + "\n", args=["--sentinel"], port=port
                )
                self.servers.append(sentinel)
                sentinel.start()
            wait(self.steady, timeout, "the Sentinel group settling", step=0.05)
        except BaseException:
            self.close()
            raise

    @property
    def sentinels(self) -> list[tuple[str, int]]:
        """Addresses for redis.sentinel.Sentinel."""
        return [(HOST, s.port) for s in self.servers[2:]]

    def master_address(self) -> tuple[str, int]:
        with admin(self.servers[2].port) as client:
            host, port = client.sentinel_get_master_addr_by_name(self.service_name)
        return str(host), int(port)

    def failover(self, timeout: float = 15.0) -> tuple[str, int]:
        """SENTINEL FAILOVER; wait until the first Sentinel gives a new master that takes
        writes, and return its address. The old master stays a master until Sentinel demotes
        it, about 10 s later, as with a real Sentinel."""
        started = time.monotonic()
        old = self.master_address()
        with admin(self.servers[2].port) as client:

            def begun() -> bool:
                try:
                    return bool(client.sentinel_failover(self.service_name))
                except redis.ResponseError as error:  # no replica fit yet, or one in progress
                    if "NOGOODSLAVE" in str(error) or "INPROG" in str(error):
                        return False
                    raise

            wait(begun, timeout, "Sentinel starting the failover", step=0.05)
        wait(lambda: self.master_address() != old, timeout, "a new master", step=0.02)
        new = self.master_address()
        wait(lambda: writable_master(new[1]), timeout, "the new master taking writes")
        self.last_failover_seconds = time.monotonic() - started
        return new

    def steady(self) -> bool:
        """Every Sentinel sees the master, the replica's link up and the two other Sentinels."""
        master_port = self.servers[0].port
        if not (writable_master(master_port) and link_up(self.servers[1].port)):
            return False
        for sentinel in self.servers[2:]:
            with admin(sentinel.port) as client:
                _, port = client.sentinel_get_master_addr_by_name(self.service_name)
                if int(port) != master_port:
                    return False
                replicas = client.execute_command("SENTINEL", "REPLICAS", self.service_name)
                others = client.execute_command("SENTINEL", "SENTINELS", self.service_name)
            if not any(pairs(r).get("master-link-status") == "ok" for r in replicas):
                return False
            if sum(pairs(o).get("flags") == "sentinel" for o in others) < 2:
                return False
        return True

    def close(self) -> None:
        destroy(self.servers[::-1])

    def __enter__(self) -> SentinelGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def pairs(reply: Any) -> dict[str, str]:
    """A Sentinel reply (a flat list, or a dict redis-py already made) as a dict."""
    if isinstance(reply, dict):
        return {str(key): str(value) for key, value in reply.items()}
    return {str(reply[i]): str(reply[i + 1]) for i in range(0, len(reply), 2)}


# -- a cluster ----------------------------------------------------------------------------------


def bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def cluster_port(taken: set[int]) -> int:
    """A port p with p and its bus port p + 10000 free: below Linux's ephemeral range (from
    32768), so no outgoing connection takes one of them before the node binds it."""
    for _ in range(1000):
        port = random.randrange(10000, 22000)
        if not {port, port + 10000} & taken and bindable(port) and bindable(port + 10000):
            return port
    raise RuntimeError("no free port for a cluster node and its bus")


def slot_map(port: int) -> tuple[tuple[int, int, int], ...]:
    """(first slot, last slot, master port) of every slot range, as the node on ``port`` sees it."""
    with admin(port) as client:
        reply = client.execute_command("CLUSTER", "SLOTS")
    return tuple(sorted((int(entry[0]), int(entry[1]), int(entry[2][1])) for entry in reply))


class Cluster:
    """Six nodes made a cluster by ``redis-cli --cluster create``: three masters, a replica
    each; any replica may take over (validity factor 0) once its master has been unreachable
    for ``node_timeout_ms``."""

    def __init__(self, node_timeout_ms: int = 1000, timeout: float = 30.0) -> None:
        self.nodes: list[RedisServer] = []
        self.last_failover_seconds: float | None = None
        try:
            taken: set[int] = set()
            for _ in range(6):
                port = cluster_port(taken)
                taken |= {port, port + 10000}
                node = RedisServer(
                    port=port,
                    args=[
                        *REPLICATION,
                        "--cluster-enabled", "yes",
                        "--cluster-config-file", f"nodes-{port}.conf",  # in the node's --dir
                        "--cluster-node-timeout", str(node_timeout_ms),
                        "--cluster-replica-validity-factor", "0",
                    ],
                )  # fmt: skip
                self.nodes.append(node)
                node.start()
            cli = shutil.which("redis-cli")
            if cli is None:
                raise RuntimeError("redis-cli is not on PATH (apt-get install redis-tools)")
            addresses = [f"{HOST}:{node.port}" for node in self.nodes]
            result = subprocess.run(
                [
                    cli,
                    "--cluster",
                    "create",
                    *addresses,
                    "--cluster-replicas",
                    "1",
                    "--cluster-yes",
                ],
                capture_output=True,
                text=True,
                timeout=timeout,
            )
            if result.returncode != 0 or "All 16384 slots covered" not in result.stdout:
                raise RuntimeError(f"redis-cli --cluster create failed:\n{result.stdout}")
            self.wait_steady(timeout, replicas=True)
        except BaseException:
            self.close()
            raise

    @property
    def alive(self) -> list[RedisServer]:
        return [node for node in self.nodes if node.proc is not None]

    @property
    def url(self) -> str:
        """A running node's URL, for CLUSTER_URL."""
        return self.alive[0].url

    def node(self, port: int) -> RedisServer:
        return next(node for node in self.nodes if node.port == port)

    def masters(self) -> list[RedisServer]:
        """The running nodes that serve slots now, by port."""
        owners = {port for _, _, port in slot_map(self.alive[0].port)}
        return sorted((node for node in self.alive if node.port in owners), key=lambda n: n.port)

    def node_for_slot(self, slot: int) -> int:
        """The port of the master that serves ``slot``."""
        for start, end, port in slot_map(self.alive[0].port):
            if start <= slot <= end:
                return port
        raise LookupError(f"slot {slot} is not served")

    def keys_per_master(self) -> dict[int, int]:
        sizes = {}
        for master in self.masters():
            with admin(master.port) as client:
                sizes[master.port] = int(client.dbsize())
        return sizes

    def flushall(self) -> None:
        """Empty every master (their replicas follow)."""
        for master in self.masters():
            with admin(master.port) as client:
                client.flushall()

    def kill_master(self, port: int, timeout: float = 30.0) -> int:
        """SIGKILL a master and wait until its replica serves its slots; returns the port
        (``last_failover_seconds``: the time from the kill)."""
        started = time.monotonic()
        self.node(port).kill()
        self.wait_steady(timeout, without=port)
        self.last_failover_seconds = time.monotonic() - started
        return port

    def wait_steady(
        self, timeout: float = 30.0, *, without: int | None = None, replicas: bool = False
    ) -> None:
        """Until every running node is ok and agrees on who serves which slot (``without``: a
        port that must serve none; ``replicas``: every master has a replica whose link is up)."""

        def steady() -> bool:
            maps = set()
            for node in self.alive:
                with admin(node.port) as client:
                    if client.execute_command("CLUSTER", "INFO").find("cluster_state:ok") < 0:
                        return False
                maps.add(slot_map(node.port))
            if len(maps) != 1:
                return False
            (slots,) = maps
            owners = {owner for _, _, owner in slots}
            if without in owners or sum(end - start + 1 for start, end, _ in slots) != 16384:
                return False
            if not all(writable_master(owner) for owner in owners):
                return False
            return not replicas or all(replica_online(owner) for owner in owners)

        wait(steady, timeout, "the cluster settling", step=0.05)

    def close(self) -> None:
        destroy(self.nodes)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def replica_online(master_port: int) -> bool:
    with admin(master_port) as client:
        replica = client.info("replication").get("slave0")
    return isinstance(replica, dict) and replica.get("state") == "online"


# -- a TCP proxy --------------------------------------------------------------------------------


class TcpProxy:
    """A loopback TCP proxy in front of a Redis port, as a managed Redis's address: after
    ``switch()`` new connections reach the new target, open ones stay where they are. It runs
    in a process of its own, so its forwarding never waits for the GIL of the bench's threads.
    """

    def __init__(self, target_port: int) -> None:
        context = multiprocessing.get_context("spawn")
        self.target = context.Value("i", target_port)
        ours, theirs = context.Pipe()
        self.process = context.Process(target=proxy, args=(self.target, theirs), daemon=True)
        self.process.start()
        self.port = int(ours.recv())
        self.url = f"redis://{HOST}:{self.port}/0"

    def switch(self, target_port: int) -> None:
        self.target.value = target_port

    def close(self) -> None:
        self.process.kill()  # the kernel closes its sockets
        self.process.join()

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def proxy(target: Any, ready: Any) -> None:
    """The proxy process: accept, connect to the target of now, pump both ways."""
    listener = socket.create_server((HOST, 0))
    ready.send(listener.getsockname()[1])
    while True:
        downstream, _ = listener.accept()
        try:
            upstream = socket.create_connection((HOST, target.value), timeout=2.0)
        except OSError:
            downstream.close()  # the client sees its connection closed, as with a dead node
            continue
        upstream.settimeout(None)
        for sock in (downstream, upstream):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for source, sink in ((downstream, upstream), (upstream, downstream)):
            threading.Thread(target=pump, args=(source, sink), daemon=True).start()


def pump(source: socket.socket, sink: socket.socket) -> None:
    with suppress(OSError):
        while data := source.recv(65536):
            sink.sendall(data)
    for sock in (source, sink):  # one side closed: close the other too
        with suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
