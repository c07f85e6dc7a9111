"""One HTTP/1.1 connection and the ranged GETs it sends and reads (the pool of kept-alive
connections and the GET a caller makes: :mod:`shardfeed.storage.http1_pool`).

A GET of a range is a few lines of HTTP/1.1 each way; http.client parses every answer's
headers with the email package and builds objects around its socket (about 150 us of CPU a
request here, three times what the exchange itself takes). A connection here sends one
prebuilt request and reads the answer's status line and headers with str methods, its body
into the bytes object it is handed back as (the compiled ``_recv``, where built, for
plain-HTTP connections; else ``recv_into`` a buffer and one copy).

A server may misbehave; what it can cost is bounded:

- memory: the range asked. A ``200`` (the server ignored Range and sends the whole object)
  has the bytes before the range read and dropped in pieces of :data:`DISCARD_BYTES`, and
  the connection closed after the range; a ``206`` longer than the range is refused.
- time: every wait (connect, next bytes) at most ``timeout``, and the whole answer at most
  ``timeout`` plus a second for each ``min_bytes_per_second`` bytes received, so a body that
  trickles in fails too (TimeoutError naming the URL). An ``Abort`` (http1_pool) ends a GET
  from another thread at once (its connection shut down and closed).

Answers that are not HTTP/1.x as expected (cut, garbled, a chunk size or Content-Length that
is not a number, headers or a body longer than allowed) raise :class:`BadAnswer`, a
transient ConnectionError naming the URL (without its query: a presigned URL's signature is
never in a message) and what was wrong, never the body's bytes.
"""
from __future__ import annotations

import importlib
import logging
import math
import re
import socket
import time
from typing import Any
from urllib.parse import urlsplit

logger = logging.getLogger(__name__)

MAX_HEADER_BYTES = 64 << 10
"""An answer whose headers run longer than this is refused as garbled."""
MAX_ERROR_BODY = 64 << 10
"""Bytes of an error answer's body read (for its code); the connection is closed after more."""
DISCARD_BYTES = 64 << 10
"""The piece in which the bytes of a whole-object answer before the range asked are read and
dropped."""


def _compiled_recv() -> Any:
    """``shardfeed.storage._recv`` (source: ``_recv.c`` beside this file), or None where
    the package was built without it: ``Connection._exactly`` then reads by ``recv_into``."""
    try:
        return importlib.import_module("shardfeed.storage._recv")
    except ImportError:
        return None


_recv = _compiled_recv()


class BadAnswer(ConnectionError):
    """An answer that is not HTTP/1.1 as expected (cut, garbled, too long): transient."""

    advice = ("the server (or a proxy before it) sent an answer that is not HTTP/1.1 as "
              "expected: check it")


class Stale(ConnectionError):
    """A kept-alive connection the server had closed before the request (nothing answered)."""


class Connection:
    """One HTTP/1.1 connection to ``scheme://host``."""

    def __init__(self, scheme: str, host: str, timeout: float) -> None:
        self.scheme, self.host, self.timeout = scheme, host, timeout
        self.sock: socket.socket | None = None
        self.wait_seconds = timeout  # the socket's timeout now
        self.buffer = bytearray()  # bytes received past the answer being read (none, normally)
        self.target = ""  # of the GET being answered
        self.ends = math.inf  # when the answer being read must be complete (monotonic)
        self.allowed = math.inf  # the seconds it was given, for messages
        self.min_bytes_per_second = math.inf

    def open(self) -> None:
        """Connect; a failure names the endpoint (as botocore's EndpointConnectionError
        does), keeping its type and errno (``is_transient`` reads them)."""
        url = urlsplit(f"{self.scheme}://{self.host}")
        port = url.port or (443 if self.scheme == "https" else 80)
        try:
            sock = socket.create_connection((url.hostname, port), timeout=self.timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.scheme == "https":
                sock = _tls().wrap_socket(sock, server_hostname=url.hostname)
        except OSError as exc:
            what = exc.strerror or str(exc) or type(exc).__name__
            raise type(exc)(exc.errno, f"could not connect to the endpoint "
                                       f"{self.scheme}://{self.host}: {what}") from exc
        self.sock = sock

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def get(self, target: str, start: int, end: int, *, reused: bool,
            min_bytes_per_second: float) -> tuple[int, dict[str, str], bytes, bool]:
        """GET ``Range: bytes=start..end-1``: the status, the headers (lower-case names),
        the body (of a ``200``, the whole object: its bytes ``[start, end)`` only) and
        whether the connection can be used again. All of it must arrive within the timeout
        plus a second for each ``min_bytes_per_second`` bytes received (TimeoutError)."""
        assert self.sock is not None
        self.target = target
        self.min_bytes_per_second = min_bytes_per_second
        self.allowed = self.timeout + (end - start) / min_bytes_per_second
        self.ends = time.monotonic() + self.allowed
        request = (f"GET {target} HTTP/1.1\r\nHost: {self.host}\r\n"
                   f"Range: bytes={start}-{end - 1}\r\nAccept-Encoding: identity\r\n"
                   "User-Agent: shardfeed\r\n\r\n")
        if self.wait_seconds != self.timeout:  # a pooled one may keep its last, shorter wait
            self._wait(self.timeout)
        try:
            self.sock.sendall(request.encode("ascii"))
        except (BrokenPipeError, ConnectionResetError) as exc:
            if reused:
                raise Stale(str(exc)) from exc
            raise
        status, headers = self._head(reused=reused)
        keep = headers.get("connection", "").lower() != "close"
        if status == 206:
            body, keep = self._body(headers, skip=0, limit=end - start, keep=keep,
                                    over="refuse")
        elif status == 200:  # the whole object (the server ignored Range)
            _warn_whole_answers(self.host)
            self._allow(start / min_bytes_per_second)  # the bytes before the range come too
            body, keep = self._body(headers, skip=start, limit=end - start, keep=keep,
                                    over="stop")
        else:
            body, keep = self._body(headers, skip=0, limit=MAX_ERROR_BODY, keep=keep,
                                    over="stop")
        return status, headers, body, keep

    @property
    def where(self) -> str:
        """What messages name: the URL asked, without its query."""
        return f"{self.scheme}://{self.host}{self.target.partition('?')[0]}"

    def _allow(self, seconds: float) -> None:
        self.ends += seconds
        self.allowed += seconds

    def _head(self, *, reused: bool) -> tuple[int, dict[str, str]]:
        """The status and headers of the next answer (1xx answers skipped)."""
        while True:
            buf = self.buffer
            while (end := buf.find(b"\r\n\r\n", 0, MAX_HEADER_BYTES + 4)) < 0:
                if len(buf) > MAX_HEADER_BYTES:
                    raise BadAnswer(f"answer from {self.where} has over "
                                    f"{MAX_HEADER_BYTES} bytes of headers")
                try:
                    chunk = self._recv("the headers")
                except ConnectionResetError as exc:
                    if reused and not buf:
                        raise Stale(str(exc)) from exc
                    raise
                if not chunk:
                    if reused and not buf:
                        raise Stale("closed before answering")
                    raise BadAnswer(f"answer from {self.where} cut in its headers")
                buf += chunk
            lines = buf[:end].decode("latin-1").split("\r\n")
            del buf[: end + 4]
            version, _, rest = lines[0].partition(" ")
            code = rest[:3]
            if not version.startswith("HTTP/1.") or not (code.isascii() and code.isdigit()):
                raise BadAnswer(f"answer from {self.where} is not HTTP/1.x (its first line "
                                f"has {len(lines[0])} characters and no status code)")
            headers: dict[str, str] = {}
            for line in lines[1:]:
                name, colon, value = line.partition(":")
                if not colon:
                    raise BadAnswer(f"answer from {self.where} has a garbled header "
                                    f"{line[:80]!r}")
                headers[name.strip().lower()] = value.strip()
            if version == "HTTP/1.0" and headers.get("connection", "").lower() != "keep-alive":
                headers["connection"] = "close"
            if not code.startswith("1"):
                return int(code), headers

    def _body(self, headers: dict[str, str], *, skip: int, limit: int, keep: bool,
              over: str) -> tuple[bytes, bool]:
        """Bytes ``[skip, skip + limit)`` of the body (fewer where it ends first), those
        before ``skip`` read and dropped; ``over="refuse"``: a body longer than ``limit`` is
        a BadAnswer, ``"stop"``: the rest of it is left unread (the connection closed)."""
        if headers.get("transfer-encoding", "identity").lower() != "identity":
            return self._chunked(skip, limit, keep, over)
        length = headers.get("content-length")
        if length is None:  # the body runs to the end of the connection
            if not self._discard(skip, until_close=True):
                return b"", False
            return self._exactly(limit, until_close=True), False
        if not (length.isascii() and length.isdigit()) or len(length) > 18:  # not "\u00b2"
            raise BadAnswer(f"answer from {self.where} has Content-Length {length[:40]!r}, "
                            "not a number of bytes")
        n = int(length)
        if n > skip + limit:
            if over == "refuse":
                raise BadAnswer(f"answer from {self.where} has Content-Length {n} for a "
                                f"range of {limit} bytes")
            self._discard(skip)
            return self._exactly(limit), False  # the rest is never read: close
        if n <= skip:  # the object ends before the range: nothing of it is read
            return b"", False
        if skip:
            self._discard(skip)
        return self._exactly(n - skip), keep

    def _chunked(self, skip: int, limit: int, keep: bool, over: str) -> tuple[bytes, bool]:
        parts = bytearray()
        seen = 0  # bytes of the body before this chunk
        while True:
            size = self._chunk_size()
            if size == 0:
                while self._line():  # trailers, up to the empty line
                    pass
                return bytes(parts), keep
            if seen + size > skip + limit and over == "refuse":
                raise BadAnswer(f"answer from {self.where} has a chunk size of {size} bytes, "
                                f"past the {limit} bytes of its range")
            drop = min(size, max(0, skip - seen))
            self._discard(drop)
            take = min(size, skip + limit - seen) - drop
            parts += self._exactly(take)
            if seen + size > skip + limit:  # the rest is never read: close
                return bytes(parts), False
            seen += size
            if self._line():
                raise BadAnswer(f"answer from {self.where} has a chunk longer than its "
                                "chunk size said")

    def _chunk_size(self) -> int:
        """The size of the next chunk, from its line (hexadecimal digits, then extensions)."""
        line = self._line()
        size_text = line.split(b";", 1)[0].strip(b" \t")
        if _HEX_DIGITS.fullmatch(size_text) is None:
            raise BadAnswer(f"answer from {self.where} has a garbled chunk size (a line of "
                            f"{len(line)} bytes, not hexadecimal digits)")
        return int(size_text.lstrip(b"0") or b"0", 16)

    def _line(self) -> bytes:
        buf = self.buffer
        while (end := buf.find(b"\r\n")) < 0:
            if len(buf) > MAX_HEADER_BYTES:
                raise BadAnswer(f"answer from {self.where} has a line over "
                                f"{MAX_HEADER_BYTES} bytes")
            chunk = self._recv("a chunk's line")
            if not chunk:
                raise BadAnswer(f"answer from {self.where} cut in its body")
            buf += chunk
        line = bytes(buf[:end])
        del buf[: end + 2]
        return line

    def _discard(self, n: int, *, until_close: bool = False) -> bool:
        """Read and drop the next ``n`` bytes, a piece at a time (what a ``200`` sends before
        the range asked is never held); False where the connection ended first
        (``until_close``; else BadAnswer)."""
        have = min(n, len(self.buffer))
        del self.buffer[:have]
        if have == n:
            return True
        scratch = memoryview(bytearray(min(n - have, DISCARD_BYTES)))
        while have < n:
            got = self._recv_into(scratch[: min(n - have, len(scratch))])
            if not got:
                if until_close:
                    return False
                raise BadAnswer(f"answer from {self.where} cut at {have} of {n} bytes")
            have += got
        return True

    def _exactly(self, n: int, *, until_close: bool = False) -> bytes:
        """The next ``n`` bytes (``until_close``: at most ``n``, up to the end of the
        connection)."""
        assert self.sock is not None
        if _recv is not None and self.scheme == "http":
            have = min(n, len(self.buffer))
            prefix = bytes(self.buffer[:have])
            del self.buffer[:have]
            try:
                body: bytes = _recv.exact(self.sock.fileno(), n, prefix, self.timeout,
                                          self.ends - time.monotonic())
            except TimeoutError:
                raise self._timed_out(f"fewer than {n} bytes of the body") from None
            if len(body) < n and not until_close:
                raise BadAnswer(f"answer from {self.where} cut at {len(body)} of {n} bytes")
            return body
        out = bytearray(n)
        have = min(n, len(self.buffer))
        out[:have] = self.buffer[:have]
        del self.buffer[:have]
        view = memoryview(out)
        while have < n:
            try:
                got = self._recv_into(view[have:])
            except TimeoutError as exc:
                raise self._timed_out(f"{have} bytes of {n} of the body") from exc
            if not got:
                if until_close:
                    break
                raise BadAnswer(f"answer from {self.where} cut at {have} of {n} bytes")
            have += got
        view.release()
        del out[have:]
        return bytes(out)

    def _recv(self, what: str) -> bytes:
        assert self.sock is not None
        self._arm()
        try:
            return self.sock.recv(65536)
        except TimeoutError:
            raise self._timed_out(f"part of {what}") from None

    def _recv_into(self, view: memoryview) -> int:
        assert self.sock is not None
        self._arm()
        try:
            return self.sock.recv_into(view)
        except TimeoutError:
            raise self._timed_out("part of the body") from None

    def _arm(self) -> None:
        """The socket waits at most the timeout, and never past the answer's end time."""
        left = self.ends - time.monotonic()
        if left < self.timeout:
            if left <= 0:
                raise self._timed_out("part of the answer")
            self._wait(left)
        elif self.wait_seconds != self.timeout:
            self._wait(self.timeout)

    def _wait(self, seconds: float) -> None:
        assert self.sock is not None
        self.sock.settimeout(seconds)  # a system call: made only on a change
        self.wait_seconds = seconds

    def _timed_out(self, what: str) -> TimeoutError:
        if time.monotonic() >= self.ends:
            return TimeoutError(
                f"answer from {self.where} not complete within {self.allowed:.2f} s (the "
                f"timeout of {self.timeout:g} s plus a second for each "
                f"{self.min_bytes_per_second:.0f} bytes asked): {what} received so far; the "
                "server sends too slowly")
        return TimeoutError(f"answer from {self.where}: nothing received for "
                            f"{self.timeout:g} s ({what})")


_HEX_DIGITS = re.compile(rb"0*[0-9A-Fa-f]{1,15}")
"""A chunk size: hexadecimal digits (leading zeros allowed), below 2**60."""


_WARNED_HOSTS: set[str] = set()


def _warn_whole_answers(host: str) -> None:
    if host not in _WARNED_HOSTS:
        _WARNED_HOSTS.add(host)
        logger.warning(
            "%s answers ranged GETs with the whole object (HTTP 200): each read receives the "
            "object from its start up to the range (dropping what comes before it); use a "
            "server that honours Range for reads of large objects", host)


_TLS: Any = None


def _tls() -> Any:
    global _TLS
    if _TLS is None:
        import ssl

        _TLS = ssl.create_default_context()
    return _TLS



__all__ = ["DISCARD_BYTES", "MAX_HEADER_BYTES", "BadAnswer", "Stale"]
