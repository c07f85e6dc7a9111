"""An HTTP/1.1 server on 127.0.0.1 that answers ranged GETs the way a bad server does.

Every object it serves has the same bytes (:func:`object_bytes`) and the same size (a HEAD
is answered so); what it does with a GET
depends on the object's name (the last part of the path, e.g. ``/bucket/trickle.bin``):

==============  =============================================================================
``good.bin``     ``206`` with the range asked, as an S3 server answers
``whole.bin``    ``200`` with the whole object (the server ignores ``Range``), streamed
``trickle.bin``  ``206``, its headers at once, then its body one byte every ``trickle_seconds``
``short.bin``    ``206`` with the first half of the range only (its Content-Range says so),
                 for the first ``short_answers`` GETs of it; then as ``good.bin``
``chunked.bin``  ``206`` in chunked encoding whose first chunk size line is ``chunk_size_line``
``length.bin``   ``206`` whose Content-Length header is ``content_length``
==============  =============================================================================

One thread serves every connection (non-blocking sockets and ``poll``), so hundreds of
trickling answers cost nothing; it stops by itself after ``lifetime_seconds``, or at
:meth:`HostileServer.stop`, closing every connection. ``answering(name)`` counts the
connections still in the middle of an answer for ``name``: a client that gives up and closes
its socket is seen at once.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from poll_sockets import ready

OBJECT_BYTES = 48 << 20
"""The size of every object served."""
_PERIOD = 1_000_003  # not a power of two: an offset error shows in the bytes read
_BLOCK = os.urandom(_PERIOD)
_TWICE = memoryview(_BLOCK + _BLOCK)  # any window up to _PERIOD bytes is one slice of it

KEY = "hostile-key"
SECRET = "hostile-secret"


def object_bytes(start: int, end: int) -> bytes:
    """Bytes ``[start, end)`` of every object served (``end`` clipped to its size)."""
    end = min(end, OBJECT_BYTES)
    out = bytearray()
    while start < end:
        at = start % _PERIOD
        take = min(end - start, _PERIOD - at)
        out += _TWICE[at : at + take]
        start += take
    return bytes(out)


def _stream(start: int, end: int, piece: int = 256 << 10) -> Iterator[tuple[float, Any]]:
    """The object's bytes ``[start, end)`` as slices of one buffer (nothing allocated)."""
    while start < end:
        at = start % _PERIOD
        take = min(end - start, piece, _PERIOD)
        yield 0.0, _TWICE[at : at + take]
        start += take


class _Client:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.request = bytearray()
        self.name = ""
        self.pieces: Iterator[tuple[float, Any]] | None = None  # the answer being sent
        self.current: memoryview | None = None
        self.due = 0.0


class HostileServer:
    """Listens on ``127.0.0.1:port``; ``requests`` lists the names asked for, in order."""

    def __init__(self, *, lifetime_seconds: float = 60.0, trickle_seconds: float = 0.05) -> None:
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(256)
        self._listener.setblocking(False)
        self.port = int(self._listener.getsockname()[1])
        self.endpoint_url = f"http://127.0.0.1:{self.port}"
        self.trickle_seconds = trickle_seconds
        self.short_answers = 2
        self.chunk_size_line = b"-5"
        self.content_length = "10"
        self.requests: list[str] = []
        self._clients: list[_Client] = []
        self._lifetime_seconds = lifetime_seconds
        self._stop = threading.Event()
        self.failure: BaseException | None = None
        self._thread = threading.Thread(target=self._serve, name="hostile-server", daemon=True)
        self._thread.start()

    def answering(self, name: str) -> int:
        """Connections in the middle of an answer for ``name``."""
        return sum(1 for c in list(self._clients) if c.pieces is not None and c.name == name)

    def storage_options(self, **config: Any) -> dict[str, Any]:
        """s3fs options that send every request here (``config``: botocore settings)."""
        return {
            "key": KEY,
            "secret": SECRET,
            "client_kwargs": {"endpoint_url": self.endpoint_url, "region_name": "us-east-1"},
            "config_kwargs": dict(config),
        }

    def stop(self) -> None:
        """Stop serving; raise what ended the serving thread early, if anything did (a
        test that saw no answer must not pass or fail for the server's own fault)."""
        self._stop.set()
        self._thread.join(timeout=10)
        if self.failure is not None:
            raise AssertionError(f"the test server failed: {self.failure!r}") from self.failure

    # -- answers ----------------------------------------------------------------------------

    def _head(self) -> Iterator[tuple[float, Any]]:
        """Every object's size, as S3 answers a HEAD."""
        yield 0.0, f"HTTP/1.1 200 OK\r\nContent-Length: {OBJECT_BYTES}\r\n\r\n".encode()

    def _answer(self, name: str, rng: str) -> Iterator[tuple[float, Any]]:
        match = re.fullmatch(r"bytes=(\d+)-(\d+)", rng)
        start, last = (int(match.group(1)), int(match.group(2))) if match else (0, 0)
        end = min(last + 1, OBJECT_BYTES)
        if name == "whole.bin":
            yield 0.0, f"HTTP/1.1 200 OK\r\nContent-Length: {OBJECT_BYTES}\r\n\r\n".encode()
            yield from _stream(0, OBJECT_BYTES)
            return
        if name == "short.bin" and self.short_answers > 0:
            self.short_answers -= 1
            end = start + max(1, (end - start) // 2)
        head = (f"HTTP/1.1 206 Partial Content\r\n"
                f"Content-Range: bytes {start}-{end - 1}/{OBJECT_BYTES}\r\n")
        if name == "chunked.bin":
            yield 0.0, (head + "Transfer-Encoding: chunked\r\n\r\n").encode()
            yield 0.0, self.chunk_size_line + b"\r\n" + object_bytes(start, end) + b"\r\n0\r\n\r\n"
            return
        length = self.content_length if name == "length.bin" else str(end - start)
        yield 0.0, (head + f"Content-Length: {length}\r\n\r\n").encode("latin-1")
        if name == "trickle.bin":
            for k in range(start, end):
                yield self.trickle_seconds, _TWICE[k % _PERIOD : k % _PERIOD + 1]
            return
        yield from _stream(start, end)

    # -- the loop ---------------------------------------------------------------------------

    def _serve(self) -> None:
        ends = time.monotonic() + self._lifetime_seconds
        try:
            while not self._stop.is_set() and time.monotonic() < ends:
                self._turn()
        except BaseException as exc:  # noqa: BLE001 - raised again by stop()
            self.failure = exc
        finally:
            for client in self._clients:
                client.sock.close()
            self._listener.close()

    def _turn(self) -> None:
        now = time.monotonic()
        clients = self._clients
        writers = [c.sock for c in clients if c.current is not None and c.due <= now]
        waits = [c.due - now for c in clients if c.current is not None and c.due > now]
        timeout = min([0.05, *waits])
        readable, writable = ready([self._listener, *(c.sock for c in clients)], writers,
                                   timeout)
        for sock in readable:
            if sock is self._listener:
                with contextlib.suppress(BlockingIOError):
                    conn, _ = self._listener.accept()
                    conn.setblocking(False)
                    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # no 40 ms waits
                    clients.append(_Client(conn))
                continue
            self._read(next(c for c in clients if c.sock is sock))
        for sock in writable:
            client = next((c for c in clients if c.sock is sock), None)
            if client is not None:
                self._write(client)

    def _drop(self, client: _Client) -> None:
        if client in self._clients:
            self._clients.remove(client)
        client.sock.close()

    def _read(self, client: _Client) -> None:
        try:
            data = client.sock.recv(65536)
        except OSError:
            data = b""
        if not data:  # the client closed its end
            self._drop(client)
            return
        client.request += data
        if client.pieces is None and b"\r\n\r\n" in client.request:
            head, _, rest = bytes(client.request).partition(b"\r\n\r\n")
            client.request = bytearray(rest)
            lines = head.decode("latin-1").split("\r\n")
            path = lines[0].split(" ")[1].split("?")[0]
            rng = next((line.split(":", 1)[1].strip() for line in lines[1:]
                        if line.lower().startswith("range:")), "")
            client.name = path.rsplit("/", 1)[-1]
            self.requests.append(client.name)
            client.pieces = (self._head() if lines[0].startswith("HEAD ")
                             else self._answer(client.name, rng))
            self._next_piece(client, time.monotonic())

    def _next_piece(self, client: _Client, now: float) -> None:
        assert client.pieces is not None
        piece = next(client.pieces, None)
        if piece is None:
            client.pieces, client.current, client.name = None, None, ""
            return
        delay, data = piece
        client.current, client.due = memoryview(data), now + delay

    def _write(self, client: _Client) -> None:
        assert client.current is not None
        try:
            sent = client.sock.send(client.current)
        except BlockingIOError:
            return
        except OSError:
            self._drop(client)
            return
        client.current = client.current[sent:]
        if not len(client.current):
            self._next_piece(client, time.monotonic())


@pytest.fixture()
def hostile_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[HostileServer]:
    """A hostile endpoint; ``s3://hostile/`` is registered to point at it (no request leaves
    127.0.0.1: the credentials are given, instance metadata look-ups are off)."""
    from shardfeed.storage.remote import set_storage_options

    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY",
                 "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    server = HostileServer()
    set_storage_options("s3://hostile/", **server.storage_options())
    try:
        yield server
    finally:
        set_storage_options("s3://hostile/")
        server.stop()
