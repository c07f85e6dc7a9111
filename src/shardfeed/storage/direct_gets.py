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
A range that starts past the end reads as empty (the ByteSource contract). A ``206`` with
fewer bytes than asked (where the object has them) is a :class:`ShortAnswer`, retried like a
dropped connection: a short answer is never handed back as the object's bytes.

Each attempt is bounded (see :mod:`shardfeed.storage.http1`): memory by its range, time by
the timeout plus a second a MiB asked; an attempt its caller abandons (the call's deadline,
``close()``, Ctrl-C cancel its future) has its connection shut down at once, so a server
that trickles never holds the threads GETs run on.
"""

from __future__ import annotations

import errno
import os
import re
import threading
import time
from concurrent.futures import Future
from typing import Any, TypeVar
from urllib.parse import urlsplit

from shardfeed.storage.daemon_threads import DaemonThreads
from shardfeed.storage.http1_pool import Abort, range_get

T = TypeVar("T")

PRESIGN_SECONDS = 3600
"""How long a presigned URL is valid."""
RENEW_AFTER_SECONDS = 3000
"""A URL older than this is signed again before its next GET."""
MAX_THREADS = 64
"""Threads running GETs, for all sources of the process together."""
MIN_BYTES_PER_SECOND = 1 << 20
"""An attempt must be complete within its timeout plus a second for each this many bytes
asked (the rate ``storage.calls`` allows a write): a body that trickles in fails in time."""

_CONTENT_RANGE = re.compile(r"bytes (\d{1,18})-(\d{1,18})/(\d{1,18}|\*)", re.ASCII)
_PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy",
                    "all_proxy")


class HttpStatusError(OSError):
    """An HTTP status the storage layer does not map to an OSError subclass; ``status`` is
    read by ``is_transient`` (5xx and 429 are retried)."""

    def __init__(self, status: int, url: str, detail: str) -> None:
        super().__init__(errno.EIO, f"HTTP {status} for {url}: {detail}")
        self.status = status


class ShortAnswer(ConnectionError):
    """A ``206`` with fewer bytes than asked where the object has them: the server's answer
    is short, not the object (transient: retried)."""

    advice = ("the server (or a proxy before it) answered with fewer bytes than asked; the "
              "object itself may be whole: check the server")


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
        """One attempt at bytes ``[start, end)``, running on a shared worker thread;
        cancelling its future ends it at once (its connection is shut down)."""
        attempt = _Attempt()
        return _WORKERS.submit(lambda: self.get(start, end, abort=attempt.abort),
                               future=attempt)

    def get(self, start: int, end: int, *, abort: Abort | None = None) -> bytes:
        """Bytes ``[start, end)`` (fewer at the end of the object; none past it).
        ``abort``: ends the attempt from another thread."""
        renewed = False
        while True:
            scheme, host, target = self._url(renew=renewed)
            status, headers, body = range_get(
                scheme, host, target, start, end, self.timeout_seconds,
                min_bytes_per_second=MIN_BYTES_PER_SECOND, abort=abort)
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


class _Attempt(Future[bytes]):
    """The future of one attempt: cancelling it (the caller abandoned the attempt) also
    aborts its GET, which a plain Future's ``cancel`` cannot do once the GET is running."""

    def __init__(self) -> None:
        super().__init__()
        self.abort = Abort()

    def cancel(self) -> bool:
        self.abort.abort()
        return super().cancel()


def _body_of(status: int, headers: dict[str, str], body: bytes, start: int,
             end: int, path: str) -> bytes:
    if status == 206:
        return _ranged_body(headers, body, start, end, path)
    if status == 200:  # the whole object (a server that ignores Range): read to the range
        return body
    if status == 416:
        return b""
    detail = _error_code(body)
    if status == 404:
        raise FileNotFoundError(errno.ENOENT, f"{detail} (HTTP 404)", path)
    if status == 403:
        raise PermissionError(errno.EACCES, f"{detail} (HTTP 403)", path)
    raise HttpStatusError(status, path, detail)


def _ranged_body(headers: dict[str, str], body: bytes, start: int, end: int,
                 path: str) -> bytes:
    """The body of a ``206`` for bytes ``[start, end)``, checked against its Content-Range:
    the bytes asked (up to the object's end), no fewer, no others."""
    content_range = headers.get("content-range", "")
    stop = start + len(body)
    expected = f"bytes {start}-{stop - 1}/"  # what a whole answer says (the common case)
    if content_range.startswith(expected):
        total = content_range[len(expected):]
        if total == "*" and stop == end:
            return body
        if total.isascii() and total.isdigit() and stop == min(end, int(total)):
            return body
    match = _CONTENT_RANGE.fullmatch(content_range)
    first, last, total = match.groups() if match is not None else ("-1", "-1", "*")
    stop = int(last) + 1
    if int(first) != start or stop <= start:
        raise HttpStatusError(502, path, f"answer to bytes {start}..{end} has "
                              f"Content-Range {content_range[:80]!r}")
    wanted = end if total == "*" else min(end, int(total))
    if stop > wanted or len(body) > stop - start:
        raise HttpStatusError(502, path, f"answer to bytes {start}..{end} has "
                              f"Content-Range {content_range[:80]!r} and {len(body)} bytes")
    if len(body) < stop - start:
        raise ShortAnswer(f"short answer from the server: {len(body)} bytes for bytes "
                          f"{start}..{stop} of {path} (its Content-Range), {start}..{wanted} "
                          "asked")
    if stop < wanted:
        raise ShortAnswer(f"short answer from the server: bytes {start}..{stop} of {path} "
                          f"for the bytes {start}..{wanted} asked")
    return body


def _error_code(body: bytes) -> str:
    text = body[:2048].decode("utf-8", "replace")
    code = re.search(r"<Code>([^<]*)</Code>", text)
    message = re.search(r"<Message>([^<]*)</Message>", text)
    found = ": ".join(m.group(1) for m in (code, message) if m)
    return found or "no error code in the answer"


_WORKERS = DaemonThreads("shardfeed-get", MAX_THREADS)
"""The threads GETs run on (kept: see :mod:`shardfeed.storage.daemon_threads`)."""

__all__ = ["MIN_BYTES_PER_SECOND", "DirectGets", "HttpStatusError", "ShortAnswer",
           "direct_gets_for"]
