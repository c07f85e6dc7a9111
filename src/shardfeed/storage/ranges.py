"""Byte ranges: merging neighbouring ranges into few requests, and checking asked ranges.

Pure arithmetic: the plan depends on the ranges and the two limits only.
"""

from __future__ import annotations

from collections.abc import Sequence
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


def check_range(offset: int, length: int) -> None:
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ValueError(f"offset must be an int >= 0, got {offset!r}")
    if isinstance(length, bool) or not isinstance(length, int) or length < 0:
        raise ValueError(f"length must be an int >= 0, got {length!r}")


__all__ = [
    "DEFAULT_COALESCE_GAP_BYTES",
    "DEFAULT_MAX_REQUEST_BYTES",
    "RangeRequest",
    "check_range",
    "coalesce_ranges",
    "split_answers",
]
