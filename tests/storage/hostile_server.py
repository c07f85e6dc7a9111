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

One thread serves every connection (:class:`poll_sockets.PollServer`), so hundreds of
trickling answers cost nothing; it stops by itself after ``lifetime_seconds``, or at
:meth:`HostileServer.stop`, closing every connection. ``answering(name)`` counts the
connections still in the middle of an answer for ``name``: a client that gives up and closes
its socket is seen at once.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from typing import Any

import pytest
from poll_sockets import Connection, PollServer

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


class HostileServer(PollServer):
    """Listens on ``127.0.0.1:port``; ``requests`` lists the names asked for, in order."""

    def __init__(self, *, lifetime_seconds: float = 60.0, trickle_seconds: float = 0.05) -> None:
        super().__init__(lifetime_seconds=lifetime_seconds, thread_name="hostile-server")
        self.trickle_seconds = trickle_seconds
        self.short_answers = 2
        self.chunk_size_line = b"-5"
        self.content_length = "10"
        self.requests: list[str] = []
        self.start()

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

    # -- what the loop asks ----------------------------------------------------------------

    def received(self, conn: Connection) -> None:
        if conn.pieces is not None or b"\r\n\r\n" not in conn.request:
            return
        head, _, rest = bytes(conn.request).partition(b"\r\n\r\n")
        conn.request = bytearray(rest)
        lines = head.decode("latin-1").split("\r\n")
        path = lines[0].split(" ")[1].split("?")[0]
        rng = next((line.split(":", 1)[1].strip() for line in lines[1:]
                    if line.lower().startswith("range:")), "")
        conn.name = path.rsplit("/", 1)[-1]
        self.requests.append(conn.name)
        self.answer(conn, self._head() if lines[0].startswith("HEAD ")
                    else self._answer(conn.name, rng))

    def answered(self, conn: Connection) -> None:
        conn.name = ""


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
