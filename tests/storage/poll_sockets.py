"""Test servers on one thread: which sockets are ready, by ``poll`` (:func:`ready`), and the
loop that accepts, reads, writes and drops their connections (:class:`PollServer`).

``select.select`` refuses file descriptors above 1023, which a long test run (or a training
process) holding many files open has: hence ``poll``.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any


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


Pieces = Iterator[tuple[float, Any]]
"""An answer: ``(delay_seconds, bytes)`` pieces, each sent ``delay_seconds`` after the one
before is out; an empty piece closes the connection."""


class Connection:
    """One client: its socket, what it sent and nobody read yet, the answer being sent."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.request = bytearray()
        self.name = ""  # what the server calls the request being answered
        self.pieces: Pieces | None = None  # the answer being sent
        self.current: memoryview | None = None  # what is left of its piece being sent
        self.due = 0.0
        self.opened = time.monotonic()


class PollServer:
    """Listens on ``host``'s ``port``; one daemon thread accepts, reads and writes every
    connection (non-blocking sockets), so hundreds of slow answers cost nothing. It stops by
    itself after ``lifetime_seconds``, or at :meth:`stop`, closing every connection.

    A subclass answers: :meth:`received` is called when a connection has sent bytes (read
    ``conn.request``, then :meth:`answer` with the pieces), :meth:`answered` when an answer
    is out. A connection open longer than ``max_connection_seconds`` is dropped (None: never).
    """

    max_connection_seconds: float | None = None

    def __init__(self, *, host: str = "127.0.0.1", lifetime_seconds: float,
                 thread_name: str) -> None:
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.bind((host, 0))
        self._listener.listen(256)
        self._listener.setblocking(False)
        self.port = int(self._listener.getsockname()[1])
        self.endpoint_url = f"http://{host}:{self.port}"
        self._clients: list[Connection] = []
        self.connections = 0  # accepted so far
        self._lifetime_seconds = lifetime_seconds
        self._stop = threading.Event()
        self.failure: BaseException | None = None
        self._thread = threading.Thread(target=self._serve, name=thread_name, daemon=True)

    @property
    def open_connections(self) -> int:
        """Connections accepted and not yet closed (by either end)."""
        return len(self._clients)

    def start(self) -> None:
        """Start serving (a subclass calls it once its own attributes are set)."""
        self._thread.start()

    def stop(self) -> None:
        """Stop serving; raise what ended the serving thread early, if anything did (a
        test that saw no answer must not pass or fail for the server's own fault)."""
        self._stop.set()
        self._thread.join(timeout=10)
        if self.failure is not None:
            raise AssertionError(f"the test server failed: {self.failure!r}") from self.failure

    # -- what a subclass does ---------------------------------------------------------------

    def received(self, conn: Connection) -> None:
        """``conn`` sent more bytes (in ``conn.request``)."""
        raise NotImplementedError

    def answered(self, conn: Connection) -> None:
        """The answer on ``conn`` is out (its ``pieces`` None again)."""

    def answer(self, conn: Connection, pieces: Pieces) -> None:
        """Send ``pieces`` on ``conn``, starting now."""
        conn.pieces = pieces
        self._next_piece(conn, time.monotonic())

    # -- the loop ---------------------------------------------------------------------------

    def _serve(self) -> None:
        ends = time.monotonic() + self._lifetime_seconds
        try:
            while not self._stop.is_set() and time.monotonic() < ends:
                self._turn()
        except BaseException as exc:  # noqa: BLE001 - raised again by stop()
            self.failure = exc
        finally:
            for conn in self._clients:
                conn.sock.close()
            self._listener.close()

    def _turn(self) -> None:
        now = time.monotonic()
        clients = self._clients
        if self.max_connection_seconds is not None:
            for conn in [c for c in clients if now - c.opened > self.max_connection_seconds]:
                self._drop(conn)
        writers = [c.sock for c in clients if c.current is not None and c.due <= now]
        waits = [c.due - now for c in clients if c.current is not None and c.due > now]
        readable, writable = ready([self._listener, *(c.sock for c in clients)], writers,
                                   min([0.05, *waits]))
        for sock in readable:
            if sock is self._listener:
                with contextlib.suppress(BlockingIOError):
                    accepted, _ = self._listener.accept()
                    accepted.setblocking(False)
                    accepted.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # no 40 ms
                    clients.append(Connection(accepted))
                    self.connections += 1
                continue
            reader = next((c for c in clients if c.sock is sock), None)
            if reader is not None:
                self._read(reader)
        for sock in writable:
            writer = next((c for c in clients if c.sock is sock), None)
            if writer is not None:
                self._write(writer)

    def _drop(self, conn: Connection) -> None:
        if conn in self._clients:
            self._clients.remove(conn)
        conn.sock.close()

    def _read(self, conn: Connection) -> None:
        try:
            data = conn.sock.recv(65536)
        except OSError:
            data = b""
        if not data:  # the client closed its end
            self._drop(conn)
            return
        conn.request += data
        self.received(conn)

    def _next_piece(self, conn: Connection, now: float) -> None:
        assert conn.pieces is not None
        piece = next(conn.pieces, None)
        if piece is None:
            conn.pieces, conn.current = None, None
            self.answered(conn)
            return
        delay, data = piece
        if not len(data):
            self._drop(conn)
            return
        conn.current, conn.due = memoryview(data), now + delay

    def _write(self, conn: Connection) -> None:
        assert conn.current is not None
        try:
            sent = conn.sock.send(conn.current)
        except BlockingIOError:
            return
        except OSError:
            self._drop(conn)
            return
        conn.current = conn.current[sent:]
        if not len(conn.current):
            self._next_piece(conn, time.monotonic())
