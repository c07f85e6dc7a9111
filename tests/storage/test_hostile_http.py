"""Direct GETs (storage/http1.py, direct_gets.py) against a server that misbehaves: memory
stays bounded by the range, every attempt ends in bounded time and frees its thread and
socket, short answers are retried and named, garbled lengths are StorageErrors that name
the URL."""

from __future__ import annotations

import time
import tracemalloc

import pytest
from hostile_server import HostileServer, hostile_server, object_bytes

from shardfeed.errors import StorageError
from shardfeed.storage import http1
from shardfeed.storage.direct_gets import DirectGets
from shardfeed.storage.remote import RemoteSource

__all__ = ["hostile_server"]

SLACK_SECONDS = 2.0
"""Allowed past a stated deadline on a loaded machine."""


@pytest.fixture(params=["compiled", "python"])
def receive(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Bodies received by the compiled ``_recv`` and by the Python path."""
    if request.param == "python":
        monkeypatch.setattr(http1, "_recv", None)
    else:
        assert http1._recv is not None, "shardfeed.storage._recv was not built"
    return str(request.param)


def _wait_until(check: object, seconds: float) -> bool:
    ends = time.monotonic() + seconds
    while time.monotonic() < ends:
        if check():  # type: ignore[operator]
            return True
        time.sleep(0.02)
    return False


def test_a_200_for_a_range_holds_no_more_than_the_range(hostile_server: HostileServer,
                                                         receive: str) -> None:
    """A server that ignores Range sends the whole 48 MiB object for 512 KiB asked at 40 MiB:
    the bytes before the range are read and dropped a piece at a time, never held."""
    remote = RemoteSource("s3://hostile/whole.bin")
    assert remote.read(0, 100) == object_bytes(0, 100)  # the client is set up (not measured)
    start, length = 40 << 20, 512 << 10
    tracemalloc.start()
    try:
        got = remote.read(start, length)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert got == object_bytes(start, start + length)
    assert peak < length + (3 << 20), f"{peak / 2**20:.1f} MiB held for a 0.5 MiB range"
    assert hostile_server.requests.count("whole.bin") == 2


def test_a_trickling_body_is_abandoned_at_the_deadline_and_frees_its_thread(
    hostile_server: HostileServer,
) -> None:
    """Eighty GETs or more of a body sent one byte every 50 ms (never a pause long enough for the
    read timeout): each call fails at its deadline, its sockets are closed at once, and a
    healthy object of the same server still reads after them (the GET threads are free)."""
    options = hostile_server.storage_options(read_timeout=5.0)  # each wait is short
    trickle = RemoteSource("s3://hostile/trickle.bin", deadline_seconds=0.5, max_concurrency=16,
                           coalesce_gap_bytes=-1, storage_options=options)
    ranges = [(k * (1 << 20), 256 << 10) for k in range(16)]
    # on a loaded machine a round may send fewer than its 16 GETs before its deadline: go on
    # until more GETs reached the server than the 64 threads that once stayed stuck in them
    for _ in range(40):
        began = time.monotonic()
        with pytest.raises(StorageError, match=r"s3://hostile/trickle\.bin.*deadline_seconds"):
            trickle.read_ranges(ranges)
        assert time.monotonic() - began < 0.5 + SLACK_SECONDS
        if hostile_server.requests.count("trickle.bin") >= 80:
            break
    assert hostile_server.requests.count("trickle.bin") >= 80
    assert _wait_until(lambda: hostile_server.answering("trickle.bin") == 0, 2.0), (
        f"{hostile_server.answering('trickle.bin')} abandoned GETs still hold their sockets")
    healthy = RemoteSource("s3://hostile/good.bin", deadline_seconds=5, storage_options=options)
    assert healthy.read(1000, 50_000) == object_bytes(1000, 51_000)


def test_every_attempt_ends_in_bounded_time_whatever_its_caller(
    hostile_server: HostileServer, receive: str
) -> None:
    """A GET on its own (no deadline above it) of a trickling body: it fails after its read
    timeout plus a second a MiB asked, not when the server stops."""

    class Fs:
        def url(self, path: str, expires: int) -> str:
            return f"{hostile_server.endpoint_url}/{path}"

    gets = DirectGets(Fs(), "hostile/trickle.bin", timeout_seconds=1.0)
    began = time.monotonic()
    with pytest.raises(TimeoutError, match=r"trickle\.bin.*1\.0\d* s") as slow:
        gets.get(0, 64 << 10)
    assert time.monotonic() - began < 1.1 + SLACK_SECONDS
    assert "65536" in str(slow.value) and "too slowly" in str(slow.value)
    assert _wait_until(lambda: hostile_server.answering("trickle.bin") == 0, 2.0)


def test_a_short_206_is_retried_then_read_whole(hostile_server: HostileServer,
                                                receive: str) -> None:
    """Two answers with half the range (their Content-Range says so), then a whole one: the
    read retries and hands back every byte asked, never the half."""
    remote = RemoteSource("s3://hostile/short.bin", backoff_seconds=0.01)
    assert remote.read(5000, 100_000) == object_bytes(5000, 105_000)
    assert hostile_server.requests.count("short.bin") == 3
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
    assert "short answer" in message and "bytes 5000..55000" in message
    assert "shardfeed index" not in message  # the shard is not what is wrong
    assert hostile_server.requests.count("short.bin") > 2  # retried before giving up


@pytest.mark.parametrize("size_line", [b"-5", b"zz", b"1_0", b"+10", b"0x10", b"",
                                       b"ffffffffffffffffffffffff"])
def test_a_garbled_chunk_size_is_a_storage_error_naming_the_url(
    hostile_server: HostileServer, receive: str, size_line: bytes
) -> None:
    hostile_server.chunk_size_line = size_line
    remote = RemoteSource("s3://hostile/chunked.bin", retries=1, backoff_seconds=0.01)
    with pytest.raises(StorageError) as bad:
        remote.read(0, 16)
    message = str(bad.value)
    assert "s3://hostile/chunked.bin" in message
    assert "chunk size" in message and "ValueError" not in message
    assert "read bytes 0..16" in message and "after 2 attempts" in message
    assert "not HTTP/1.1 as expected" in message  # what to check


@pytest.mark.parametrize("length", ["\u00b2", "-1", "1e3", "10, 10", "", "99999999999999999999999"])
def test_a_garbled_content_length_is_a_storage_error_naming_the_url(
    hostile_server: HostileServer, receive: str, length: str
) -> None:
    hostile_server.content_length = length
    remote = RemoteSource("s3://hostile/length.bin", retries=1, backoff_seconds=0.01)
    with pytest.raises(StorageError) as bad:
        remote.read(0, 16)
    message = str(bad.value)
    assert "s3://hostile/length.bin" in message
    assert "Content-Length" in message and "ValueError" not in message

