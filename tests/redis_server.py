"""A real redis-server for the tests and bench/: started on a free loopback port, stopped, paused,
restarted."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from urllib.parse import urlparse

import redis


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _server_version(binary: str) -> tuple[int, ...]:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True).stdout
    match = re.search(r"v=(\d+)\.(\d+)", out)
    return tuple(int(n) for n in match.groups()) if match else (0, 0)


class RedisServer:
    """One redis-server process this harness owns (``managed``), or an existing one from REDIS_URL.

    ``args`` are extra command-line options (after the defaults, so they override them),
    ``config`` the text of a config file passed first (Sentinel needs one it can rewrite; it is
    written once, so a restart reads what the server rewrote), ``port`` a port chosen by the
    caller (a cluster node needs port + 10000 free too).
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        args: Sequence[str] = (),
        config: str | None = None,
        port: int | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.managed = url is None
        self.env = env  # e.g. tests/clock_shift.py's shifted(): a server with its clock moved
        self.args = list(args)
        self.config = config
        self.process: subprocess.Popen[bytes] | None = None
        self.paused = False
        if url is None:
            binary = shutil.which("redis-server")
            if binary is None:
                raise RuntimeError("redis-server is not on PATH; install Debian's redis-server")
            self.binary = binary
            self.port = port or _free_port()
            self.dir = tempfile.mkdtemp(prefix="throttle-redis-")
            self.url = f"redis://127.0.0.1:{self.port}/0"
        else:
            self.url = url
            self.port = urlparse(url).port or 6379

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def client(self, **kwargs: object) -> redis.Redis:
        return redis.Redis.from_url(self.url, **kwargs)  # type: ignore[arg-type]

    def _require_managed(self) -> None:
        if not self.managed:
            raise RuntimeError("this test needs a redis-server the harness runs; unset REDIS_URL")

    @property
    def config_file(self) -> str:
        return os.path.join(self.dir, "redis.conf")

    def command(self) -> list[str]:
        """The command line: the config file if any, the defaults, then ``args``."""
        args = [self.binary]
        if self.config is not None:
            if not os.path.exists(self.config_file):
                with open(self.config_file, "w") as file:
                    file.write(self.config)
            args.append(self.config_file)
        args += [
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", self.dir,
            "--logfile", os.path.join(self.dir, "redis.log"),
        ]  # fmt: skip
        if _server_version(self.binary) >= (7, 0):
            args += ["--enable-debug-command", "local"]  # DEBUG SLEEP, for fault tests
        return args + self.args

    def start(self, timeout: float = 10.0) -> None:
        self._require_managed()
        self.process = subprocess.Popen(
            self.command(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=self.env
        )
        self.paused = False
        deadline = time.monotonic() + timeout
        probe = self.client(socket_timeout=0.5, socket_connect_timeout=0.5)
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.process.returncode}")
            try:
                if probe.ping():
                    break
            except redis.RedisError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"redis-server did not answer on port {self.port}") from None
                time.sleep(0.02)
        probe.close()

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL) and wait for it to exit."""
        if self.process is None:
            return
        if self.paused:
            self.resume()
        self.process.terminate()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None

    def kill(self) -> None:
        """Kill the server abruptly, as a crash would."""
        self._require_managed()
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None
            self.paused = False

    def pause(self) -> None:
        """SIGSTOP: the server keeps its connections but answers nothing (a hung server)."""
        self._require_managed()
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGCONT)
        self.paused = False

    def restart(self) -> None:
        self.stop()
        self.start()

    def close(self) -> None:
        if self.managed:
            self.stop()
            shutil.rmtree(self.dir, ignore_errors=True)
