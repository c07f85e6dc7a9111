"""Which sockets are ready, by ``poll``: ``select.select`` refuses file descriptors above
1023, which a long test run (or a training process) holding many files open has."""

from __future__ import annotations

import select
import socket
from collections.abc import Sequence


def ready(readers: Sequence[socket.socket], writers: Sequence[socket.socket],
          timeout_seconds: float) -> tuple[list[socket.socket], list[socket.socket]]:
    """The sockets of ``readers`` with something to read (or closed by the peer) and those of
    ``writers`` that can take bytes, waiting up to ``timeout_seconds`` for one."""
    poller = select.poll()
    wanted: dict[int, int] = {}
    for sock in readers:
        wanted[sock.fileno()] = wanted.get(sock.fileno(), 0) | select.POLLIN
    for sock in writers:
        wanted[sock.fileno()] = wanted.get(sock.fileno(), 0) | select.POLLOUT
    for fd, mask in wanted.items():
        poller.register(fd, mask)
    events = dict(poller.poll(max(timeout_seconds, 0.0) * 1000))
    readable_mask = select.POLLIN | select.POLLHUP | select.POLLERR
    readable = [s for s in readers if events.get(s.fileno(), 0) & readable_mask]
    writable = [s for s in writers if events.get(s.fileno(), 0) & (select.POLLOUT | select.POLLERR)]
    return readable, writable
