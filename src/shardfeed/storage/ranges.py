"""Byte ranges: merging neighbouring ranges into few requests, checking asked ranges, and
judging the answer to one (the one rule of every store: :func:`checked_answer`).

The plan is pure arithmetic: it depends on the ranges and the two limits only.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

DEFAULT_COALESCE_GAP_BYTES = 256 * 1024
DEFAULT_MAX_REQUEST_BYTES = 32 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class RangeRequest:
    """One request ``[start, end)`` that serves the asked ranges at positions ``members``."""

    start: int
    end: int
    members: tuple[int, ...]


def coalesce_ranges(
    ranges: Sequence[tuple[int, int]], *, gap_bytes: int, max_request_bytes: int
) -> list[RangeRequest]:
    """Group ``(offset, length)`` ranges into few requests.

    Ranges are taken in offset order; a range joins the current request when the hole
    between them is at most ``gap_bytes`` (overlaps count as no hole) and the request would
    stay within ``max_request_bytes``; a single range longer than that is one request alone.
    Zero-length ranges need no bytes and belong to no request. Every other asked range is a
    member of exactly one request that covers it.
    """
    order = sorted(
        (i for i in range(len(ranges)) if ranges[i][1] > 0), key=lambda i: ranges[i][0]
    )
    requests: list[RangeRequest] = []
    start = end = 0
    members: list[int] = []
    for i in order:
        offset, length = ranges[i]
        stop = offset + length
        if members and offset - end <= gap_bytes and max(end, stop) - start <= max_request_bytes:
            end = max(end, stop)
            members.append(i)
            continue
        if members:
            requests.append(RangeRequest(start, end, tuple(members)))
        start, end, members = offset, stop, [i]
    if members:
        requests.append(RangeRequest(start, end, tuple(members)))
    return requests


def split_answers(ranges: Sequence[tuple[int, int]], plan: Sequence[RangeRequest],
                  answers: Sequence[bytes | memoryview]) -> list[bytes]:
    """The bytes of each asked range, cut from the answers to the requests of ``plan``
    (one answer a request, in plan order; ``bytes`` or any buffer); a zero-length range is
    ``b""``. A range that is a whole ``bytes`` answer is that object, not a copy."""
    out: list[bytes] = [b""] * len(ranges)
    for request, answer in zip(plan, answers):
        view = answer if isinstance(answer, bytes) else memoryview(answer)
        for i in request.members:
            offset, length = ranges[i]
            lo = offset - request.start
            out[i] = bytes(view[lo : lo + length])
    return out


# A range that starts at or past the end is an error for S3 (HTTP 416, EINVAL from s3fs);
# the ByteSource contract says: an empty read. The answer is checked against the range
# asked: a short answer where the object has the bytes is the server's (retried), and a
# whole object answered for a range (a server that ignores Range) gives the range cut from
# it; any other length is an error, never bytes handed back.


class ShortAnswer(ConnectionError):
    """Fewer bytes than asked where the object has them: the server's answer is short, not
    the object (transient: retried)."""

    advice = ("the server (or a proxy before it) answered with fewer bytes than asked; the "
              "object itself may be whole: check the server")


class RangeIgnored(Exception):
    """The server answered a ranged GET with the whole object: not retried (it would answer
    the same), and not read (it could be far larger than the range). The rule of every
    store: memory follows the ranges asked."""

    advice = ("the server ignores Range requests; serve the shards from a store that "
              "honours them (every object store and common web server does)")


class WrongLength(OSError):
    """More bytes than asked, and not the whole object: not retried."""

    advice = "the server's answers do not match the ranges asked: check the server"


def checked_answer(out: bytes, start: int, end: int, size: int | None) -> bytes:
    """``out``, of another length than asked, as the answer to bytes ``[start, end)`` of an
    object of ``size`` bytes (None: the store does not say; a shorter answer is then taken
    as the object's end, as fsspec takes it, and the records' own checks judge it)."""
    if size is not None and len(out) == size:  # the whole object (or bytes 0.. of it)
        return out[start:end]
    if len(out) < end - start:
        if size is None or start + len(out) == size:  # the object ends inside the range
            return out
        raise ShortAnswer(f"{len(out)} bytes answered for bytes {start}..{end} of an object of "
                          f"{size} bytes")
    raise WrongLength(f"{len(out)} bytes answered for bytes {start}..{end} of an object of "
                      f"{'unknown' if size is None else size} bytes")


DEFAULT_READ_LIMIT_BYTES = 1 << 30
"""The most a whole-object read takes unless told otherwise (``storage.files.read_bytes``'s
``max_bytes``): an object answered larger is refused before its body is read."""
_READ_LIMIT: contextvars.ContextVar[int] = contextvars.ContextVar(
    "shardfeed_read_limit", default=DEFAULT_READ_LIMIT_BYTES)


@contextlib.contextmanager
def read_limit(max_bytes: int, /) -> Iterator[None]:
    """Whole-object reads inside the block (a backend's ``read_bytes`` included) refuse an
    object larger than ``max_bytes``, before reading its body where the store says its size."""
    token = _READ_LIMIT.set(int(max_bytes))
    try:
        yield
    finally:
        _READ_LIMIT.reset(token)


def current_read_limit() -> int:
    """The ``max_bytes`` of the innermost :func:`read_limit` block (else the default)."""
    return _READ_LIMIT.get()


class TooLarge(ValueError):
    """An object larger than the read may take: not retried."""

    advice = ("the object is larger than this read takes: it is not the file expected (or "
              "the server answered with something else); check the URL and the server")


def too_large(size: int, limit: int) -> TooLarge:
    return TooLarge(f"the object is {size:,} bytes, more than the {limit:,} this read takes")


def check_range(offset: int, length: int) -> None:
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ValueError(f"offset must be an int >= 0, got {offset!r}")
    if isinstance(length, bool) or not isinstance(length, int) or length < 0:
        raise ValueError(f"length must be an int >= 0, got {length!r}")


__all__ = [
    "DEFAULT_COALESCE_GAP_BYTES",
    "DEFAULT_MAX_REQUEST_BYTES",
    "DEFAULT_READ_LIMIT_BYTES",
    "RangeIgnored",
    "RangeRequest",
    "ShortAnswer",
    "TooLarge",
    "WrongLength",
    "check_range",
    "checked_answer",
    "coalesce_ranges",
    "current_read_limit",
    "read_limit",
    "split_answers",
    "too_large",
]
