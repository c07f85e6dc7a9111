"""Datasets on a storage server that stalls or goes away: errors within the deadline, Ctrl-C at
once, a short outage survived with the default options."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from stalled_server import StalledServer, interrupt, start

import shardfeed
from shardfeed import Dataset, StorageError

SLACK_SECONDS = 2.0
"""Allowed past a stated deadline on a loaded machine."""


def test_opening_a_dataset_on_a_stalled_endpoint_fails_within_the_deadline(
    stalled_server: StalledServer,
) -> None:
    url = "s3://stalled-bucket/ds"
    stalled_server.set_up_client(f"{url}/shardfeed.json", deadline_seconds=3)
    began = time.monotonic()
    with pytest.raises(StorageError) as info:
        Dataset(url, source_options={"deadline_seconds": 3})
    elapsed = time.monotonic() - began
    assert elapsed < 3 + SLACK_SECONDS, f"the error came after {elapsed:.1f} s"
    message = str(info.value)
    assert f"{url}/shardfeed.json" in message  # the manifest, the first thing read
    assert "deadline_seconds=3" in message and "attempt" in message
    assert stalled_server.connections > 0, message


def test_reading_records_from_a_server_that_stalls_mid_stream_fails_within_the_deadline(
    s3_server: Any, records_dataset: Callable[[int, int], Path]
) -> None:
    """The manifest and indexes come; the shards' bytes never do."""
    url = s3_server.upload_folder(records_dataset(40, 4))
    with Dataset(url, source_options={"deadline_seconds": 3}) as ds:
        ds.read_many([0, 10, 20, 30])  # indexes and sizes loaded
        with s3_server.stall_gets(".tfrecord") as stall:
            began = time.monotonic()
            with pytest.raises(StorageError) as info:
                ds.read_many([1, 11, 21, 31])
            elapsed = time.monotonic() - began
    assert elapsed < 3 + SLACK_SECONDS, f"the error came after {elapsed:.1f} s"
    assert stall.held > 0
    message = str(info.value)
    assert f"{url}/part-00" in message and "read bytes" in message
    assert "deadline_seconds=3" in message


def test_close_from_another_thread_ends_a_blocked_read_at_once(
    s3_server: Any, records_dataset: Callable[[int, int], Path]
) -> None:
    url = s3_server.upload_folder(records_dataset(40, 4))
    ds = Dataset(url)  # the default deadline: only close() can end the read early
    ds.read_many([0, 10, 20, 30])
    outcome: list[tuple[float, BaseException]] = []

    def read() -> None:
        try:
            ds.read_many([1, 11, 21, 31])
        except Exception as exc:  # noqa: BLE001 - checked below
            outcome.append((time.monotonic(), exc))

    with s3_server.stall_gets(".tfrecord") as stall:
        reader = threading.Thread(target=read)
        reader.start()
        while stall.held < 4 and reader.is_alive():
            time.sleep(0.01)
        closed_at = time.monotonic()
        ds.close()
        close_took = time.monotonic() - closed_at
        reader.join(timeout=10)
    assert not reader.is_alive()
    assert close_took < 1.0, f"close() took {close_took:.1f} s"
    ended, error = outcome[0]
    assert ended - closed_at < 1.0, f"the reader ended {ended - closed_at:.1f} s after close()"
    assert "closed" in str(error)


_READER = textwrap.dedent(
    """
    import json, sys
    import shardfeed
    from shardfeed.storage.remote import set_storage_options

    url, options, how = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
    set_storage_options("s3://", **options)
    with shardfeed.Dataset(url) as ds:
        if how == "read_many":
            ds.read_many([0, 100, 200, 300])  # the indexes and sizes come
            print("ready", flush=True)
            sys.stdin.readline()  # from now on the server holds every GET of shard bytes
            ds.read_many([1, 101, 201, 301])
        else:
            with shardfeed.Loader(ds, batch_size=4, shuffle=True, seed=1, transform=None,
                                  num_threads=4, rank=0, world_size=1) as loader:
                batches = iter(loader)
                next(batches)
                print("ready", flush=True)
                sys.stdin.readline()  # the workers' reads stall from now on
                for batch in batches:
                    pass
    """
)


@pytest.mark.parametrize("how", ["read_many", "loader"])
def test_ctrl_c_returns_within_a_second_while_reads_are_stalled(
    s3_server: Any, records_dataset: Callable[[int, int], Path], how: str
) -> None:
    """What a user does: a script reading a dataset whose server stops answering, then
    Ctrl-C. The process ends with KeyboardInterrupt within a second, however many reads
    are stuck in however many threads."""
    url = s3_server.upload_folder(records_dataset(400, 4))
    options = {"key": "testing-key", "secret": "testing-secret",
               "client_kwargs": {"endpoint_url": s3_server.endpoint_url}}
    env = {**os.environ, "AWS_EC2_METADATA_DISABLED": "true", "AWS_DEFAULT_REGION": "us-east-1"}
    proc = start([sys.executable, "-c", _READER, url, json.dumps(options), how],
                 stdin=subprocess.PIPE, env=env)
    assert proc.stdin is not None and proc.stdout is not None
    ready = proc.stdout.readline().strip()
    with s3_server.stall_gets(".tfrecord") as stall:
        try:
            assert ready == "ready", proc.communicate(timeout=30)[1][-2000:]
            proc.stdin.write("go\n")
            proc.stdin.flush()
            ends = time.monotonic() + 30
            while stall.held < 1 and time.monotonic() < ends:
                time.sleep(0.01)
            assert stall.held > 0, "the reads never reached the server"
            time.sleep(1.0)
            took, stderr = interrupt(proc)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stdin.close()
    assert "KeyboardInterrupt" in stderr, stderr[-2000:]
    assert proc.returncode != 0
    assert took < 1.0, f"the process ended {took:.2f} s after Ctrl-C"


def test_a_three_second_outage_is_survived_with_the_default_options(
    s3_server: Any, records_dataset: Callable[[int, int], Path]
) -> None:
    """The server goes away for 3 s in the middle of reading; with no options at all, every
    record is read, and read right."""
    folder = records_dataset(80, 4)
    url = s3_server.upload_folder(folder)
    with Dataset(str(folder)) as local:
        expected = local.read_many(range(80))
    with Dataset(url) as ds:
        ds.read_many([0, 20])  # shards 0 and 1 opened; 2 and 3 not yet
        s3_server.stop()
        down_at = time.monotonic()
        restart = s3_server.restart_later(3.0)
        # records of the open shards, and the indexes and sizes of the others: all wait
        got = ds.read_many(range(80))
        waited = time.monotonic() - down_at
        retries = ds.storage_stats()["retries"]
        again = [ds[i] for i in range(80)]
    restart.join(timeout=30)
    assert [r["index"].tolist() for r in got] == [r["index"].tolist() for r in expected]
    assert [r["name"] for r in got] == [r["name"] for r in expected]
    assert [r["name"] for r in again] == [r["name"] for r in expected]
    assert waited >= 2.5 and retries > 0  # the outage was felt, and waited out


def _stalled_loader_closed(s3_server: Any, folder: Path, *, from_thread: bool
                           ) -> tuple[float, BaseException | None]:
    """A Loader reading s3:// whose server stops answering after the first batch, closed
    by the user: from another thread while next() waits, or by ``with`` as the training
    step raises while the slices of the next batches wait on the server. (close()'s
    seconds, what the waiting next() raised)."""
    url = s3_server.upload_folder(folder)
    with Dataset(url) as ds:
        return _close_stalled(s3_server, ds, from_thread=from_thread)


def _close_stalled(s3_server: Any, ds: Dataset, *, from_thread: bool
                   ) -> tuple[float, BaseException | None]:
    # with read_ahead=0 the slices read for themselves: a stalled read is a slice's
    loader = shardfeed.Loader(ds, batch_size=4, shuffle=True, seed=1,
                              transform=None, num_threads=4, prefetch_batches=4,
                              read_ahead=None if from_thread else 0)
    batches = iter(loader)
    next(batches)
    outcome: list[BaseException | None] = []
    if not from_thread:
        run = loader._run  # the batches made ahead: done before the server stops
        assert run is not None
        ends = time.monotonic() + 30
        while not all(f.done() for p in run.pending for f in p.futures):
            assert time.monotonic() < ends
            time.sleep(0.01)
    with s3_server.stall_gets(".tfrecord") as stall:
        if not from_thread:
            next(batches)  # made ahead; the next one's slice reads, and waits
            ends = time.monotonic() + 30
            while stall.held < 1 and time.monotonic() < ends:
                time.sleep(0.01)
            assert stall.held > 0, "the reads never reached the server"
            began = time.monotonic()
            with pytest.raises(ZeroDivisionError), loader:
                raise ZeroDivisionError("the training step fails")
            return time.monotonic() - began, None

        def consume() -> None:
            try:
                for _ in batches:
                    pass
                outcome.append(None)
            except Exception as exc:  # noqa: BLE001 - checked by the caller
                outcome.append(exc)

        consumer = threading.Thread(target=consume)
        consumer.start()
        ends = time.monotonic() + 30
        while stall.held < 1 and time.monotonic() < ends:
            time.sleep(0.01)
        assert stall.held > 0, "the reads never reached the server"
        time.sleep(1.0)  # the batches read before the stall are taken: next() waits
        began = time.monotonic()
        loader.close()
        took = time.monotonic() - began
        consumer.join(timeout=30)
        assert not consumer.is_alive()
    return took, outcome[0]


def test_close_ends_a_loader_whose_reads_are_stalled_at_once(
    s3_server: Any, records_dataset: Callable[[int, int], Path]
) -> None:
    """The default deadline is 60 s: only the loader's own cancel token ends the stalled
    reads of its slices early."""
    took, error = _stalled_loader_closed(s3_server, records_dataset(400, 4), from_thread=True)
    assert took < SLACK_SECONDS, f"close() took {took:.1f} s"
    assert error is not None and "closed" in str(error)
    assert "pass it read for was ended" in str(error.__cause__)  # the stalled read


def test_an_error_in_the_training_step_leaves_the_with_block_at_once(
    s3_server: Any, records_dataset: Callable[[int, int], Path]
) -> None:
    took, _ = _stalled_loader_closed(s3_server, records_dataset(400, 4), from_thread=False)
    assert took < SLACK_SECONDS, f"leaving the with block took {took:.1f} s"


def test_cancelling_one_loader_leaves_another_reading(
    s3_server: Any, records_dataset: Callable[[int, int], Path]
) -> None:
    """The token is the loader's own: a second loader's reads on the same server are not
    ended by the first one's close()."""
    url = s3_server.upload_folder(records_dataset(400, 4))
    with Dataset(url) as ds, shardfeed.Loader(ds, batch_size=4, transform=None,
                                              num_threads=2) as other:
        first = shardfeed.Loader(ds, batch_size=4, transform=None, num_threads=2)
        next(iter(first))
        later = iter(other)
        first.close()
        assert sum(len(b["index"]) for b in later) == 400


_FORKED_READER = textwrap.dedent(
    """
    import json, os, signal, sys, threading
    from concurrent.futures import Future
    import shardfeed
    from shardfeed.dataset.fetch_ahead import _Staged
    from shardfeed.storage.remote import set_storage_options

    url, options = sys.argv[1], json.loads(sys.argv[2])
    set_storage_options("s3://", **options)
    ds = shardfeed.Dataset(url)
    fetcher = ds._fetcher
    session = fetcher.session()
    # at the fork: a fetch ahead of record 3 running on a parent's thread, and a parent's
    # thread inside the fetcher's lock
    session._staged[3] = _Staged(Future(), 0, 0)
    fetcher._executor().submit(lambda: None).result()  # the parent's fetch threads exist
    holding = threading.Event()
    def hold():
        with fetcher._lock:
            holding.set()
            threading.Event().wait()
    threading.Thread(target=hold, daemon=True).start()
    holding.wait()
    pid = os.fork()
    if pid == 0:
        signal.alarm(60)
        try:
            with shardfeed.Loader(ds, batch_size=4, transform=None, num_threads=2) as loader:
                n = sum(len(b["index"]) for b in loader)
            print(json.dumps({"read": n, "staged": ds.read_many([3])[0]["index"].tolist()}),
                  flush=True)
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    print(json.dumps({"status": status}), flush=True)
    """
)


def test_a_forked_child_reads_past_the_parents_reads_ahead(
    s3_server: Any, records_dataset: Callable[[int, int], Path]
) -> None:
    """The child of a process whose Dataset had reads ahead in flight on its threads (and a
    thread inside its lock) reads the whole dataset, and the record that was being fetched."""
    url = s3_server.upload_folder(records_dataset(40, 2))
    env = {**os.environ, "AWS_EC2_METADATA_DISABLED": "true", "AWS_DEFAULT_REGION": "us-east-1"}
    done = subprocess.run(
        [sys.executable, "-c", _FORKED_READER, url, json.dumps(s3_server.storage_options())],
        capture_output=True, text=True, env=env, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    child, parent = (json.loads(line) for line in done.stdout.strip().splitlines())
    assert parent == {"status": 0}
    assert child == {"read": 40, "staged": [3]}
