"""An HTTP/1.1 server on 127.0.0.1 that answers each object as a plan says: the fuzz target
of test_fuzz_server_answers.py.

An object lives at ``/<bucket>/obj`` (``s3://<bucket>/obj`` path-style, or the same path
over plain HTTP); its :class:`Case` says how big it is, which kind of request gets the
hostile answer (``"range"``: a GET of ``bytes=a-b``; ``"head"``; ``"whole"``: a GET without
a range or with an open one, ``bytes=0-``) and what that answer is (:class:`Answer`). Every
other request is answered as a good server answers it, and so is ``/<bucket>/obj-moved``,
where a redirect to the same server points. A server made with ``honest=True`` answers every
path well: the other origin a redirect points at, which records the headers it was sent.

Bytes are slices of one random buffer (an object ``[0, size)`` of a case starts at its own
``base`` in it): bodies up to 64 MiB cost no memory here. One thread serves every connection
(:class:`poll_sockets.PollServer`), as in tests/storage/hostile_server.py.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

from poll_sockets import Connection, PollServer

_PERIOD = 1_000_003  # not a power of two: an offset error shows in the bytes read
_BLOCK = random.Random(20240611).randbytes(_PERIOD)
_TWICE = memoryview(_BLOCK + _BLOCK)  # any window up to _PERIOD bytes is one slice of it
HUGE_BYTES = 64 << 20
"""The longest body sent (a server that ignores a 64 KiB range of a 64 MiB object)."""
CLOSE = b""
"""A piece that closes the connection."""

Kind = Literal["range", "head", "whole"]
Length = Literal["right", "short", "long", "garbage", "missing", "huge"]
ContentRange = Literal["right", "short", "shifted", "garbage", "missing", "total"]
Body = Literal["right", "cut", "extra", "whole", "huge", "none", "cut_headers"]
Location = Literal["", "same", "other", "relative", "missing", "refused"]


def pattern(base: int, start: int, end: int) -> bytes:
    """Bytes ``[start, end)`` of the object that starts at ``base`` in the buffer."""
    return b"".join(bytes(piece) for piece in _pieces(base, start, end, _PERIOD))


def _pieces(base: int, start: int, end: int, piece_bytes: int) -> Iterator[memoryview]:
    while start < end:
        at = (base + start) % _PERIOD
        take = min(end - start, piece_bytes, _PERIOD)
        yield _TWICE[at : at + take]
        start += take


@dataclass(frozen=True, slots=True, kw_only=True)
class Answer:
    """One hostile answer. ``status`` 0: what a good server says (206 to a range, else
    200). ``length``: the Content-Length against the body sent (short, long, garbage text
    ``garbage``, missing, 64 MiB). ``content_range`` (a 206): short of the range, shifted by
    a byte, garbage, missing, a wrong total. ``body``: cut half-way then closed, longer than
    its length, the whole object (Range ignored), 64 MiB, none, or the connection closed in
    the middle of the headers. ``chunk_line``: chunked encoding whose first size line is this
    (``b"ok"``: right chunks, ``b"cut"``: right chunks, closed before the last).
    ``pause_seconds`` between pieces of ``piece_bytes`` (a trickle). ``location``: a redirect
    (status 301/302/307/308) to the same origin, the other one, a relative path, none, or
    a closed port."""

    status: int = 0
    length: Length = "right"
    garbage: str = "x"
    content_range: ContentRange = "right"
    body: Body = "right"
    chunk_line: bytes = b""
    pause_seconds: float = 0.0
    piece_bytes: int = 256 << 10
    location: Location = ""

    def describe(self) -> str:
        """The fields that differ from a good answer, as ``name=value`` words."""
        good = Answer()
        words = [f"{name}={getattr(self, name)!r}" for name in Answer.__slots__
                 if getattr(self, name) != getattr(good, name)
                 and not (name == "garbage" and self.length != "garbage"
                          and self.content_range != "garbage")
                 and not (name == "piece_bytes" and not self.pause_seconds)]
        return " ".join(words) or "good"


@dataclass(frozen=True, slots=True, kw_only=True)
class Case:
    """An object (``size`` bytes starting at ``base`` of the buffer) and the answer its
    requests of ``kind`` get."""

    name: str
    kind: Kind
    size: int
    base: int
    answer: Answer
    offset: int = 0
    length: int = 0
    deadline_seconds: float = 3.0

    def data(self, start: int, end: int) -> bytes:
        return pattern(self.base, start, min(end, self.size))


@dataclass(slots=True)
class Request:
    """What one request asked (as received: ``headers`` lower-cased)."""

    method: str
    path: str
    headers: dict[str, str] = field(default_factory=dict)


MAX_CONNECTION_SECONDS = 8.0
"""A connection held longer is closed (a client that stopped reading a huge body)."""


class AnswerServer(PollServer):
    """Listens on ``host:port`` (another host than 127.0.0.1 is another origin: all of
    127/8 is this machine); ``cases`` by bucket name; ``requests`` every request received,
    in order."""

    max_connection_seconds = MAX_CONNECTION_SECONDS

    def __init__(self, *, honest: bool = False, lifetime_seconds: float = 600.0,
                 host: str = "127.0.0.1") -> None:
        super().__init__(host=host, lifetime_seconds=lifetime_seconds,
                         thread_name="answer-server")
        self.honest = honest
        self.other_url = ""  # where a redirect to another origin points
        self.cases: dict[str, Case] = {}
        self.requests: list[Request] = []
        self.start()

    # -- answers ----------------------------------------------------------------------------

    def _answer(self, request: Request) -> Iterator[tuple[float, bytes | memoryview]]:
        parts = request.path.split("?", 1)[0].strip("/").split("/")
        case = self.cases.get(parts[0])
        if case is None:
            yield from _status(404, head=request.method == "HEAD")
            return
        if len(parts) == 1:  # the bucket (a region question): no region named
            yield 0.0, b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
            return
        rng = request.headers.get("range", "")
        closed = re.fullmatch(r"bytes=(\d+)-(\d+)", rng)
        kind: Kind = ("head" if request.method == "HEAD" else
                      "range" if closed and not (int(closed.group(1)) == 0
                                                 and int(closed.group(2)) + 1 >= case.size)
                      else "whole")
        start, end = 0, case.size
        if closed:
            start, end = int(closed.group(1)), min(int(closed.group(2)) + 1, case.size)
        hostile = not self.honest and parts[-1] == "obj" and kind == case.kind
        if kind == "head":
            yield from _head(case, case.answer if hostile else Answer(), self._location(request))
            return
        yield from _get(case, case.answer if hostile else Answer(), kind, start, end,
                        self._location(request))

    def _location(self, request: Request) -> dict[Location, str]:
        path = request.path.split("?", 1)[0]
        return {"same": f"{self.endpoint_url}{path}-moved", "other": f"{self.other_url}{path}",
                "relative": f"{path}-moved", "refused": f"http://127.0.0.1:1{path}"}

    # -- what the loop asks ----------------------------------------------------------------

    def received(self, conn: Connection) -> None:
        if conn.pieces is not None or b"\r\n\r\n" not in conn.request:
            return
        head, _, rest = bytes(conn.request).partition(b"\r\n\r\n")
        conn.request = bytearray(rest)
        lines = head.decode("latin-1").split("\r\n")
        method, path = (lines[0].split(" ") + ["", ""])[:2]
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        request = Request(method, path, headers)
        self.requests.append(request)
        self.answer(conn, self._answer(request))

    def answered(self, conn: Connection) -> None:
        self.received(conn)  # the next request on this connection


_REASONS = {200: "OK", 206: "Partial Content", 301: "Moved Permanently", 302: "Found",
            307: "Temporary Redirect", 308: "Permanent Redirect", 400: "Bad Request",
            403: "Forbidden", 404: "Not Found", 412: "Precondition Failed",
            416: "Range Not Satisfiable", 429: "Too Many Requests",
            500: "Internal Server Error", 503: "Service Unavailable"}


def _line(status: int) -> str:
    return f"HTTP/1.1 {status} {_REASONS.get(status, 'Whatever')}\r\n"


def _status(status: int, *, head: bool) -> Iterator[tuple[float, bytes]]:
    body = b"" if head else f"<Error><Code>{status}</Code></Error>".encode()
    yield 0.0, (_line(status) + f"Content-Length: {len(body)}\r\n\r\n").encode() + body


_VERSION = 'ETag: "fuzz"\r\nLast-Modified: Tue, 11 Jun 2024 10:00:00 GMT\r\n'


def _redirect(answer: Answer, locations: dict[Location, str]) -> Iterator[tuple[float, bytes]]:
    status = answer.status if 300 <= answer.status < 400 else 302
    where = locations.get(answer.location)
    text = _line(status) + (f"Location: {where}\r\n" if where else "")
    yield 0.0, (text + "Content-Length: 0\r\n\r\n").encode()


def _head(case: Case, answer: Answer, locations: dict[Location, str]
          ) -> Iterator[tuple[float, bytes]]:
    if answer.location:
        yield from _redirect(answer, locations)
        return
    if answer.status >= 300:
        yield from _status(answer.status, head=True)
        return
    text = _line(answer.status or 200) + _VERSION
    length = {"garbage": answer.garbage, "missing": None}.get(answer.length, str(case.size))
    if length is not None:
        text += f"Content-Length: {length}\r\n"
    text += "\r\n"
    if answer.body == "cut_headers":
        yield 0.0, text[: len(text) // 2].encode()
        yield 0.0, CLOSE
        return
    if answer.pause_seconds:  # the headers trickle
        for k in range(0, len(text), 8):
            yield answer.pause_seconds, text[k : k + 8].encode()
    else:
        yield 0.0, text.encode()
    if answer.length == "missing":
        yield 0.0, CLOSE


def _get(case: Case, answer: Answer, kind: Kind, start: int, end: int,
         locations: dict[Location, str]) -> Iterator[tuple[float, bytes | memoryview]]:
    if answer.location:
        yield from _redirect(answer, locations)
        return
    if answer.status >= 300:
        yield from _status(answer.status, head=False)
        if answer.length != "right":
            yield 0.0, CLOSE
        return
    # the span the headers name, and the bytes sent
    if answer.body == "whole":
        start, end = 0, case.size
    status = answer.status or (206 if kind == "range" and answer.body != "whole" else 200)
    span = end - start
    send_end = {"cut": start + span // 2, "extra": end + (1 << 20), "huge": start + HUGE_BYTES,
                "none": start}.get(answer.body, end)
    text = _line(status) + _VERSION
    if status == 206:
        text += _content_range(answer, start, end, case.size)
    close = answer.body in ("cut", "extra", "huge", "none", "cut_headers")
    if answer.chunk_line:
        text += "Transfer-Encoding: chunked\r\n\r\n"
        yield 0.0, text.encode()
        yield from _chunks(case, answer, start, end)
        return
    length = {"right": str(span), "short": str(span // 2), "long": str(span * 2 + 7),
              "garbage": answer.garbage, "missing": None, "huge": str(HUGE_BYTES)
              }[answer.length]
    if answer.body == "huge" and answer.length == "right":
        length = str(send_end - start)
    if length is not None:
        text += f"Content-Length: {length}\r\n"
    text += "\r\n"
    if answer.body == "cut_headers":
        yield 0.0, text[: len(text) // 2].encode()
        yield 0.0, CLOSE
        return
    yield 0.0, text.encode()
    piece = answer.piece_bytes if answer.pause_seconds else 256 << 10
    for data in _pieces(case.base, start, send_end, piece):
        yield answer.pause_seconds, data
    if close or answer.length != "right":
        yield 0.0, CLOSE


def _content_range(answer: Answer, start: int, end: int, size: int) -> str:
    value = {"right": f"bytes {start}-{end - 1}/{size}",
             "short": f"bytes {start}-{start + (end - start) // 2 - 1}/{size}",
             "shifted": f"bytes {start + 1}-{end}/{size}",
             "garbage": answer.garbage,
             "missing": None,
             "total": f"bytes {start}-{end - 1}/{size + 12345}"}[answer.content_range]
    return "" if value is None else f"Content-Range: {value}\r\n"


def _chunks(case: Case, answer: Answer, start: int, end: int
            ) -> Iterator[tuple[float, bytes | memoryview]]:
    data = case.data(start, end)
    if answer.chunk_line in (b"ok", b"cut"):
        step = max(1, len(data) // 3)
        for k in range(0, len(data), step):
            part = data[k : k + step]
            yield answer.pause_seconds, f"{len(part):x}\r\n".encode() + part + b"\r\n"
        if answer.chunk_line == b"cut":
            yield 0.0, CLOSE
            return
        yield 0.0, b"0\r\n\r\n"
        return
    yield 0.0, answer.chunk_line + b"\r\n" + data + b"\r\n0\r\n\r\n"
    yield 0.0, CLOSE
