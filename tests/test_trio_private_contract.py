"""What ``trio_sampler._receive_time`` relies on that trio keeps private.

A stamped read waits for the socket, then makes one ``recvmsg`` on the standard-library
socket under trio's (``trio.socket.SocketType``'s ``_sock``). Where trio keeps none, the
read falls back to trio's own ``recvmsg``: still correct, one system call and a
``BlockingIOError`` slower per read. Silently slower is a regression, so this test fails
loudly, saying what changed, when an upgrade of trio moves that socket.
"""

from __future__ import annotations

import socket

import trio

from trio_sampler._receive_time import StampedSocketStream


async def test_a_trio_socket_keeps_the_standard_library_socket_a_stamped_read_uses() -> None:
    left, right = trio.socket.socketpair()
    with left, right:
        stream = StampedSocketStream(trio.SocketStream(left))
        raw = getattr(left, "_sock", None)
        assert isinstance(raw, socket.socket), (
            f"trio's socket no longer keeps its standard-library socket as `_sock` "
            f"(found {type(raw).__name__}): StampedSocketStream reads through trio's "
            "recvmsg instead; update StampedSocketStream.__init__"
        )
        assert stream._raw is raw
        await right.send(b"token")
        assert await stream.receive_some(64) == b"token"
