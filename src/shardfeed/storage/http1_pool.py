"""Kept-alive HTTP/1.1 connections, pooled by ``(scheme, host)``, and the ranged GET a caller
makes on one (:func:`range_get`), which another thread may end at once (:class:`Abort`).

Idle connections are closed at exit and never shared with a forked child; a connection a GET
was aborted on, or whose answer left bytes unread, is closed, never pooled. The wire itself
(requests, answers, the bounds on what a misbehaving server can cost): :mod:`http1`.
"""
from __future__ import annotations

import atexit
import contextlib
import errno
import math
import os
import socket
import threading

from shardfeed.storage.http1 import Connection, Stale

MAX_IDLE = 64
"""Idle connections kept for one ``(scheme, host)``."""

_POOL: dict[tuple[str, str], list[Connection]] = {}
_POOL_LOCK = threading.Lock()


class Abort:
    """Lets another thread end a GET at once (the caller abandoned it: its deadline,
    ``close()``, Ctrl-C). :meth:`abort` shuts the GET's connection down: the thread waiting on
    it wakes, its GET fails, and the connection is closed, never pooled. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._conn: Connection | None = None
        self.aborted = False

    def abort(self) -> None:
        with self._lock:
            self.aborted = True
            sock = self._conn.sock if self._conn is not None else None
            if sock is not None:  # under the lock: the GET's thread cannot pool it meanwhile
                with contextlib.suppress(OSError):
                    # the plain socket's shutdown (a TLS socket's own would drop its TLS
                    # state under the thread reading it): that thread's read ends, failing
                    socket.socket.shutdown(sock, socket.SHUT_RDWR)

    def _hold(self, conn: Connection) -> None:
        with self._lock:
            if self.aborted:
                raise ConnectionAbortedError(errno.ECONNABORTED,
                                             f"GET to {conn.where} abandoned by its caller")
            self._conn = conn

    def _release(self) -> bool:
        """Forget the connection; False where it was aborted (then it is closed)."""
        with self._lock:
            self._conn = None
            return not self.aborted


def range_get(scheme: str, host: str, target: str, start: int, end: int,
              timeout: float, *, min_bytes_per_second: float = math.inf,
              abort: Abort | None = None) -> tuple[int, dict[str, str], bytes]:
    """One GET of ``Range: bytes=start..end-1``: the status, headers and body (of a ``200``,
    the whole object, its bytes ``[start, end)`` only); a kept-alive connection the server
    closed meanwhile is replaced once.

    ``timeout``: the most seconds one wait (to connect, for the next bytes) may take; the
    whole answer must arrive within it plus a second for each ``min_bytes_per_second`` bytes
    received (TimeoutError). ``abort``: ends the GET from another thread.
    """
    while True:
        conn = _idle(scheme, host)
        reused = conn is not None
        if conn is None:
            conn = Connection(scheme, host, timeout)
            conn.open()
        try:
            if abort is not None:
                abort._hold(conn)
            status, headers, body, keep = conn.get(
                target, start, end, reused=reused, min_bytes_per_second=min_bytes_per_second)
        except Stale:
            conn.close()
            if abort is not None:
                abort._release()
            continue  # only a pooled connection is stale: at most one pass for each
        except BaseException:
            conn.close()
            if abort is not None:
                abort._release()
            raise
        if (abort is None or abort._release()) and keep and not conn.buffer:
            _give_back(conn)
        else:
            conn.close()
        return status, headers, body


def _idle(scheme: str, host: str) -> Connection | None:
    with _POOL_LOCK:
        idle = _POOL.get((scheme, host))
        return idle.pop() if idle else None


@atexit.register
def _close_idle() -> None:
    """Close the kept-alive connections (at exit: said goodbye to, not left to the OS)."""
    with _POOL_LOCK:
        idle = [conn for conns in _POOL.values() for conn in conns]
        _POOL.clear()
    for conn in idle:
        conn.close()


def _give_back(conn: Connection) -> None:
    with _POOL_LOCK:
        idle = _POOL.setdefault((conn.scheme, conn.host), [])
        if len(idle) < MAX_IDLE:
            idle.append(conn)
            return
    conn.close()


def _reset_after_fork() -> None:
    global _POOL_LOCK
    _POOL_LOCK = threading.Lock()
    _POOL.clear()  # the child may not share the parent's sockets


os.register_at_fork(after_in_child=_reset_after_fork)

__all__ = ["MAX_IDLE", "Abort", "range_get"]
