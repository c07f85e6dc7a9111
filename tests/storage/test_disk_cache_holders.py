"""Holders of a shared cache: a reservation names a lock its process keeps, never a pid. A
holder that died (killed mid-write included) has its reservations and temp files removed by
the next process that looks; one that is stopped holds a waiter up to its deadline once;
rows that name no live holder (forged, pid 1, the reader's own pid) are never waited on.
The other processes are real ones (subprocesses, a fork); no wait is bounded by pytest's
timeout."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from shardfeed.storage.disk_cache import DiskCache

MiB = 1 << 20

WRITER = r"""
import os, signal, sys
from shardfeed.storage import cache_entries
from shardfeed.storage.disk_cache import DiskCache
folder, how, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
cache = DiskCache(folder, max_bytes=16 << 20)
assert cache.reserve([("big", "s3://b/x", size, 0)], now=0) == [True]
real, calls = os.write, [0]
def write(fd, data):
    calls[0] += 1
    if calls[0] == 3:  # the header and 4 MiB of the bytes are out: the process is stopped here
        os.kill(os.getpid(), signal.SIGKILL if how == "kill" else signal.SIGSTOP)
    return real(fd, bytes(data[: 4 << 20]))
cache_entries.os.write = write
cache.fill("big", b"x" * size)
"""

RESERVER = r"""
import os, signal, sys
from shardfeed.storage.disk_cache import DiskCache
folder = sys.argv[1]
cache = DiskCache(folder, max_bytes=1000)
assert cache.reserve([("k1", "s3://b/x", 5, 5), ("k2", "s3://b/x", 5, 5)], now=0) == [True] * 2
os.kill(os.getpid(), signal.SIGSTOP)  # stopped holding both; continued, it fills them
cache.fill("k1", b"one!!")
cache.fill("k2", b"two!!")
cache.close()
"""


def leftovers(folder: Path) -> list[Path]:
    """Files in the folder that are neither the index, the key, a lock file nor an entry."""
    out = []
    for path in folder.rglob("*"):
        if not path.is_file() or path.parent.name == "locks":
            continue
        if path.name.startswith("index.sqlite3") or path.name == "key":
            continue
        if path.name.endswith(".rec") and path.parent.parent.name == "data":
            continue
        out.append(path)
    return out


@contextmanager
def writer_stopped_mid_write(folder: Path, how: str) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(folder), how, str(10 * MiB)])
    try:
        _, status = os.waitpid(proc.pid, os.WUNTRACED)
        if how == "kill":
            proc.returncode = -signal.SIGKILL
            assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        else:
            assert os.WIFSTOPPED(status)
        yield proc
    finally:
        if proc.returncode is None:
            proc.kill()
            proc.wait(30)


def test_temp_files_of_a_writer_killed_mid_write_are_swept_by_the_next_process(
    tmp_path: Path
) -> None:
    with writer_stopped_mid_write(tmp_path, "kill"):
        pass
    left = leftovers(tmp_path)
    assert len(left) == 1 and left[0].stat().st_size >= 4 * MiB  # 4 MiB of 10 written
    cache = DiskCache(tmp_path, max_bytes=16 * MiB)  # the next process opening the folder
    assert leftovers(tmp_path) == []
    summary = cache.summary()
    assert (summary.entries, summary.reserved, summary.temp_bytes) == (0, 0, 0)
    assert cache.put_many([("full", "s3://b/y", b"y" * (16 * MiB), 1)]) == 1  # all its room


def test_temp_files_of_a_stopped_writer_count_until_it_ends(tmp_path: Path) -> None:
    with writer_stopped_mid_write(tmp_path, "stop") as writer:
        cache = DiskCache(tmp_path, max_bytes=16 * MiB)
        summary = cache.summary()
        assert summary.reserved == 1 and summary.temp_bytes >= 4 * MiB
        # 10 MiB reserved (its temp file on the way): 7 MiB more do not fit
        assert cache.put_many([("more", "s3://b/y", b"y" * (7 * MiB), 5)]) == 0
        writer.kill()
        writer.wait(30)
        # the writer is gone: whoever looks next drops what it held
        assert cache.await_entries([("big", 10 * MiB)], seconds=30) == [None]
        assert leftovers(tmp_path) == []
        assert cache.summary().temp_bytes == 0
        assert cache.put_many([("more", "s3://b/y", b"y" * (7 * MiB), 5)]) == 1


def test_a_stopped_holder_holds_a_waiter_up_to_its_deadline_once(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", RESERVER, str(tmp_path)])
    try:
        _, status = os.waitpid(proc.pid, os.WUNTRACED)
        assert os.WIFSTOPPED(status)
        waiting = DiskCache(tmp_path, max_bytes=1000)
        assert waiting.summary().reserved == 2  # alive, if stopped: kept
        started = time.monotonic()
        assert waiting.await_entries([("k1", 5)], seconds=0.5) == [None]  # the caller fetches
        assert 0.45 < time.monotonic() - started < 5
        started = time.monotonic()
        assert waiting.await_entries([("k2", 5)], seconds=30) == [None]  # not waited again
        assert time.monotonic() - started < 2
        assert waiting.summary().reserved == 2  # its reservations (and temp files) still count
        os.kill(proc.pid, signal.SIGCONT)
        assert proc.wait(60) == 0
        assert waiting.get_many(["k1", "k2"]) == [b"one!!", b"two!!"]
        db = sqlite3.connect(tmp_path / "index.sqlite3")
        assert db.execute("SELECT COUNT(*) FROM stalled").fetchone()[0] == 0  # it moved again
        db.close()
    finally:
        if proc.returncode is None:
            proc.kill()
            proc.wait(30)


def forge(folder: Path, rows: list[tuple[str, int]], holder: str | None = None) -> None:
    """Reservations written into the index by hand: ``(key, pid)`` each (an older
    shardfeed's rows, or a forger's), naming ``holder`` where given."""
    db = sqlite3.connect(folder / "index.sqlite3")
    for key, pid in rows:
        if holder is None:
            db.execute("INSERT INTO entries (key, url, size, next_use, seq, ready, pid) "
                       "VALUES (?, 's3://b/x', 5, 5, 0, 0, ?)", (key, pid))
        else:
            db.execute("INSERT INTO entries (key, url, size, next_use, seq, ready, pid, holder) "
                       "VALUES (?, 's3://b/x', 5, 5, 0, 0, ?, ?)", (key, pid, holder))
    db.commit()
    db.close()


def test_rows_under_pid_1_or_the_readers_own_pid_are_not_waited_for(tmp_path: Path) -> None:
    """pid 1 is alive in every container, and the reader's own pid is itself: neither says
    anything of the process that reserved (here: none)."""
    cache = DiskCache(tmp_path, max_bytes=1000)
    forge(tmp_path, [("p1", 1), ("me", os.getpid())])
    started = time.monotonic()
    assert cache.await_entries([("p1", 5), ("me", 5)], seconds=5) == [None, None]
    assert time.monotonic() - started < 2
    assert cache.summary().reserved == 0
    assert cache.put_many([("p1", "s3://b/x", b"fetch", 5)]) == 1  # ours to fetch now


@pytest.mark.parametrize("holder", ["", "1", "../../../outside", "0123456789abcdef"])
def test_rows_naming_no_live_holder_are_dropped_when_opened_and_name_no_path(
    tmp_path: Path, holder: str
) -> None:
    DiskCache(tmp_path / "c", max_bytes=1000).close()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_bytes(b"mine")
    (outside / "keep.lock").write_bytes(b"mine")
    forge(tmp_path / "c", [("k", 1)], holder)
    cache = DiskCache(tmp_path / "c", max_bytes=1000)
    assert cache.summary().reserved == 0
    forge(tmp_path / "c", [("k", 1)], holder)
    assert cache.await_entries([("k", 5)], seconds=5) == [None]
    assert cache.summary().reserved == 0
    assert sorted(p.name for p in outside.iterdir()) == ["keep", "keep.lock"]


def test_another_cache_of_this_process_is_alive_until_it_closes(tmp_path: Path) -> None:
    other = DiskCache(tmp_path, max_bytes=1000)  # another Dataset of this process
    assert other.reserve([("k", "s3://b/x", 5, 5)], now=0) == [True]
    waiting = DiskCache(tmp_path, max_bytes=1000)
    assert waiting.summary().reserved == 1  # its holder lives: kept
    started = time.monotonic()
    assert waiting.await_entries([("k", 5)], seconds=0.3) == [None]
    assert time.monotonic() - started >= 0.25
    other.close()  # gives its reservations up, and its lock file and temp folder
    assert waiting.summary().reserved == 0
    assert sorted(p.name for p in (tmp_path / "locks").iterdir()) == []
    assert other.put_many([("z", "s3://b/x", b"after", 5)]) == 0  # closed: keeps nothing
    assert other.get_many(["k"]) == [None]


def _reserve_in_child(cache: DiskCache) -> None:
    assert cache.reserve([("child", "s3://b/x", 5, 5)], now=0) == [True]
    os._exit(0)  # the child dies holding it; its parent lives on


def test_a_forked_child_holds_its_own_reservations(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path, max_bytes=1000)
    assert cache.reserve([("parent", "s3://b/x", 5, 5)], now=0) == [True]
    child = multiprocessing.get_context("fork").Process(target=_reserve_in_child,
                                                        args=(cache,))
    child.start()
    child.join(60)
    assert child.exitcode == 0
    looking = DiskCache(tmp_path, max_bytes=1000)
    started = time.monotonic()
    assert looking.await_entries([("child", 5)], seconds=30) == [None]
    assert time.monotonic() - started < 2  # the child's holder died with it
    assert looking.summary().reserved == 1  # the parent's still held: it lives
    assert cache.fill("parent", b"bytes")
    assert looking.get_many(["parent"]) == [b"bytes"]
