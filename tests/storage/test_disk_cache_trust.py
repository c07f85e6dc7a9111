"""The disk cache serves an entry only under its own key, reads only its own files, and steps
aside on a full disk (reads go on; it says so once)."""

from __future__ import annotations

import errno
import os
import shutil
import sqlite3
import warnings
from pathlib import Path

import pytest

from shardfeed.storage import cache_entries
from shardfeed.storage.cache_entries import EntryFiles
from shardfeed.storage.disk_cache import DiskCache


def value(key: str) -> bytes:
    return key.encode() * 25  # 100 bytes for a four-letter key: every entry of one size


def fill(cache: DiskCache, keys: list[str]) -> None:
    assert cache.put_many([(k, "s3://b/shard", value(k), 5) for k in keys]) == len(keys)


def entry(folder: Path, key: str) -> Path:
    return folder / "data" / key[:2] / f"{key}.rec"


def test_an_entry_copied_renamed_or_linked_to_another_key_is_a_miss(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path, max_bytes=10_000)
    keys = ["aaa1", "aaa2", "bbb1", "bbb2", "ccc1", "ccc2"]
    fill(cache, keys)
    shutil.copyfile(entry(tmp_path, "aaa1"), entry(tmp_path, "aaa2"))  # copied over
    os.replace(entry(tmp_path, "bbb1"), entry(tmp_path, "bbb2"))  # renamed over
    entry(tmp_path, "ccc1").unlink()
    entry(tmp_path, "ccc1").symlink_to(entry(tmp_path, "ccc2"))  # a link to another
    got = cache.get_many(keys)
    assert got == [value("aaa1"), None, None, None, None, value("ccc2")]
    assert cache.counters.corrupt == 3  # bbb1 is gone, not damaged
    assert not entry(tmp_path, "ccc1").is_symlink() and entry(tmp_path, "ccc2").exists()
    fill(cache, ["aaa2", "bbb1", "bbb2", "ccc1"])  # fetched again, kept again
    assert cache.get_many(keys) == [value(k) for k in keys]


def test_links_are_not_followed_even_to_a_sound_entry(tmp_path: Path) -> None:
    """A link to a file outside the cache is not read, even when that file is a sound entry
    of the very key (the cache reads its own files only); nor is a linked folder or a FIFO."""
    cache = DiskCache(tmp_path / "c", max_bytes=10_000)
    fill(cache, ["abc1", "xyz1"])
    outside = tmp_path / "elsewhere"
    planted = EntryFiles(outside / "data", secret=cache._files.secret)  # even the same key
    outside.mkdir()
    planted.prepare()
    temp = os.open(outside, os.O_RDONLY)
    planted.write("abc1", value("abc1"), temp=temp)
    os.close(temp)
    entry(tmp_path / "c", "abc1").unlink()
    entry(tmp_path / "c", "abc1").symlink_to(entry(outside, "abc1"))
    linked = tmp_path / "c" / "data" / "xy"
    os.replace(linked, outside / "data" / "xy")
    linked.symlink_to(outside / "data" / "xy", target_is_directory=True)
    assert cache.get_many(["abc1", "xyz1"]) == [None, None]
    assert cache.counters.corrupt == 2
    assert entry(outside, "abc1").exists() and entry(outside, "xyz1").exists()  # untouched
    assert not linked.is_symlink()
    fill(cache, ["abc1"])
    fifo = entry(tmp_path / "c", "abc1")
    fifo.unlink()
    os.mkfifo(fifo)  # opening it for reading would wait for a writer
    assert cache.get_many(["abc1"]) == [None]
    assert not fifo.exists()


def test_entries_of_the_older_format_are_dropped_when_opened(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path, max_bytes=10_000)
    fill(cache, ["old1", "old2"])
    cache.close()
    db = sqlite3.connect(tmp_path / "index.sqlite3")
    db.execute("UPDATE meta SET value=1 WHERE name='format'")  # as the first format left it
    db.commit()
    db.close()
    again = DiskCache(tmp_path, max_bytes=10_000)
    assert again.summary().entries == 0 and not list((tmp_path / "data").rglob("*.rec"))
    assert again.get_many(["old1"]) == [None]
    fill(again, ["old1"])
    assert DiskCache(tmp_path, max_bytes=10_000).get_many(["old1"]) == [value("old1")]


def _no_space(fd: int, data: object) -> int:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_full_disk_under_the_entries_sets_the_cache_aside_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = DiskCache(tmp_path, max_bytes=10_000)
    fill(cache, ["kep1"])
    monkeypatch.setattr(cache_entries.os, "write", _no_space)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kept = [cache.put_many([(k, "s3://b/shard", value(k), 5)]) for k in ("new1", "new2")]
    assert kept == [0, 0]
    assert len(caught) == 1 and caught[0].category is RuntimeWarning
    assert "full disk" in str(caught[0].message) and str(tmp_path) in str(caught[0].message)
    assert cache.counters.stepped_aside == 1
    assert cache.get_many(["kep1", "new1"]) == [value("kep1"), None]  # what it held: read
    summary = cache.summary()
    assert (summary.entries, summary.reserved) == (1, 0)  # nothing half-written kept
    assert [p.name for p in (tmp_path / "data").rglob("*") if p.is_file()] == ["kep1.rec"]


def test_a_full_disk_under_the_index_sets_the_cache_aside_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite's own 'database or disk is full' (a limit of pages stands in for the disk):
    no 'cannot rollback', no error; the entries it holds are still read."""
    connect = sqlite3.connect

    def small_disk(*args: object, **kwargs: object) -> sqlite3.Connection:
        conn = connect(*args, **kwargs)  # type: ignore[arg-type]
        conn.execute("PRAGMA max_page_count=12")
        return conn

    monkeypatch.setattr(sqlite3, "connect", small_disk)
    cache = DiskCache(tmp_path, max_bytes=1 << 30)
    with pytest.warns(RuntimeWarning, match="full disk") as caught:
        kept = [cache.put_many([(f"k{n:05d}", "s3://b/shard", b"x" * 100, n)])
                for n in range(400)]
    assert len(caught) == 1 and cache.counters.stepped_aside == 1
    held = sum(kept)
    assert 0 < held < 400 and kept == [1] * held + [0] * (400 - held)
    assert cache.get_many([f"k{n:05d}" for n in range(held)]) == [b"x" * 100] * held
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once: nothing more
        assert cache.get_many(["k00399"], next_use=[9]) == [None]
        assert cache.put_many([("k99999", "s3://b/shard", b"y", 1)]) == 0


def test_a_cache_opened_on_a_full_disk_steps_aside_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_space(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "mkdir", no_space)
    with pytest.warns(RuntimeWarning, match="full disk"):
        cache = DiskCache(tmp_path / "new", max_bytes=1000)
    assert cache.get_many(["abcd"]) == [None]
    assert cache.put_many([("abcd", "s3://b/shard", value("abcd"), 5)]) == 0
