"""Ranged GETs of S3 objects by presigned URL over plain keep-alive HTTP connections.

botocore builds, signs and parses every request in Python, and s3fs reads each body
through aiohttp's stream in pieces: about 1 ms of CPU a GET and 1 ms a MiB on the client.
Reading shuffled records from object storage is many small GETs, and that CPU is taken
from the decoder. A GET of a byte range needs none of it: an object's URL is presigned once
(a local computation; again before it expires or when the server refuses it) and each
range is one GET on a kept-alive HTTP/1.1 connection, written and read here with the few
str and socket calls it needs, its body read into one buffer (a tenth of botocore's CPU a
small GET).

:func:`direct_gets_for` gives a :class:`DirectGets` only where a plain GET is all the
filesystem would send: ``s3fs``, no requester-pays, no extra request arguments (e.g.
SSE-C keys), no versioned paths, the default TLS verification and no proxy configured;
otherwise None, and reads stay on s3fs. ``RemoteSource(direct_gets=False)`` turns it off.

Failures keep the storage layer's meanings: 404 is FileNotFoundError, 403 (after one
re-signing) PermissionError, 5xx and 429 an :class:`HttpStatusError` with ``status`` (which
``is_transient`` retries), broken or timed-out connections ConnectionError/TimeoutError.
A range that starts past the end reads as empty (the ByteSource contract).
"""

from __future__ import annotations

import atexit
import errno
import os
import queue
import re
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar
from urllib.parse import urlsplit

from shardfeed.storage.inflight import settle

T = TypeVar("T")

PRESIGN_SECONDS = 3600
"""How long a presigned URL is valid."""
RENEW_AFTER_SECONDS = 3000
"""A URL older than this is signed again before its next GET."""
MAX_THREADS = 64
"""Threads running GETs, for all sources of the process together."""

_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")
_PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy",
                    "all_proxy")


class HttpStatusError(OSError):
    """An HTTP status the storage layer does not map to an OSError subclass; ``status`` is
    read by ``is_transient`` (5xx and 429 are retried)."""

    def __init__(self, status: int, url: str, detail: str) -> None:
        super().__init__(errno.EIO, f"HTTP {status} for {url}: {detail}")
        self.status = status


def direct_gets_for(fs: Any, path: str, *, enabled: bool = True) -> DirectGets | None:
    """Direct GETs for ``path`` of the filesystem ``fs``, or None where they would not send
    what the filesystem sends (see the module's description)."""
    if not enabled or type(fs).__module__.split(".")[0] != "s3fs":
        return None
    if getattr(fs, "version_aware", False) or getattr(fs, "req_kw", None):
        return None
    if getattr(fs, "s3_additional_kwargs", None):
        return None
    client = dict(getattr(fs, "client_kwargs", None) or {})
    config = dict(getattr(fs, "config_kwargs", None) or {})
    if client.get("verify", True) is not True or config.get("proxies"):
        return None
    if any(os.environ.get(name) for name in _PROXY_VARIABLES):
        return None
    timeout = float(config.get("read_timeout") or 15.0)
    connect = float(config.get("connect_timeout") or 5.0)
    return DirectGets(fs, path, timeout_seconds=max(timeout, connect))


class DirectGets:
    """Ranged GETs of one object (see the module's description). Thread-safe."""

    def __init__(self, fs: Any, path: str, *, timeout_seconds: float) -> None:
        self._fs = fs
        self._path = path
        self.timeout_seconds = timeout_seconds
        self._lock = threading.Lock()
        self._signed: tuple[float, str, str, str] | None = None  # time, scheme, host, target

    def start(self, start: int, end: int) -> Future[bytes]:
        """One attempt at bytes ``[start, end)``, running on a shared worker thread."""
        return _WORKERS.submit(lambda: self.get(start, end))

    def get(self, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` (fewer at the end of the object; none past it)."""
        renewed = False
        while True:
            scheme, host, target = self._url(renew=renewed)
            status, headers, body = _request(scheme, host, target, start, end,
                                             self.timeout_seconds)
            if status == 403 and not renewed:
                renewed = True  # expired, or the clock moved: sign again, once
                continue
            return _body_of(status, headers, body, start, end, self._path)

    def _url(self, *, renew: bool) -> tuple[str, str, str]:
        with self._lock:
            signed = self._signed
            if renew or signed is None or time.monotonic() - signed[0] > RENEW_AFTER_SECONDS:
                url = urlsplit(str(self._fs.url(self._path, expires=PRESIGN_SECONDS)))
                target = url.path + (f"?{url.query}" if url.query else "")
                signed = (time.monotonic(), url.scheme, url.netloc, target)
                self._signed = signed
            return signed[1], signed[2], signed[3]


def _body_of(status: int, headers: dict[str, str], body: bytes, start: int,
             end: int, path: str) -> bytes:
    if status == 206:
        match = _CONTENT_RANGE.match(headers.get("content-range", ""))
        if match is None or int(match.group(1)) != start:
            raise HttpStatusError(502, path, f"answer to bytes {start}..{end} has "
                                  f"Content-Range {headers.get('content-range')!r}")
        return body[: end - start]
    if status == 200:  # the whole object: a server that ignores Range
        return body[start:end]
    if status == 416:
        return b""
    detail = _error_code(body)
    if status == 404:
        raise FileNotFoundError(errno.ENOENT, f"{detail} (HTTP 404)", path)
    if status == 403:
        raise PermissionError(errno.EACCES, f"{detail} (HTTP 403)", path)
    raise HttpStatusError(status, path, detail)


def _error_code(body: bytes) -> str:
    text = body[:2048].decode("utf-8", "replace")
    code = re.search(r"<Code>([^<]*)</Code>", text)
    message = re.search(r"<Message>([^<]*)</Message>", text)
    found = ": ".join(m.group(1) for m in (code, message) if m)
    return found or "no error code in the answer"


# -- connections -------------------------------------------------------------------------------
#
# A GET of a range is a few lines of HTTP/1.1 each way; http.client parses every answer's
# headers with the email package and builds objects around its socket (about 150 us of CPU a
# request here, three times what the exchange itself takes). Connections here send one
# prebuilt request and read the answer's status line and headers with str methods, its body
# into one buffer by recv_into.

MAX_HEADER_BYTES = 64 << 10
"""An answer whose headers run longer than this is refused as garbled."""
MAX_ERROR_BODY = 64 << 10
"""Bytes of an error answer's body read (for its code); the connection is closed after more."""


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
        out = bytearray(n)
        have = min(n, len(self.buffer))
        out[:have] = self.buffer[:have]
        del self.buffer[:have]
        view = memoryview(out)
        assert self.sock is not None
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


def _request(scheme: str, host: str, target: str, start: int, end: int,
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
        if len(idle) < MAX_THREADS:
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


# -- worker threads ----------------------------------------------------------------------------


class _Workers:
    """Daemon threads (started as needed, up to MAX_THREADS) running submitted calls:
    daemon, because a GET to a server that stalls must not hold the interpreter's exit."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._queue: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]]] = \
            queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._idle = 0

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        future: Future[T] = Future()
        self._queue.put((future, fn))
        with self._lock:
            if self._idle == 0 and self._threads < self._limit:
                self._threads += 1
                threading.Thread(target=self._run, name="shardfeed-get", daemon=True).start()
        return future

    def _run(self) -> None:
        while True:
            with self._lock:
                self._idle += 1
            future, fn = self._queue.get()
            with self._lock:
                self._idle -= 1
            if future.set_running_or_notify_cancel():
                settle(future, fn)


_WORKERS = _Workers(MAX_THREADS)


def _reset_after_fork() -> None:
    global _WORKERS, _POOL_LOCK
    _WORKERS = _Workers(MAX_THREADS)  # the parent's threads do not exist in the child
    _POOL_LOCK = threading.Lock()
    _POOL.clear()  # nor may the child share the parent's sockets


os.register_at_fork(after_in_child=_reset_after_fork)

__all__ = ["DirectGets", "HttpStatusError", "direct_gets_for"]
