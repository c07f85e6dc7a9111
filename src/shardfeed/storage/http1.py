"""Ranged GETs over kept-alive HTTP/1.1 connections, written and read here.

A GET of a range is a few lines of HTTP/1.1 each way; http.client parses every answer's
headers with the email package and builds objects around its socket (about 150 us of CPU a
request here, three times what the exchange itself takes). A connection here sends one
prebuilt request and reads the answer's status line and headers with str methods, its body
into the bytes object it is handed back as (the compiled ``_recv``, where built, for
plain-HTTP connections; else ``recv_into`` a buffer and one copy). Answers that are not HTTP/1.x as expected (cut,
garbled, headers or a body longer than allowed) raise :class:`BadAnswer`, a transient
ConnectionError naming the host. Idle connections are pooled by ``(scheme, host)``, closed
at exit, and never shared with a forked child.
"""

from __future__ import annotations

import atexit
import importlib
import os
import socket
import threading
from typing import Any
from urllib.parse import urlsplit

MAX_IDLE = 64
"""Idle connections kept for one ``(scheme, host)``."""

MAX_HEADER_BYTES = 64 << 10
"""An answer whose headers run longer than this is refused as garbled."""
MAX_ERROR_BODY = 64 << 10
"""Bytes of an error answer's body read (for its code); the connection is closed after more."""


def _compiled_recv() -> Any:
    """``shardfeed.storage._recv`` (source: ``_recv.c`` beside this file), or None where
    the package was built without it: ``_Conn._exactly`` then reads by ``recv_into``."""
    try:
        return importlib.import_module("shardfeed.storage._recv")
    except ImportError:
        return None


_recv = _compiled_recv()


class BadAnswer(ConnectionError):
    """An answer that is not HTTP/1.1 as expected (cut, garbled, too long): transient."""


class _Stale(ConnectionError):
    """A kept-alive connection the server had closed before the request (nothing answered)."""


class _Conn:
    """One HTTP/1.1 connection to ``scheme://host``."""

    def __init__(self, scheme: str, host: str, timeout: float) -> None:
        self.scheme, self.host, self.timeout = scheme, host, timeout
        self.sock: socket.socket | None = None
        self.buffer = bytearray()  # bytes received past the answer being read (none, normally)

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

    def get(self, target: str, start: int, end: int, *,
            reused: bool) -> tuple[int, dict[str, str], bytes, bool]:
        """GET ``Range: bytes=start..end-1``: the status, the headers (lower-case names),
        the body (at most ``end`` bytes of a whole-object answer) and whether the
        connection can be used again."""
        assert self.sock is not None
        request = (f"GET {target} HTTP/1.1\r\nHost: {self.host}\r\n"
                   f"Range: bytes={start}-{end - 1}\r\nAccept-Encoding: identity\r\n"
                   "User-Agent: shardfeed\r\n\r\n")
        try:
            self.sock.sendall(request.encode("ascii"))
        except (BrokenPipeError, ConnectionResetError) as exc:
            if reused:
                raise _Stale(str(exc)) from exc
            raise
        status, headers = self._head(reused=reused)
        keep = headers.get("connection", "").lower() != "close"
        if status == 206:
            body, keep = self._body(headers, limit=end - start, keep=keep, over="refuse")
        elif status == 200:  # the whole object (the server ignored Range): up to ``end``
            body, keep = self._body(headers, limit=end, keep=keep, over="stop")
        else:
            body, keep = self._body(headers, limit=MAX_ERROR_BODY, keep=keep, over="stop")
        return status, headers, body, keep

    def _head(self, *, reused: bool) -> tuple[int, dict[str, str]]:
        """The status and headers of the next answer (1xx answers skipped)."""
        while True:
            buf = self.buffer
            while (end := buf.find(b"\r\n\r\n", 0, MAX_HEADER_BYTES + 4)) < 0:
                if len(buf) > MAX_HEADER_BYTES:
                    raise BadAnswer(f"answer from {self.host} has over "
                                    f"{MAX_HEADER_BYTES} bytes of headers")
                try:
                    chunk = self._recv()
                except ConnectionResetError as exc:
                    if reused and not buf:
                        raise _Stale(str(exc)) from exc
                    raise
                if not chunk:
                    if reused and not buf:
                        raise _Stale("closed before answering")
                    raise BadAnswer(f"answer from {self.host} cut in its headers")
                buf += chunk
            lines = buf[:end].decode("latin-1").split("\r\n")
            del buf[: end + 4]
            version, _, rest = lines[0].partition(" ")
            code = rest[:3]
            if not version.startswith("HTTP/1.") or not code.isdigit():
                raise BadAnswer(f"answer from {self.host} is not HTTP/1.x: {lines[0][:80]!r}")
            headers: dict[str, str] = {}
            for line in lines[1:]:
                name, colon, value = line.partition(":")
                if not colon:
                    raise BadAnswer(f"answer from {self.host} has a garbled header "
                                    f"{line[:80]!r}")
                headers[name.strip().lower()] = value.strip()
            if version == "HTTP/1.0" and headers.get("connection", "").lower() != "keep-alive":
                headers["connection"] = "close"
            if not code.startswith("1"):
                return int(code), headers

    def _body(self, headers: dict[str, str], *, limit: int, keep: bool,
              over: str) -> tuple[bytes, bool]:
        if headers.get("transfer-encoding", "identity").lower() != "identity":
            return self._chunked(limit, keep, over)
        length = headers.get("content-length")
        if length is None:  # the body runs to the end of the connection
            return self._exactly(limit, until_close=True), False
        if not length.isdigit():
            raise BadAnswer(f"answer from {self.host} has Content-Length {length!r}")
        n = int(length)
        if n > limit:
            if over == "refuse":
                raise BadAnswer(f"answer from {self.host} is {n} bytes for a range of {limit}")
            return self._exactly(limit), False  # the rest is never read: close
        return self._exactly(n), keep

    def _chunked(self, limit: int, keep: bool, over: str) -> tuple[bytes, bool]:
        parts = bytearray()
        while True:
            line = self._line()
            size_text = line.split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise BadAnswer(f"answer from {self.host} has a garbled chunk size "
                                f"{size_text[:20]!r}") from None
            if size == 0:
                while self._line():  # trailers, up to the empty line
                    pass
                return bytes(parts), keep
            if len(parts) + size > limit:
                if over == "refuse":
                    raise BadAnswer(f"answer from {self.host} is over {limit} bytes "
                                    "for its range")
                parts += self._exactly(limit - len(parts))
                return bytes(parts), False
            parts += self._exactly(size)
            if self._line():
                raise BadAnswer(f"answer from {self.host} has a chunk longer than it said")

    def _line(self) -> bytes:
        buf = self.buffer
        while (end := buf.find(b"\r\n")) < 0:
            if len(buf) > MAX_HEADER_BYTES:
                raise BadAnswer(f"answer from {self.host} has a line over "
                                f"{MAX_HEADER_BYTES} bytes")
            chunk = self._recv()
            if not chunk:
                raise BadAnswer(f"answer from {self.host} cut in its body")
            buf += chunk
        line = bytes(buf[:end])
        del buf[: end + 2]
        return line

    def _exactly(self, n: int, *, until_close: bool = False) -> bytes:
        """The next ``n`` bytes (``until_close``: at most ``n``, up to the end of the
        connection)."""
        assert self.sock is not None
        if _recv is not None and self.scheme == "http":
            have = min(n, len(self.buffer))
            prefix = bytes(self.buffer[:have])
            del self.buffer[:have]
            timeout = self.sock.gettimeout()
            body: bytes = _recv.exact(self.sock.fileno(), n, prefix,
                                      -1.0 if timeout is None else timeout)
            if len(body) < n and not until_close:
                raise BadAnswer(f"answer from {self.host} cut at {len(body)} of {n} bytes")
            return body
        out = bytearray(n)
        have = min(n, len(self.buffer))
        out[:have] = self.buffer[:have]
        del self.buffer[:have]
        view = memoryview(out)
        while have < n:
            got = self.sock.recv_into(view[have:])
            if not got:
                if until_close:
                    break
                raise BadAnswer(f"answer from {self.host} cut at {have} of {n} bytes")
            have += got
        view.release()
        del out[have:]
        return bytes(out)

    def _recv(self) -> bytes:
        assert self.sock is not None
        return self.sock.recv(65536)


_POOL: dict[tuple[str, str], list[_Conn]] = {}
_POOL_LOCK = threading.Lock()


def range_get(scheme: str, host: str, target: str, start: int, end: int,
             timeout: float) -> tuple[int, dict[str, str], bytes]:
    """One GET of ``Range: bytes=start..end-1``; a kept-alive connection the server closed
    meanwhile is replaced once."""
    while True:
        conn = _idle(scheme, host)
        reused = conn is not None
        if conn is None:
            conn = _Conn(scheme, host, timeout)
            conn.open()
        try:
            status, headers, body, keep = conn.get(target, start, end, reused=reused)
        except _Stale:
            conn.close()
            continue  # only a pooled connection is stale: at most one pass for each
        except BaseException:
            conn.close()
            raise
        if keep and not conn.buffer:
            _give_back(conn)
        else:
            conn.close()
        return status, headers, body


def _idle(scheme: str, host: str) -> _Conn | None:
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


def _give_back(conn: _Conn) -> None:
    with _POOL_LOCK:
        idle = _POOL.setdefault((conn.scheme, conn.host), [])
        if len(idle) < MAX_IDLE:
            idle.append(conn)
            return
    conn.close()


_TLS: Any = None


def _tls() -> Any:
    global _TLS
    if _TLS is None:
        import ssl

        _TLS = ssl.create_default_context()
    return _TLS


def _reset_after_fork() -> None:
    global _POOL_LOCK
    _POOL_LOCK = threading.Lock()
    _POOL.clear()  # the child may not share the parent's sockets


os.register_at_fork(after_in_child=_reset_after_fork)

__all__ = ["MAX_HEADER_BYTES", "MAX_IDLE", "BadAnswer", "range_get"]
