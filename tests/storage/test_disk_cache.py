"""The disk cache: its bound, its policy (next use), its checks, several processes at once."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import pytest

from shardfeed import StorageError
from shardfeed.storage.cache_entries import entry_key, object_key
from shardfeed.storage.disk_cache import UNKNOWN_USE, DiskCache


def put(cache: DiskCache, key: str, size: int, use: int, *, now: int = 0) -> bool:
    return cache.put_many([(key, "s3://b/shard", bytes([len(key)]) * size, use)], now=now) == 1


def held(cache: DiskCache, keys: list[str]) -> list[str]:
    got = cache.get_many(keys, count=False)
    return [k for k, v in zip(keys, got) if v is not None]


def test_the_entry_read_last_is_evicted_and_a_later_one_not_kept(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path, max_bytes=300)
    assert put(cache, "a", 100, 50) and put(cache, "b", 100, 30) and put(cache, "c", 100, 90)
    assert put(cache, "d", 100, 40)  # c (read at 90) goes
    assert held(cache, ["a", "b", "c", "d"]) == ["a", "b", "d"]
    assert not put(cache, "e", 100, 95)  # read after everything held: not kept
    assert held(cache, ["a", "b", "d", "e"]) == ["a", "b", "d"]
    assert not put(cache, "big", 301, 1)  # larger than the cache
    assert cache.summary().bytes == 300
    assert cache.counters.evicted == 1 and cache.counters.bypassed == 2


def test_entries_whose_use_has_passed_go_first_oldest_first(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path, max_bytes=200)
    put(cache, "old", 100, 10)
    put(cache, "unknown", 100, UNKNOWN_USE)
    assert put(cache, "new", 100, 500, now=20)  # "old" was to be read at 10: it has passed
    assert held(cache, ["old", "unknown", "new"]) == ["unknown", "new"]
    assert put(cache, "newer", 100, 600, now=20)  # unknown use counts as read last
    assert held(cache, ["unknown", "new", "newer"]) == ["new", "newer"]


def test_next_uses_given_on_a_hit_decide_the_next_eviction(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path, max_bytes=200)
    put(cache, "a", 100, 10)
    put(cache, "b", 100, 20)
    cache.get_many(["a"], next_use=[1000])  # a is read again only much later
    assert put(cache, "c", 100, 30, now=15)
    assert held(cache, ["a", "b", "c"]) == ["b", "c"]


def test_a_damaged_entry_is_a_miss_and_is_removed(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path, max_bytes=1000)
    put(cache, "aa", 100, 5)
    put(cache, "ab", 100, 5)
    path = tmp_path / "data" / "aa" / "aa.rec"
    blob = bytearray(path.read_bytes())
    blob[-1] ^= 1
    path.write_bytes(bytes(blob))
    (tmp_path / "data" / "ab" / "ab.rec").write_bytes(b"SFC1")  # cut short
    assert cache.get_many(["aa", "ab"]) == [None, None]
    assert cache.counters.corrupt == 2
    assert cache.summary().entries == 0 and not path.exists()
    put(cache, "aa", 100, 5)
    assert cache.get_many(["aa"]) == [bytes([2]) * 100]


def test_verify_and_clear(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path, max_bytes=1000)
    for key in ("k1", "k2", "k3"):
        put(cache, key, 10, 1)
    (tmp_path / "data" / "k2" / "k2.rec").write_bytes(b"garbage" * 10)
    assert cache.verify() == ["k2"]
    summary = cache.summary()
    assert (summary.entries, summary.bytes, summary.objects) == (2, 20, [("s3://b/shard", 2, 20)])
    cache.clear()
    assert cache.summary().entries == 0
    assert not list((tmp_path / "data").rglob("*.rec"))


def test_keys_name_the_object_version() -> None:
    one = object_key("s3://b/part-0.tfrecord", 1000, 123)
    assert one != object_key("s3://b/part-0.tfrecord", 1000, 124)  # rewritten: other bytes
    assert one != object_key("s3://b/part-0.tfrecord", 1001, 123)
    assert one != object_key("s3://b/part-0.tfrecord", 1000, "123")  # an ETag, not a CRC
    assert entry_key(one, 7, 700) != entry_key(one, 8, 700) != entry_key(one, 8, 800)


def test_arguments_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cache_bytes must be an int >= 0"):
        DiskCache(tmp_path, max_bytes=-1)
    with pytest.raises(ValueError, match="local folder"):
        DiskCache("s3://bucket/cache", max_bytes=10)
    blocker = tmp_path / "file"
    blocker.write_bytes(b"")
    with pytest.raises(StorageError, match="cannot open the cache folder"):
        DiskCache(blocker / "cache", max_bytes=10)


def _hammer(folder: str, worker: int, rounds: int) -> None:
    cache = DiskCache(folder, max_bytes=20_000)
    for n in range(rounds):
        key = f"{worker:02d}{n % 37:04d}"
        data = cache.get_many([key], next_use=[n + 50])[0]
        if data is None:
            cache.put_many([(key, f"s3://b/{worker}", key.encode() * 30, n + 40)], now=n)
        else:
            assert data == key.encode() * 30, key


def test_processes_sharing_a_folder_stay_within_the_bound(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_hammer, args=(str(tmp_path), w, 300)) for w in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    cache = DiskCache(tmp_path, max_bytes=20_000)
    summary = cache.summary()
    assert 0 < summary.bytes <= 20_000
    files = sum(1 for _ in (tmp_path / "data").rglob("*.rec"))
    assert files == summary.entries  # no orphan file, no entry without its file
    assert cache.verify() == []


def _reserve_and_die(folder: str) -> None:
    DiskCache(folder, max_bytes=1000).reserve([("gone", "s3://b/x", 10, 5)], now=0)
    os._exit(0)


def test_reservations_of_a_process_that_died_are_dropped(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    p = ctx.Process(target=_reserve_and_die, args=(str(tmp_path),))
    p.start()
    p.join(60)
    cache = DiskCache(tmp_path, max_bytes=1000)
    assert cache.summary().reserved == 0
    assert put(cache, "gone", 10, 5)


def test_an_entry_evicted_by_another_process_while_read_is_not_freed_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reader = DiskCache(tmp_path, max_bytes=300)
    other = DiskCache(tmp_path, max_bytes=300)  # another process on the same folder
    assert put(reader, "a", 100, 50) and put(reader, "b", 100, 60) and put(reader, "c", 100, 70)
    read_file = reader._read_file

    def evicted_meanwhile(key: str, size: int) -> bytes | None:
        if key == "c":  # the reader found c's row; the other process evicts c before the read
            assert put(other, "d", 100, 10)
        return read_file(key, size)

    monkeypatch.setattr(reader, "_read_file", evicted_meanwhile)
    assert held(reader, ["a", "b", "c"]) == ["a", "b"]  # c is a miss
    monkeypatch.undo()
    # the bound still holds: c's bytes were freed once, by its eviction
    for key, use in [("e", 20), ("f", 30), ("g", 40)]:
        put(reader, key, 100, use)
    assert reader.summary().bytes <= 300


def test_an_entry_on_its_way_in_is_awaited_not_fetched_again(tmp_path: Path) -> None:
    import threading
    import time

    fetching = DiskCache(tmp_path, max_bytes=1000)
    waiting = DiskCache(tmp_path, max_bytes=1000)  # another process on the same folder
    assert fetching.reserve([("k", "s3://b/x", 5, 5)], now=0) == [True]
    timer = threading.Timer(0.2, lambda: fetching.fill("k", b"bytes"))
    timer.start()
    started = time.monotonic()
    assert waiting.await_entries([("k", 5)], seconds=30) == [b"bytes"]
    assert 0.15 < time.monotonic() - started < 10
    timer.join()


def test_waiting_ends_at_its_deadline_or_when_the_fetch_is_given_up(tmp_path: Path) -> None:
    import threading
    import time

    fetching = DiskCache(tmp_path, max_bytes=1000)
    waiting = DiskCache(tmp_path, max_bytes=1000)
    fetching.reserve([("slow", "s3://b/x", 5, 5), ("failed", "s3://b/x", 5, 5)], now=0)
    started = time.monotonic()
    assert waiting.await_entries([("slow", 5)], seconds=0.3) == [None]  # the caller fetches
    assert 0.25 < time.monotonic() - started < 10
    timer = threading.Timer(0.1, lambda: fetching.abandon(["failed"]))
    timer.start()
    started = time.monotonic()
    assert waiting.await_entries([("failed", 5)], seconds=30) == [None]
    assert time.monotonic() - started < 10  # not the 30 s: the reservation went away
    timer.join()


def _reserve_and_hang(folder: str, ready: object) -> None:
    import time

    cache = DiskCache(folder, max_bytes=1000)  # kept: a cache collected holds nothing
    cache.reserve([("held", "s3://b/x", 10, 5)], now=0)
    ready.set()  # type: ignore[attr-defined]
    time.sleep(600)


def test_a_fetch_whose_process_died_is_taken_over_at_once(tmp_path: Path) -> None:
    import signal
    import time

    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    p = ctx.Process(target=_reserve_and_hang, args=(str(tmp_path), ready))
    p.start()
    try:
        assert ready.wait(60)
        waiting = DiskCache(tmp_path, max_bytes=1000)
        assert waiting.summary().reserved == 1  # the fetching process is alive: kept
        os.kill(p.pid, signal.SIGKILL)
        p.join(30)
        started = time.monotonic()
        assert waiting.await_entries([("held", 10)], seconds=30) == [None]
        assert time.monotonic() - started < 10
        assert put(waiting, "held", 10, 5)  # its reservation was dropped: ours to fetch
    finally:
        if p.is_alive():
            p.kill()


def test_a_reader_closing_ends_the_wait_at_once(tmp_path: Path) -> None:
    import threading
    import time

    fetching = DiskCache(tmp_path, max_bytes=1000)  # alive, and never filling
    fetching.reserve([("slow", "s3://b/x", 5, 5)], now=0)
    closed = threading.Event()
    threading.Timer(0.1, closed.set).start()
    started = time.monotonic()
    assert DiskCache(tmp_path, max_bytes=1000).await_entries(
        [("slow", 5)], seconds=60, stop=closed.is_set) == [None]
    assert 0.05 < time.monotonic() - started < 5
    assert fetching.summary().reserved == 1  # a wait that was stopped marks no one stalled


def test_opening_a_new_folder_tries_again_when_sqlite_says_locked() -> None:
    """SQLite answers "database is locked" at once (no wait) to a connection that asks for
    WAL mode while another process does the same on a new index: the open tries again
    instead of failing (one of three processes opening a new folder at once failed so)."""
    import sqlite3

    from shardfeed.storage.disk_cache import wal_mode

    class Contended:
        def __init__(self, refusals: int) -> None:
            self.refusals, self.calls = refusals, 0

        def execute(self, sql: str) -> None:
            self.calls += 1
            if self.calls <= self.refusals:
                raise sqlite3.OperationalError("database is locked")

    conn = Contended(3)
    wal_mode(conn, seconds=5.0)  # type: ignore[arg-type]
    assert conn.calls == 4
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        wal_mode(Contended(10**9), seconds=0.05)  # type: ignore[arg-type]
