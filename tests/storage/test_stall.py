"""Every storage call ends within its deadline: stalled endpoints, refused connections,
close() from another thread, Ctrl-C."""

from __future__ import annotations

import json
import math
import os
import socket
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem
from stalled_server import StalledServer, interrupt, start

from shardfeed.errors import StorageError
from shardfeed.storage import files, open_source
from shardfeed.storage.options import client_options, filesystem
from shardfeed.storage.remote import RemoteOptions, RemoteSource
from shardfeed.storage.retry import Retrier, RetryPolicy

URL = "s3://stalled-bucket/data/shard.tfrecord"
SLACK_SECONDS = 2.0
"""Allowed past a stated deadline on a loaded machine."""


def _timed_error(call: Callable[[], object]) -> tuple[float, str]:
    began = time.monotonic()
    with pytest.raises(StorageError) as info:
        call()
    return time.monotonic() - began, str(info.value)


@pytest.mark.parametrize("how", ["read", "read_ranges", "size"])
def test_a_stalled_endpoint_gives_a_storage_error_within_the_deadline(
    stalled_server: StalledServer, how: str
) -> None:
    remote = RemoteSource(URL, deadline_seconds=2)
    stalled_server.set_up_client(URL, deadline_seconds=2)
    calls: dict[str, Callable[[], object]] = {
        "read": lambda: remote.read(1000, 200),
        "read_ranges": lambda: remote.read_ranges([(0, 10), (5_000_000, 10), (9_000_000, 5)]),
        "size": remote.size,
    }
    elapsed, message = _timed_error(calls[how])
    assert elapsed < 2 + SLACK_SECONDS, f"the error came after {elapsed:.1f} s"
    assert stalled_server.connections > 0, message  # it did try, and got no answer
    asked = {"read": ["read bytes 1000..1200 of"],
             "read_ranges": [f"read bytes {a}..{b} of" for a, b in
                             [(0, 10), (5_000_000, 5_000_010), (9_000_000, 9_000_005)]],
             "size": ["get the size of"]}[how]
    assert any(f"cannot {a} '{URL}'" in message for a in asked), message  # one of those asked
    assert "deadline_seconds=2" in message and "attempt" in message and " s" in message
    assert "endpoint" in message  # what to check
    if how == "read_ranges":
        assert "and 2 more requests" in message  # three requests, all unanswered


def test_whole_file_reads_keep_the_deadline_of_their_policy(
    stalled_server: StalledServer,
) -> None:
    manifest = "s3://stalled-bucket/ds/shardfeed.json"
    with files.retry_policy(RetryPolicy(deadline_seconds=2)):
        elapsed, message = _timed_error(lambda: files.read_bytes(manifest))
        assert elapsed < 2 + SLACK_SECONDS
        assert f"cannot read '{manifest}'" in message and "deadline_seconds=2" in message
        elapsed, message = _timed_error(lambda: files.exists(manifest))
        assert elapsed < 2 + SLACK_SECONDS and manifest in message


@pytest.fixture()
def refusing_url(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """``s3://refused-bucket/...`` on a port that refuses every connection (bound, not
    listening: no other process can take it meanwhile)."""
    pytest.importorskip("s3fs")
    from shardfeed.storage.remote import set_storage_options

    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{sock.getsockname()[1]}"
        set_storage_options("s3://refused-bucket/", key="k", secret="s", config_kwargs={},
                            client_kwargs={"endpoint_url": endpoint,
                                           "region_name": "us-east-1"})
        try:
            yield "s3://refused-bucket/x.bin"
        finally:
            set_storage_options("s3://refused-bucket/")


def test_refused_connections_are_retried_with_backoff_until_the_deadline(
    refusing_url: str,
) -> None:
    # the s3fs client of these options and this deadline is made once a process (botocore
    # loads its models: seconds on a loaded machine, not what this test times): made first
    fs, path = filesystem(refusing_url, deadline_seconds=3.0)
    fs.url(path, expires=60)  # signing: local, no request
    remote = RemoteSource(refusing_url, deadline_seconds=3.0, backoff_seconds=0.05,
                          max_backoff_seconds=0.2)
    elapsed, message = _timed_error(lambda: remote.read(0, 10))
    assert 1.5 < elapsed < 3.0 + SLACK_SECONDS  # it kept trying, and stopped at the deadline
    # several attempts fit in 3 s (a refused connection fails fast; on a loaded machine each
    # attempt's client set-up can take a good part of a second, so no exact count)
    assert remote.stats()["retries"] >= 2
    attempts = remote.stats()["retries"] + 1
    assert f"{attempts} attempts in" in message and "deadline_seconds=3 " in message
    # what went wrong last, naming the endpoint (by s3fs: 'the endpoint URL: "http://...')
    assert "last error: " in message and "endpoint URL: \"http://127.0.0.1:" in message
    assert refusing_url in message and "read bytes 0..10" in message


def test_close_from_another_thread_returns_the_blocked_reader_at_once(
    stalled_server: StalledServer,
) -> None:
    remote = RemoteSource(URL)  # the default deadline: only close() can end the read early
    outcome: list[tuple[float, BaseException]] = []

    def read() -> None:
        try:
            remote.read_ranges([(0, 10), (5_000_000, 10)])
        except Exception as exc:  # noqa: BLE001 - checked below
            outcome.append((time.monotonic(), exc))

    reader = threading.Thread(target=read)
    reader.start()
    stalled_server.wait_for_connection()
    closed_at = time.monotonic()
    remote.close()
    assert time.monotonic() - closed_at < 0.5  # close() itself does not wait
    reader.join(timeout=10)
    assert not reader.is_alive()
    ended, error = outcome[0]
    assert ended - closed_at < 0.5, f"the reader ended {ended - closed_at:.2f} s after close()"
    assert isinstance(error, StorageError)
    assert URL in str(error) and "closed" in str(error) and "open_source" in str(error)
    with pytest.raises(StorageError, match="closed"):
        remote.read(0, 1)


_READER = textwrap.dedent(
    """
    import json, sys
    from concurrent.futures import ThreadPoolExecutor
    from shardfeed.storage.remote import RemoteSource, set_storage_options

    url, options = sys.argv[1], json.loads(sys.argv[2])
    set_storage_options("s3://stalled-bucket/", **options)
    pool = ThreadPoolExecutor(4)
    futures = [pool.submit(RemoteSource(url).read, 1000 * k, 100) for k in range(4)]
    print("reading", flush=True)
    print([len(f.result()) for f in futures])
    """
)


def test_ctrl_c_ends_a_program_whose_threads_wait_on_a_stalled_endpoint(
    stalled_server: StalledServer,
) -> None:
    """The user's own thread pool reads from a server that never answers; Ctrl-C ends the
    program within a second (the interpreter's exit does not wait for the stuck reads)."""
    env = {**os.environ, "AWS_EC2_METADATA_DISABLED": "true", "AWS_DEFAULT_REGION": "us-east-1"}
    proc = start([sys.executable, "-c", _READER, URL, json.dumps(stalled_server.storage_options())],
                 env=env)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "reading"
        stalled_server.wait_for_connection()
        time.sleep(1.0)
        took, stderr = interrupt(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "KeyboardInterrupt" in stderr, stderr[-2000:]
    assert took < 1.0, f"the program ended {took:.2f} s after Ctrl-C"


def test_a_call_that_never_returns_is_abandoned_at_the_deadline() -> None:
    release = threading.Event()
    retrier = Retrier(RetryPolicy(deadline_seconds=0.5), key="memory://x")
    try:
        elapsed, message = _timed_error(
            lambda: retrier.call(lambda: release.wait(30), url="memory://x", action="read")
        )
    finally:
        release.set()
    assert elapsed < 0.5 + SLACK_SECONDS
    assert "1 attempt in" in message and "still unanswered" in message


def test_the_client_timeouts_and_retries_fit_inside_the_deadline() -> None:
    fitted = client_options("s3://b/k", {"anon": True}, deadline_seconds=3)
    assert fitted["anon"] is True
    assert fitted["config_kwargs"] == {"connect_timeout": 0.75, "read_timeout": 0.75,
                                       "retries": {"total_max_attempts": 1}}
    long = client_options("s3://b/k", {}, deadline_seconds=60)["config_kwargs"]
    assert (long["connect_timeout"], long["read_timeout"]) == (5.0, 15.0)  # s3fs's own
    own = {"config_kwargs": {"read_timeout": 100, "retries": {"max_attempts": 3}}}
    kept = client_options("s3://b/k", own, deadline_seconds=3)["config_kwargs"]
    assert kept["read_timeout"] == 100 and kept["retries"] == {"max_attempts": 3}
    assert client_options("gs://b/k", {"token": "anon"}, deadline_seconds=3) == {
        "token": "anon"}


def test_deadline_defaults_and_bad_values() -> None:
    assert RemoteOptions().deadline_seconds == 60.0
    assert RemoteOptions().retries is None  # retry while the deadline allows
    assert RemoteOptions.from_mapping({"deadline_seconds": 5}, what="x").policy() == \
        RetryPolicy(deadline_seconds=5)
    for bad in (0, -1.0, math.inf, math.nan, "5", True):
        with pytest.raises(ValueError, match="deadline_seconds"):
            open_source("memory://x/y", deadline_seconds=bad)


def test_retries_cap_the_attempts_inside_the_deadline(refusing_url: str) -> None:
    remote = RemoteSource(refusing_url, retries=2, backoff_seconds=0.01)
    elapsed, message = _timed_error(lambda: remote.read(0, 10))
    assert "after 3 attempts in" in message and refusing_url in message
    assert elapsed < 60


class SlowMemoryFileSystem(MemoryFileSystem):
    """``slowmem://``: fsspec's in-memory filesystem, each read and write ``delay`` s slow
    (a server that is slow but alive)."""

    protocol = ("slowmem",)
    store: ClassVar[dict[str, Any]] = {}  # its own, apart from memory://
    pseudo_dirs: ClassVar[list[str]] = [""]
    delay_seconds = 0.2

    @classmethod
    def _strip_protocol(cls, path: str) -> str:
        return str(MemoryFileSystem._strip_protocol(path.replace("slowmem://", "memory://", 1)))

    def cat_file(self, path: str, start: int | None = None, end: int | None = None,
                 **kwargs: Any) -> bytes:
        time.sleep(self.delay_seconds)
        return bytes(super().cat_file(path, start=start, end=end, **kwargs))

    def pipe_file(self, path: str, value: bytes, *args: Any, **kwargs: Any) -> None:
        time.sleep(self.delay_seconds)
        super().pipe_file(path, value, *args, **kwargs)


fsspec.register_implementation("slowmem", SlowMemoryFileSystem, clobber=True)


def test_a_read_of_many_requests_may_outlast_the_deadline_while_each_request_is_in_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The deadline bounds each request, from its first attempt: six requests one after
    another, 0.2 s each, under a 0.5 s deadline all succeed."""
    monkeypatch.setattr(SlowMemoryFileSystem, "delay_seconds", 0.0)
    data = bytes(range(256)) * 40
    files.write_bytes_atomic("slowmem://b/six.bin", data)
    monkeypatch.setattr(SlowMemoryFileSystem, "delay_seconds", 0.2)
    remote = RemoteSource("slowmem://b/six.bin", deadline_seconds=0.5, max_concurrency=1,
                          coalesce_gap_bytes=-1)
    ranges = [(1000 * k, 10) for k in range(6)]
    began = time.monotonic()
    assert remote.read_ranges(ranges) == [data[o : o + n] for o, n in ranges]
    assert time.monotonic() - began >= 1.0  # longer than the deadline, and no error
    assert remote.stats()["requests"] == 6


def test_writes_get_more_time_for_more_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """A write of n bytes may take the deadline plus n / 1 MiB/s; a slow small one fails."""
    monkeypatch.setattr(SlowMemoryFileSystem, "delay_seconds", 1.0)
    with files.retry_policy(RetryPolicy(deadline_seconds=0.5)):
        files.write_bytes_atomic("slowmem://b/big.bin", bytes(2 << 20))  # 0.5 + 2 s allowed
        with pytest.raises(StorageError, match=r"cannot write 'slowmem://b/small.bin'.*"
                                               r"deadline_seconds="):
            files.write_bytes_atomic("slowmem://b/small.bin", b"tiny")
    monkeypatch.setattr(SlowMemoryFileSystem, "delay_seconds", 0.0)
    assert files.size("slowmem://b/big.bin") == 2 << 20


def test_an_obstore_request_past_its_deadline_is_ended_by_the_client(
    stalled_server: StalledServer,
) -> None:
    """The caller gets its StorageError at the deadline; the request it left behind is not
    left running: obstore's client, whose timeout is the deadline and one second, drops its
    connection to the stalled server soon after (no thread or socket kept per stall)."""
    pytest.importorskip("obstore")
    from shardfeed.storage.obstore_backend import ObstoreSource

    source = ObstoreSource(URL, deadline_seconds=1,
                           storage_options=stalled_server.storage_options())
    elapsed, message = _timed_error(lambda: source.read(0, 100))
    assert elapsed < 1 + SLACK_SECONDS, message
    assert stalled_server.connections > 0
    ends = time.monotonic() + 1 + 1 + SLACK_SECONDS  # the client's own timeout, and slack
    while stalled_server.open_connections and time.monotonic() < ends:
        time.sleep(0.05)
    assert stalled_server.open_connections == 0, "the abandoned request still holds its socket"
