"""A private ``redis-server`` on a Unix socket, for the fleet tests and benchmarks.

Started from the Debian ``redis-server`` binary (``apt-get install redis-server``) in a
temporary directory, persistence off (``--save '' --appendonly no``), no TCP port, and
stopped (and waited for) at the end. :meth:`RedisServer.stop` and :meth:`start` let a test
take Redis away mid-run and bring it back on the same socket.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

__all__ = ["RedisServer", "RedisUnavailableError", "running_redis"]

_START_TIMEOUT = 10.0


class RedisUnavailableError(RuntimeError):
    """``redis-server`` is not installed or did not start."""


class RedisServer:
    """One ``redis-server`` process serving ``unix://<dir>/redis.sock`` (and TCP on
    127.0.0.1:``port`` when a port is given)."""

    def __init__(self, directory: Path, binary: str, port: int = 0) -> None:
        self.directory = directory
        self.binary = binary
        self.port = port
        self.socket_path = directory / "redis.sock"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"unix://{self.socket_path}"

    @property
    def tcp_url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--unixsocket",
                str(self.socket_path),
                "--unixsocketperm",
                "700",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.directory),
                "--loglevel",
                "warning",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + _START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                err = (
                    self.process.stderr.read().decode(errors="replace")
                    if self.process.stderr
                    else ""
                )
                raise RedisUnavailableError(f"redis-server exited at start: {err.strip()[:500]}")
            if self._ping():
                return
            time.sleep(0.01)
        self.stop()
        raise RedisUnavailableError(f"redis-server did not answer within {_START_TIMEOUT} s")

    def _ping(self) -> bool:
        try:
            with socket.socket(socket.AF_UNIX) as sock:
                sock.settimeout(0.5)
                sock.connect(str(self.socket_path))
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        """Kill the server (as an outage would) and wait for it to be gone."""
        process, self.process = self.process, None
        if process is None:
            return
        process.kill()
        process.wait(timeout=10)
        if process.stderr is not None:
            process.stderr.close()
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()

    def flush(self) -> None:
        """Forget every key (tests share one server)."""
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(5)
            sock.connect(str(self.socket_path))
            sock.sendall(b"FLUSHALL\r\n")
            sock.recv(16)


@contextlib.contextmanager
def running_redis(port: int = 0) -> Iterator[RedisServer]:
    """A started :class:`RedisServer` (also on TCP 127.0.0.1:``port`` unless 0); raises
    :class:`RedisUnavailableError` if it cannot."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RedisUnavailableError(
            "redis-server is not installed (Debian: apt-get install redis-server)"
        )
    with tempfile.TemporaryDirectory(prefix="trio-sampler-redis-") as tmp:
        server = RedisServer(Path(tmp), binary, port)
        server.start()
        try:
            yield server
        finally:
            server.stop()
