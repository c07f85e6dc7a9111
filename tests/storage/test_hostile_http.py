"""fsspec's reads (``RemoteSource``, what reads ``s3://`` where obstore does not: without it
installed, with ``SHARDFEED_OBSTORE=0`` or options it cannot honour) against a server that
misbehaves: a whole object answered for a range gives the range, short answers are retried
and never handed back, a trickling body ends at the deadline, garbled lengths are
StorageErrors that name the URL. The obstore backend against the same server:
test_obstore_hostile.py."""

from __future__ import annotations

import time
import tracemalloc
from typing import Any

import pytest
from hostile_server import OBJECT_BYTES, HostileServer, hostile_server, object_bytes

from shardfeed.errors import StorageError
from shardfeed.storage.ranges import checked_answer as _checked
from shardfeed.storage.remote import RemoteSource, ShortAnswer, WrongLength

__all__ = ["hostile_server"]


@pytest.fixture(autouse=True)
def _s3fs_reads_s3_here(request: pytest.FixtureRequest) -> None:
    """RemoteSource on s3:// is fsspec's road to S3: s3fs's (tests without a server run
    anyway)."""
    if {"hostile_server", "s3_server"} & set(request.fixturenames):
        pytest.importorskip("s3fs")

SLACK_SECONDS = 2.0
"""Allowed past a stated deadline on a loaded machine."""


@pytest.mark.parametrize("start", [40 << 20, OBJECT_BYTES - 1000])
def test_a_whole_object_answered_for_a_range_is_refused_unread(
    hostile_server: HostileServer, start: int,
) -> None:
    """Memory follows the ranges asked: a 512 KiB read of a 48 MiB object a server answers
    whole (it ignores Range) is refused from the answer's headers, not read, not retried."""
    RemoteSource("s3://hostile/good.bin").read(0, 10)  # the client made (its models loaded)
    remote = RemoteSource("s3://hostile/whole.bin")
    tracemalloc.start()
    try:
        with pytest.raises(StorageError, match="ignores Range requests") as info:
            remote.read(start, 512 << 10)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "s3://hostile/whole.bin" in str(info.value)
    assert peak < 8 << 20, f"{peak:,} bytes held for a 512 KiB read"
    assert remote.stats()["retries"] == 0


@pytest.mark.parametrize(("answer", "start", "end", "size", "want"), [
    (bytes(range(100)), 50, 200, 100, bytes(range(50, 100))),  # whole object, past the end
    (bytes(range(50, 100)), 50, 200, 100, bytes(range(50, 100))),  # the end of the object
    (bytes(range(50, 80)), 50, 200, 100, ShortAnswer),  # short of the object's end
    (bytes(80), 50, 200, 100, ShortAnswer),  # longer than the rest, shorter than asked
    (bytes(120), 10, 20, 100, WrongLength),  # neither the range nor the object
    (bytes(5), 10, 20, None, bytes(5)),  # no size said: taken as the end (records judge)
    (bytes(15), 10, 20, None, WrongLength),
])
def test_an_answer_of_another_length_is_judged_against_the_object(
    answer: bytes, start: int, end: int, size: int | None, want: Any,
) -> None:
    if isinstance(want, bytes):
        assert _checked(answer, start, end, size) == want
    else:
        with pytest.raises(want):
            _checked(answer, start, end, size)


def test_a_trickling_body_ends_at_the_deadline(hostile_server: HostileServer) -> None:
    """A body sent one byte every 50 ms (never a pause long enough for the read timeout):
    each call fails at its deadline, and a healthy object of the same server reads after."""
    options = hostile_server.storage_options(read_timeout=5.0)
    trickle = RemoteSource("s3://hostile/trickle.bin", deadline_seconds=0.5, max_concurrency=16,
                           coalesce_gap_bytes=-1, storage_options=options)
    ranges = [(k * (1 << 20), 256 << 10) for k in range(16)]
    for _ in range(3):
        began = time.monotonic()
        with pytest.raises(StorageError, match=r"s3://hostile/trickle\.bin.*deadline_seconds"):
            trickle.read_ranges(ranges)
        assert time.monotonic() - began < 0.5 + SLACK_SECONDS
    healthy = RemoteSource("s3://hostile/good.bin", deadline_seconds=5, storage_options=options)
    assert healthy.read(1000, 50_000) == object_bytes(1000, 51_000)


def test_a_short_206_is_retried_then_read_whole(hostile_server: HostileServer) -> None:
    """Two answers with half the range (their Content-Range says so), then a whole one: the
    read retries and hands back every byte asked, never the half."""
    remote = RemoteSource("s3://hostile/short.bin", backoff_seconds=0.01)
    assert remote.read(5000, 100_000) == object_bytes(5000, 105_000)
    assert remote.stats()["retries"] == 2


def test_a_server_that_keeps_answering_short_is_named(hostile_server: HostileServer) -> None:
    hostile_server.short_answers = 10**6
    # a count of attempts, not a deadline: on a loaded machine the deadline could fall inside
    # an attempt, and the last error would be the deadline's, not the short answer
    remote = RemoteSource("s3://hostile/short.bin", retries=4, deadline_seconds=60,
                          backoff_seconds=0.01, max_backoff_seconds=0.05)
    with pytest.raises(StorageError) as short:
        remote.read(5000, 100_000)
    message = str(short.value)
    assert "s3://hostile/short.bin" in message and "read bytes 5000..105000" in message
    assert "fewer bytes than asked" in message and "50000 bytes answered" in message
    assert "after 5 attempts" in message


@pytest.mark.parametrize("name", ["length.bin", "chunked.bin"])
def test_a_garbled_length_is_a_storage_error_naming_the_url(
    hostile_server: HostileServer, name: str
) -> None:
    """s3fs's client waits on such an answer: the read ends at its deadline, named."""
    hostile_server.content_length = "-1"
    hostile_server.chunk_size_line = b"zz"
    remote = RemoteSource(f"s3://hostile/{name}", retries=1, backoff_seconds=0.01,
                          deadline_seconds=4)
    began = time.monotonic()
    with pytest.raises(StorageError, match=rf"read bytes 0\.\.16 of 's3://hostile/{name}'"):
        remote.read(0, 16)
    assert time.monotonic() - began < 4 + SLACK_SECONDS
