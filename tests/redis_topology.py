"""Real Redis topologies for the tests and bench/: a TCP proxy, a replicated pair, Sentinel and a
cluster.

Everything is a real process on 127.0.0.1 (no mocks): the behaviour under test is what Redis
itself does on a failover, a switchover or a moved slot. Each harness starts in its constructor,
waits until the topology is steady (so the first test sees it ready), and kills and removes all
it started in ``close()``, which may be called any number of times; whatever a failed test left
open is closed at interpreter exit.
"""

from __future__ import annotations

import atexit
import os
import random
import secrets
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any, Protocol

import redis
import redis.cluster
from redis.backoff import NoBackoff
from redis.retry import Retry

from tests.redis_server import RedisServer, _free_port

HOST = "127.0.0.1"
# Full syncs through an RDB file: a diskless one waits 5 s for more replicas (by default), then
# streams no write to the new replica until its first ACK, up to 1 s later. (So a primary has a
# dump.rdb in its dir, which a restart would load.)
# Sentinel's client-reconfig-script that moves the fence to each new primary (``fenced``).
FENCE_SCRIPT = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    "django_throttle",
    "contrib",
    "sentinel_fence.sh",
)
_REPLICATION_ARGS = ["--repl-diskless-sync", "no"]


def _replica_args(primary_port: int) -> list[str]:
    return [*_REPLICATION_ARGS, "--replicaof", HOST, str(primary_port)]


# -- shared helpers -----------------------------------------------------------------------


class _Closable(Protocol):
    def close(self) -> None: ...


_open: set[_Closable] = set()  # harnesses not closed yet, closed at exit as a last resort


@atexit.register
def _close_all() -> None:
    for harness in list(_open):
        with suppress(Exception):
            harness.close()


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


def _wait(condition: Callable[[], object], timeout: float, what: str, step: float = 0.01) -> None:
    """Poll ``condition`` until it is true; a Redis or socket error counts as not yet."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        try:
            if condition():
                return
        except (redis.RedisError, OSError) as error:
            last_error = error
        if time.monotonic() > deadline:
            detail = f" (last error: {last_error!r})" if last_error else ""
            raise TimeoutError(f"{what}: not within {timeout} s{detail}")
        time.sleep(step)


def _link_up(port: int) -> bool:
    """The replica on ``port`` is connected to its primary and has loaded its dataset."""
    with admin(port) as client:
        replication = client.info("replication")
        loading = client.info("persistence")["loading"]
    return replication.get("master_link_status") == "up" and loading == 0


def _is_writable_master(port: int) -> bool:
    with admin(port) as client:
        role = client.execute_command("ROLE")[0]
        loading = client.info("persistence")["loading"]
    return bool(role == "master" and loading == 0)


def _master_of(sentinel_port: int, service_name: str) -> tuple[str, int]:
    """SENTINEL GET-MASTER-ADDR-BY-NAME on one Sentinel."""
    with admin(sentinel_port) as client:
        reply: Any = client.sentinel_get_master_addr_by_name(service_name)
    if not reply:
        raise LookupError(f"the Sentinel on {sentinel_port} does not know {service_name}")
    return str(reply[0]), int(reply[1])


def _destroy(servers: list[RedisServer | None]) -> None:
    """SIGKILL and remove: a SIGTERM'd Redis 7 master waits for its replicas' ACKs first."""
    for server in servers:
        if server is not None:
            server.kill()
            server.close()


def _start_together(servers: list[RedisServer]) -> None:
    """Start the servers in threads, so they begin listening at about the same time."""
    errors: list[BaseException] = []

    def start(server: RedisServer) -> None:
        try:
            server.start()
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=start, args=(server,)) for server in servers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


# -- a TCP proxy --------------------------------------------------------------------------


# The proxy's own process: its pumping must not wait for the GIL of the process under test.
_PROXY_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tcp_proxy.py")


class TcpProxy:
    """A loopback TCP proxy in front of a Redis port, whose target can be switched.

    A managed Redis fails over by promoting a replica and moving a DNS name: new connections
    reach the new primary, connections already open stay on the old node, which has become a
    read-only replica. ``switch`` does the same: only new connections go to the new target.

    The proxying runs in a child process (tests/tcp_proxy.py); each method waits for its answer.
    """

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self._lock = threading.Lock()
        self._closed = False
        self._process = subprocess.Popen(
            [sys.executable, "-I", _PROXY_SCRIPT, HOST, str(target_port)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        _open.add(self)
        try:
            self.port: int = int(self._read())  # the child binds it: no other process can
        except BaseException:
            self.close()
            raise
        self.url = f"redis://{HOST}:{self.port}/0"

    @property
    def connections(self) -> int:
        """How many proxied connections are open."""
        return int(self._ask("count"))

    def switch(self, target_port: int) -> None:
        """New connections go to ``target_port``; open ones stay where they are."""
        self._ask(f"switch {target_port}")
        self.target_port = target_port

    def drop_all(self) -> None:
        """Close every proxied connection, both sides (as a network cut or a restart would)."""
        self._ask("drop")

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._process.kill()  # the kernel closes its sockets
        self._process.wait()
        for pipe in (self._process.stdin, self._process.stdout):
            if pipe is not None:
                with suppress(OSError):
                    pipe.close()
        _open.discard(self)

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _ask(self, command: str) -> str:
        with self._lock:
            if self._closed:
                raise RuntimeError("the proxy is closed")
            assert self._process.stdin is not None
            try:
                self._process.stdin.write(command + "\n")
                self._process.stdin.flush()
            except OSError as error:
                raise RuntimeError(f"the proxy process is gone: {error!r}") from error
            answer = self._read()
        if answer != "ok" and not answer.isdigit():
            raise RuntimeError(f"the proxy process answered {command!r} with {answer!r}")
        return answer

    def _read(self) -> str:
        assert self._process.stdout is not None
        line = self._process.stdout.readline()
        if not line:
            code = self._process.poll()
            raise RuntimeError(f"the proxy process exited (exit code {code})")
        return line.strip()


# -- a primary and its replica ------------------------------------------------------------


class ReplicatedRedis:
    """A primary and one replica, for the switchover a managed Redis does on maintenance.

    ``primary`` and ``replica`` always name the current roles: ``switchover`` swaps them.
    """

    def __init__(self, timeout: float = 10.0) -> None:
        self.primary = RedisServer(args=_REPLICATION_ARGS)
        self.replica = RedisServer(args=_replica_args(self.primary.port))
        self.last_switchover_seconds: float | None = None
        _open.add(self)
        try:
            self.primary.start()
            self.replica.start()
            _wait(lambda: _link_up(self.replica.port), timeout, "the replica's link")
        except BaseException:
            self.close()
            raise

    def switchover(self, timeout: float = 10.0) -> None:
        """Promote the replica and make the old primary its read-only replica.

        Writes to the old primary are paused meanwhile (CLIENT PAUSE WRITE, as Redis's own
        FAILOVER does), so none is lost between the catch-up and the demotion; the writes that
        waited get READONLY once it is a replica. Connections to it stay open.
        """
        old, new = self.primary, self.replica
        started = time.monotonic()
        with admin(old.port) as old_client, admin(new.port) as new_client:
            old_client.execute_command("CLIENT", "PAUSE", int(timeout * 1000), "WRITE")
            try:
                offset = old_client.info("replication")["master_repl_offset"]
                _wait(
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
        new.args, old.args = list(_REPLICATION_ARGS), _replica_args(new.port)  # for a restart
        _wait(lambda: _link_up(old.port), timeout, "the old primary's link to the new one")
        self.last_switchover_seconds = time.monotonic() - started

    def close(self) -> None:
        _destroy([self.primary, self.replica])
        _open.discard(self)

    def __enter__(self) -> ReplicatedRedis:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- Sentinel -----------------------------------------------------------------------------


class SentinelGroup:
    """A primary, one replica and three Sentinels watching them (quorum 2).

    Each Sentinel's config names the replica and the other Sentinels (with their ids), so they
    know each other at once instead of after the hello and INFO periods (2 s and 10 s): the
    group is ready for SENTINEL FAILOVER, or a vote on a dead master, as soon as it is up.

    ``min_replicas_to_write``: every data node gets it (with ``min-replicas-max-lag`` 10), as
    one config file for all of them would give it; whichever is the master then refuses
    writes with ``NOREPLICAS`` while fewer replicas are linked to it.

    ``fenced``: the fence of docs/deploying.md instead: ``min-replicas-to-write 1`` on the
    primary alone, moved to the new one after each failover by the Sentinels'
    ``client-reconfig-script`` (django_throttle/contrib/sentinel_fence.sh).
    """

    def __init__(
        self,
        service_name: str = "mymaster",
        *,
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 3000,
        min_replicas_to_write: int = 0,
        fenced: bool = False,
        timeout: float = 15.0,
    ) -> None:
        self.service_name = service_name
        self.servers: list[RedisServer] = []  # the data nodes, whatever their current role
        self.sentinel_servers: list[RedisServer] = []
        self.last_failover_seconds: float | None = None
        fence = []
        if min_replicas_to_write:
            fence = ["--min-replicas-to-write", str(min_replicas_to_write)]
            fence += ["--min-replicas-max-lag", "10"]
        _open.add(self)
        try:
            armed = ["--min-replicas-to-write", "1", "--min-replicas-max-lag", "10"]
            primary = RedisServer(args=[*_REPLICATION_ARGS, *fence, *(armed if fenced else [])])
            self.servers.append(primary)
            primary.start()
            replica = RedisServer(args=[*_replica_args(primary.port), *fence])
            self.servers.append(replica)
            replica.start()
            # A Sentinel asks a replica whose link is down for INFO every 1 s, not at once.
            _wait(lambda: _link_up(replica.port), timeout, "the replica's link")
            ports = [_free_port() for _ in range(3)]
            ids = [secrets.token_hex(20) for _ in ports]
            name = service_name
            for index, port in enumerate(ports):
                lines = [
                    "sentinel resolve-hostnames no",
                    f"sentinel myid {ids[index]}",
                    f"sentinel monitor {name} {HOST} {primary.port} 2",
                    f"sentinel down-after-milliseconds {name} {down_after_ms}",
                    f"sentinel failover-timeout {name} {failover_timeout_ms}",
                    f"sentinel parallel-syncs {name} 1",
                    f"sentinel known-replica {name} {HOST} {replica.port}",
                ]
                if fenced:
                    lines.append(f"sentinel client-reconfig-script {name} {FENCE_SCRIPT}")
                lines += [
                    f"sentinel known-sentinel {name} {HOST} {other} {ids[o]}"
                    for o, other in enumerate(ports)
                    if o != index
                ]
                config = "\n".join(lines) + "\n"
                self.sentinel_servers.append(
                    RedisServer(config=config, args=["--sentinel"], port=port)
                )
            # A Sentinel that finds a peer not listening yet retries after its ping period (1 s):
            # start them together, and retry every 0.1 s until all are linked.
            _start_together(self.sentinel_servers)
            self._debug("PING-PERIOD", 100)
            self.wait_steady(timeout)
            self._debug("PING-PERIOD", 1000)  # back to Sentinel's own timing for the tests
        except BaseException:
            self.close()
            raise

    @property
    def sentinels(self) -> list[tuple[str, int]]:
        """Addresses for redis.sentinel.Sentinel (all three, running or not)."""
        return [(HOST, sentinel.port) for sentinel in self.sentinel_servers]

    def server(self, port: int) -> RedisServer:
        """The data node listening on ``port``."""
        return next(server for server in self.servers if server.port == port)

    def master_address(self) -> tuple[str, int]:
        """The master's address as the first running Sentinel gives it."""
        return _master_of(self._first_sentinel().port, self.service_name)

    def master(self) -> RedisServer:
        return self.server(self.master_address()[1])

    def failover(self, timeout: float = 15.0, *, everywhere: bool = False) -> tuple[str, int]:
        """SENTINEL FAILOVER to the first running Sentinel; wait until it gives a new master
        that takes writes (with ``everywhere``, until every running Sentinel gives it: the
        others learn it from the hello messages, sent every 2 s). Returns the new address.

        The old master, alive, stays a master until Sentinel demotes it about 10 s later, as
        with a real Sentinel; a second failover needs ``wait_steady()`` (about 20 s) first, or
        a new group (a fraction of a second).
        """
        started = time.monotonic()
        old = self.master_address()
        with admin(self._first_sentinel().port) as client:

            def begun() -> bool:
                try:
                    return bool(client.sentinel_failover(self.service_name))
                except redis.ResponseError as error:
                    # NOGOODSLAVE: no replica fit to promote yet; INPROG: one still running.
                    if "NOGOODSLAVE" in str(error) or "INPROG" in str(error):
                        return False
                    raise

            _wait(begun, timeout, "Sentinel starting the failover", step=0.05)
        new = self._wait_new_master(old, started + timeout, everywhere)
        self.last_failover_seconds = time.monotonic() - started
        return new

    def kill_master(
        self, wait: bool = True, timeout: float = 30.0, *, everywhere: bool = False
    ) -> int:
        """SIGKILL the master; with ``wait``, until the Sentinels have voted and the first
        running one (or, with ``everywhere``, every one) gives the promoted replica.
        Returns the killed port (``last_failover_seconds`` is the time from the kill).
        """
        started = time.monotonic()
        old = self.master_address()
        self.server(old[1]).kill()
        if wait:
            self._wait_new_master(old, started + timeout, everywhere)
            self.last_failover_seconds = time.monotonic() - started
        return old[1]

    def wait_steady(self, timeout: float = 30.0) -> None:
        """Wait until every running Sentinel sees the same master, every running data node
        but it as a replica whose link is up, and the other running Sentinels."""
        _wait(self._steady, timeout, "the Sentinel group settling", step=0.05)

    def close(self) -> None:
        _destroy([*self.sentinel_servers, *self.servers])
        _open.discard(self)

    def __enter__(self) -> SentinelGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _debug(self, name: str, value: int) -> None:
        """SENTINEL DEBUG (Redis 7.0+) on every Sentinel; older ones keep their timing."""
        for sentinel in self.sentinel_servers:
            with admin(sentinel.port) as client, suppress(redis.ResponseError):
                client.execute_command("SENTINEL", "DEBUG", name, value)

    def _first_sentinel(self) -> RedisServer:
        return next(s for s in self.sentinel_servers if s.process is not None)

    def _addresses(self) -> set[tuple[str, int]]:
        """The master's address as each running Sentinel gives it."""
        return {
            _master_of(sentinel.port, self.service_name)
            for sentinel in self.sentinel_servers
            if sentinel.process is not None
        }

    def _wait_new_master(
        self, old: tuple[str, int], deadline: float, everywhere: bool
    ) -> tuple[str, int]:
        def moved() -> bool:
            addresses = self._addresses() if everywhere else {self.master_address()}
            return len(addresses) == 1 and old not in addresses

        _wait(moved, max(deadline - time.monotonic(), 0), "a new master", step=0.02)
        new = self.master_address()
        remaining = max(deadline - time.monotonic(), 0)
        _wait(lambda: _is_writable_master(new[1]), remaining, "the new master taking writes")
        return new

    def _steady(self) -> bool:
        addresses = self._addresses()
        if len(addresses) != 1:
            return False
        ((_, master_port),) = addresses
        running = [s for s in self.sentinel_servers if s.process is not None]
        replica_ports = {s.port for s in self.servers if s.process and s.port != master_port}
        if not _is_writable_master(master_port):
            return False
        if not all(_link_up(port) for port in replica_ports):
            return False
        name = self.service_name
        for sentinel in running:
            with admin(sentinel.port) as client:
                master = _pairs(client.execute_command("SENTINEL", "MASTER", name))
                replicas = client.execute_command("SENTINEL", "REPLICAS", name)
                others = client.execute_command("SENTINEL", "SENTINELS", name)
            if master["flags"] != "master":
                return False
            good = {
                int(r["port"])
                for r in map(_pairs, replicas)
                if r["flags"] == "slave" and r["master-link-status"] == "ok"
            }
            if not replica_ports <= good:
                return False
            peers = [_pairs(other) for other in others]
            if sum(peer["flags"] == "sentinel" for peer in peers) < len(running) - 1:
                return False
        return True


def _pairs(reply: Any) -> dict[str, str]:
    """A Sentinel reply (a flat list, or what redis-py already made a dict of) as a dict."""
    if isinstance(reply, dict):
        return {str(key): str(value) for key, value in reply.items()}
    return {str(reply[i]): str(reply[i + 1]) for i in range(0, len(reply), 2)}


# -- a cluster ----------------------------------------------------------------------------


@dataclass(frozen=True)
class _NodeLine:
    """What one line of CLUSTER NODES says of a node."""

    id: str
    port: int
    flags: frozenset[str]
    master_id: str | None

    @property
    def is_master(self) -> bool:
        return "master" in self.flags

    @property
    def failed(self) -> bool:
        return bool(self.flags & {"fail", "fail?", "noaddr", "handshake"})


def _cluster_nodes(port: int) -> list[_NodeLine]:
    with admin(port) as client:
        text = client.execute_command("CLUSTER", "NODES")  # two words: no redis-py parsing
    nodes = []
    for line in str(text).splitlines():
        # <id> <ip:port@cport> <flags> <master id or -> <ping> <pong> <epoch> <link> <slots>...
        fields = line.split()
        address = fields[1].split("@")[0]
        nodes.append(
            _NodeLine(
                id=fields[0],
                port=int(address.rsplit(":", 1)[1] or 0),
                flags=frozenset(fields[2].split(",")),
                master_id=None if fields[3] == "-" else fields[3],
            )
        )
    return nodes


def _cluster_info(port: int) -> dict[str, str]:
    with admin(port) as client:
        text = client.execute_command("CLUSTER", "INFO")
    return dict(line.split(":", 1) for line in str(text).splitlines() if ":" in line)


def _slot_map(port: int) -> tuple[tuple[int, int, int], ...]:
    """(first slot, last slot, master port) of every slot range, as the node on ``port`` sees it."""
    with admin(port) as client:
        reply = client.execute_command("CLUSTER", "SLOTS")  # two words: no redis-py parsing
    return tuple(sorted((int(entry[0]), int(entry[1]), int(entry[2][1])) for entry in reply))


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def cluster_port(taken: set[int]) -> int:
    """A port p with p and its cluster bus port p + 10000 free and not in ``taken``.

    They are taken below the ephemeral range when there is room, so no client's outgoing
    connection takes one of them between this choice and the server binding it.
    """
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as file:
            ephemeral_low = int(file.read().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_low = 32768
    for _ in range(1000):
        if ephemeral_low - 10000 > 11000:
            port = random.randrange(10000, ephemeral_low - 10000)
        else:
            port = _free_port()
        bus = port + 10000
        if bus < 65536 and not {port, bus} & taken and _bindable(port) and _bindable(bus):
            return port
    raise RuntimeError("no free port for a cluster node and its bus")


class ClusterHarness:
    """Six nodes made a cluster by ``redis-cli --cluster create``: three masters, one replica each.

    The node timeout is 1 s and any replica may take over (validity factor 0), so a killed
    master is replaced in a few seconds; ``kill_master`` waits for that and times it.
    """

    def __init__(
        self,
        node_timeout_ms: int = 1000,
        timeout: float = 30.0,
        env: dict[str, str] | None = None,  # every node's, e.g. tests/clock_shift.py's shifted()
    ) -> None:
        self.env = env
        self.nodes: list[RedisServer] = []
        self.last_failover_seconds: float | None = None
        self.node_timeout_ms = node_timeout_ms
        _open.add(self)
        try:
            taken: set[int] = set()
            for _ in range(6):
                self.nodes.append(self._start_node(taken))
            binary = shutil.which("redis-cli")
            if binary is None:
                raise RuntimeError("redis-cli is not on PATH; install Debian's redis-tools")
            addresses = [f"{HOST}:{node.port}" for node in self.nodes]
            result = subprocess.run(
                [binary, "--cluster", "create", *addresses, "--cluster-replicas", "1"]
                + ["--cluster-yes"],
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

    def _start_node(self, taken: set[int]) -> RedisServer:
        """A started node; another port if something took this one since it was chosen."""
        for _ in range(5):
            port = cluster_port(taken)
            taken |= {port, port + 10000}
            node = RedisServer(
                port=port,
                args=[
                    *_REPLICATION_ARGS,
                    "--cluster-enabled", "yes",
                    "--cluster-config-file", f"nodes-{port}.conf",  # in the node's --dir
                    "--cluster-node-timeout", str(self.node_timeout_ms),
                    "--cluster-replica-validity-factor", "0",
                ],
                env=self.env,
            )  # fmt: skip
            try:
                node.start()
            except RuntimeError:
                node.close()
                continue
            return node
        raise RuntimeError("could not start a cluster node")

    # -- what the tests read

    @property
    def alive(self) -> list[RedisServer]:
        return [node for node in self.nodes if node.process is not None]

    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        """The running nodes' addresses, e.g. for redis.cluster.ClusterNode."""
        return [(HOST, node.port) for node in self.alive]

    @property
    def url(self) -> str:
        """A running node's URL, for RedisCluster.from_url."""
        return self.alive[0].url

    def client(self, **kwargs: Any) -> redis.cluster.RedisCluster:
        nodes = [redis.cluster.ClusterNode(host, port) for host, port in self.startup_nodes]
        return redis.cluster.RedisCluster(startup_nodes=nodes, **kwargs)

    def node(self, port: int) -> RedisServer:
        return next(node for node in self.nodes if node.port == port)

    def masters(self) -> list[RedisServer]:
        """The running nodes that serve slots now, by port."""
        owners = {port for _, _, port in _slot_map(self.alive[0].port)}
        return sorted((node for node in self.alive if node.port in owners), key=lambda n: n.port)

    def node_for_slot(self, slot: int) -> int:
        """The port of the master that serves ``slot``."""
        for start, end, port in _slot_map(self.alive[0].port):
            if start <= slot <= end:
                return port
        raise LookupError(f"slot {slot} is not served")

    def keys_per_master(self) -> dict[int, int]:
        """DBSIZE of each current master."""
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

    # -- faults

    def kill_master(self, port: int | None = None, timeout: float = 30.0) -> int:
        """SIGKILL a master (the lowest port by default) and wait until its replica serves its
        slots and every running node reports cluster_state:ok and the same slot map.

        Returns the killed port; ``last_failover_seconds`` is the time from the kill.
        """
        port = port if port is not None else self.masters()[0].port
        victim = self.node(port)
        started = time.monotonic()
        victim.kill()
        self.wait_steady(timeout, without=port)
        self.last_failover_seconds = time.monotonic() - started
        return port

    def revive(self, port: int, timeout: float = 30.0) -> None:
        """Restart a killed node: it rejoins as a replica of the master that replaced it."""
        self.node(port).start()
        self.wait_steady(timeout, replicas=True)

    def wait_steady(
        self, timeout: float = 30.0, *, without: int | None = None, replicas: bool = False
    ) -> None:
        """Wait until every running node is ok and agrees on who serves which slot.

        ``without``: a port that must serve no slot (a killed master). ``replicas``: every
        master also has a replica whose link is up.
        """

        def steady() -> bool:
            maps = set()
            for node in self.alive:
                if _cluster_info(node.port)["cluster_state"] != "ok":
                    return False
                maps.add(_slot_map(node.port))
            if len(maps) != 1:
                return False
            (slot_map,) = maps
            owners = {owner for _, _, owner in slot_map}
            if without in owners or sum(end - start + 1 for start, end, _ in slot_map) != 16384:
                return False
            if not all(_is_writable_master(owner) for owner in owners):
                return False
            return not replicas or self._replicas_linked(owners)

        _wait(steady, timeout, "the cluster settling", step=0.05)

    def _replicas_linked(self, owners: set[int]) -> bool:
        nodes = _cluster_nodes(self.alive[0].port)
        by_id = {node.id: node for node in nodes}
        linked = set()
        for node in nodes:
            if node.is_master or node.failed or node.master_id not in by_id:
                continue
            if node.port in {n.port for n in self.alive} and _link_up(node.port):
                linked.add(by_id[node.master_id].port)
        return owners <= linked

    def close(self) -> None:
        _destroy(list(self.nodes))
        _open.discard(self)

    def __enter__(self) -> ClusterHarness:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
