"""``httpcore2``'s Trio network backend, with each read timed by when its bytes arrived.

What :class:`~trio_sampler.client.SamplingClient` puts under its connection pools when
``SamplerConfig.receive_timestamps`` is on: TCP connections are opened as
``httpcore2.TrioBackend`` opens them, and read through a
:class:`~trio_sampler._receive_time.StampedSocketStream` (under TLS too: the TLS stream
reads through it), so every read sets ``LAST_RECEIVED`` in the reading task. Everything
else (writes, TLS, the socket's details, errors as httpcore's) is what ``TrioBackend``'s
streams do, through ``httpcore2``'s public network-backend interface.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import httpcore2
import trio

from ._receive_time import StampedSocketStream

__all__ = ["StampedTrioBackend", "is_stamped"]


@contextmanager
def _mapped(timeout: type[Exception], broken: type[Exception]) -> Iterator[None]:
    try:
        yield
    except trio.TooSlowError as exc:
        raise timeout(exc) from exc
    except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
        raise broken(exc) from exc


def _limit(timeout: float | None) -> float:
    return float("inf") if timeout is None else timeout


class _StampedStream(httpcore2.AsyncNetworkStream):
    """A connection: a :class:`StampedSocketStream`, or a TLS stream over one."""

    def __init__(self, stream: trio.SSLStream[StampedSocketStream] | StampedSocketStream) -> None:
        self._stream = stream

    def _socket_stream(self) -> StampedSocketStream:
        stream = self._stream
        return stream.transport_stream if isinstance(stream, trio.SSLStream) else stream

    # ``timeout`` parameters: httpcore2's interface (ASYNC109).
    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:  # noqa: ASYNC109
        with _mapped(httpcore2.ReadTimeout, httpcore2.ReadError), trio.fail_after(_limit(timeout)):
            return bytes(await self._stream.receive_some(max_bytes))

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:  # noqa: ASYNC109
        if not buffer:
            return
        with (
            _mapped(httpcore2.WriteTimeout, httpcore2.WriteError),
            trio.fail_after(_limit(timeout)),
        ):
            await self._stream.send_all(buffer)

    async def aclose(self) -> None:
        await self._stream.aclose()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> httpcore2.AsyncNetworkStream:
        assert isinstance(self._stream, StampedSocketStream)  # TLS over plain TCP only
        tls = trio.SSLStream(
            self._stream,
            ssl_context=ssl_context,
            server_hostname=server_hostname,
            https_compatible=True,
            server_side=False,
        )
        try:
            with (
                _mapped(httpcore2.ConnectTimeout, httpcore2.ConnectError),
                trio.fail_after(_limit(timeout)),
            ):
                await tls.do_handshake()
        except BaseException:
            await self.aclose()
            raise
        return _StampedStream(tls)

    def get_extra_info(self, info: str) -> Any:
        if info == "ssl_object" and isinstance(self._stream, trio.SSLStream):
            return self._stream._ssl_object  # as TrioStream does
        if info == "client_addr":
            return self._socket_stream().socket.getsockname()
        if info == "server_addr":
            return self._socket_stream().socket.getpeername()
        if info == "socket":
            return self._socket_stream().socket
        if info == "is_readable":
            return self._socket_stream().socket.is_readable()
        return None


def is_stamped(network_stream: object) -> bool:
    """Whether ``network_stream`` (a response's ``network_stream`` extension) times its
    reads: one of :class:`StampedTrioBackend`'s connections."""
    return type(network_stream) is _StampedStream


class StampedTrioBackend(httpcore2.TrioBackend):
    """``httpcore2.TrioBackend`` whose TCP connections time their reads (see module)."""

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109
        local_address: str | None = None,
        socket_options: Iterable[httpcore2.SOCKET_OPTION] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        with (
            _mapped(httpcore2.ConnectTimeout, httpcore2.ConnectError),
            trio.fail_after(_limit(timeout)),
        ):
            try:
                stream = await trio.open_tcp_stream(host, port, local_address=local_address)
            except OSError as exc:
                raise httpcore2.ConnectError(exc) from exc
            for option in socket_options or ():
                stream.setsockopt(*option)
        return _StampedStream(StampedSocketStream(stream))
