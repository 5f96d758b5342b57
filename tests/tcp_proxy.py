"""The process behind tests/redis_topology.py's TcpProxy: a loopback TCP proxy in one thread.

It runs apart from the tests so that forwarding never waits for the GIL of the process under
test, whose busy threads could otherwise delay a reply past a decision's socket timeout.

``python -I tcp_proxy.py <host> <target port>`` prints the port it listens on, then answers
each line read from stdin with one line: ``switch <port>`` -> ``ok`` (new connections go
there), ``count`` -> how many proxied connections are open, ``drop`` -> ``ok`` once every
proxied connection is closed. It exits when stdin closes, e.g. when its parent dies.
Standard library only: ``-I`` keeps this directory and the environment out of its path.
"""

from __future__ import annotations

import errno
import os
import selectors
import signal
import socket
import sys
import time
from contextlib import suppress

CONNECT_TIMEOUT = 2.0
CHUNK = 65536
_ACCEPT, _COMMAND = "accept", "command"  # selector data of the listener and of stdin


class _Link:
    """One proxied connection: the client's socket and the one to the target."""

    def __init__(self, downstream: socket.socket, upstream: socket.socket) -> None:
        self.downstream = downstream
        self.upstream = upstream
        self.connecting = True
        self.deadline = time.monotonic() + CONNECT_TIMEOUT
        # Bytes read from one side and not yet taken by the other, by the socket they go to.
        self.pending = {downstream: bytearray(), upstream: bytearray()}
        self.ended: socket.socket | None = None  # the side that closed first

    def peer(self, sock: socket.socket) -> socket.socket:
        return self.upstream if sock is self.downstream else self.downstream

    @property
    def finished(self) -> bool:
        """A side closed and what it sent before has been delivered: both are closed now."""
        return self.ended is not None and not self.pending[self.peer(self.ended)]


class Proxy:
    def __init__(self, host: str, target_port: int) -> None:
        self.host = host
        self.target_port = target_port
        self.selector = selectors.DefaultSelector()
        self.listener = socket.create_server((host, 0))
        self.listener.setblocking(False)
        self.selector.register(self.listener, selectors.EVENT_READ, _ACCEPT)
        self.selector.register(sys.stdin.fileno(), selectors.EVENT_READ, _COMMAND)
        self.links: set[_Link] = set()
        self.masks: dict[socket.socket, int] = {}  # the events each socket is registered for
        self.commands = bytearray()
        self.running = True

    @property
    def port(self) -> int:
        return int(self.listener.getsockname()[1])

    def serve(self) -> None:
        self._reply(str(self.port))
        while self.running:
            for key, mask in self.selector.select(self._timeout()):
                if key.data == _ACCEPT:
                    self._accept()
                elif key.data == _COMMAND:
                    self._command()
                else:
                    self._ready(key.data, key.fileobj, mask)  # type: ignore[arg-type]
            self._expire()
        for link in list(self.links):
            self._close(link)
        self.listener.close()

    # -- commands

    def _command(self) -> None:
        data = os.read(sys.stdin.fileno(), 4096)
        if not data:
            self.running = False  # the parent closed the pipe, or died
            return
        self.commands += data
        while b"\n" in self.commands:
            line, _, rest = bytes(self.commands).partition(b"\n")
            self.commands = bytearray(rest)
            self._reply(self._answer(line.decode().split()))

    def _answer(self, words: list[str]) -> str:
        if words[:1] == ["switch"] and len(words) == 2:
            self.target_port = int(words[1])
            return "ok"
        if words == ["count"]:
            return str(sum(not link.connecting for link in self.links))
        if words == ["drop"]:
            for link in list(self.links):
                self._close(link)
            return "ok"
        return f"error: unknown command {' '.join(words)!r}"

    def _reply(self, line: str) -> None:
        os.write(sys.stdout.fileno(), f"{line}\n".encode())

    # -- connections

    def _accept(self) -> None:
        try:
            downstream, _ = self.listener.accept()
        except OSError:
            return  # the client gave up before it was accepted
        upstream = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        for sock in (downstream, upstream):
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        error = upstream.connect_ex((self.host, self.target_port))
        link = _Link(downstream, upstream)
        self.links.add(link)
        if error == 0:
            link.connecting = False
        elif error != errno.EINPROGRESS:
            self._close(link)  # the client sees the connection closed, like a dead node
            return
        self._update(link)

    def _ready(self, link: _Link, sock: socket.socket, mask: int) -> None:
        if link not in self.links or sock not in self.masks:
            return  # closed by an earlier event of the same round
        if link.connecting:
            if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                self._close(link)  # refused: the client sees its connection closed
                return
            link.connecting = False
        elif mask & selectors.EVENT_READ:
            data: bytes | None
            try:
                data = sock.recv(CHUNK)
            except BlockingIOError:
                data = None
            except OSError:
                self._close(link)
                return
            if data == b"":
                link.ended = sock
            elif data:
                link.pending[link.peer(sock)] += data
                self._send(link, link.peer(sock))  # at once: no round of select per reply
        if link in self.links and mask & selectors.EVENT_WRITE:
            self._send(link, sock)
        if link in self.links:
            if link.finished:
                self._close(link)
            else:
                self._update(link)

    def _send(self, link: _Link, sock: socket.socket) -> None:
        pending = link.pending[sock]
        if not pending:
            return
        try:
            sent = sock.send(pending)
        except BlockingIOError:
            return
        except OSError:
            self._close(link)
            return
        del pending[:sent]

    def _update(self, link: _Link) -> None:
        """Register each socket for what it waits for: a side is read only once what it sent
        before has been taken by the other (so a slow reader slows the sender, as TCP would)."""
        for sock in (link.downstream, link.upstream):
            if link.connecting:
                mask = selectors.EVENT_WRITE if sock is link.upstream else 0
            else:
                mask = 0
                if link.ended is None and not link.pending[link.peer(sock)]:
                    mask |= selectors.EVENT_READ
                if link.pending[sock]:
                    mask |= selectors.EVENT_WRITE
            current = self.masks.get(sock, 0)
            if mask == current:
                continue
            if not current:
                self.selector.register(sock, mask, link)
            elif not mask:
                self.selector.unregister(sock)
            else:
                self.selector.modify(sock, mask, link)
            if mask:
                self.masks[sock] = mask
            else:
                self.masks.pop(sock, None)

    def _close(self, link: _Link) -> None:
        self.links.discard(link)
        for sock in (link.downstream, link.upstream):
            if self.masks.pop(sock, 0):
                self.selector.unregister(sock)
            with suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _timeout(self) -> float | None:
        deadlines = [link.deadline for link in self.links if link.connecting]
        return max(min(deadlines) - time.monotonic(), 0.0) if deadlines else None

    def _expire(self) -> None:
        now = time.monotonic()
        for link in [link for link in self.links if link.connecting and link.deadline <= now]:
            self._close(link)


def main(argv: list[str]) -> None:
    # Ctrl-C reaches the whole process group: the parent decides when this process ends.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    host, target_port = argv
    Proxy(host, int(target_port)).serve()


if __name__ == "__main__":
    main(sys.argv[1:])
