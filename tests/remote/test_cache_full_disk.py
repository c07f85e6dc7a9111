"""A full disk under the disk cache, over S3-compatible storage (moto on 127.0.0.1): records
are read from storage as if there were no cache, and the cache says so once."""

from __future__ import annotations

import errno
import os
import sqlite3
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from shardfeed import Dataset, Loader

OPTIONS = {"batch_size": 8, "shuffle": True, "seed": 3, "transform": None, "num_threads": 2,
           "rank": 0, "world_size": 1}

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"),
                                reason="finds the files written through /proc/self/fd")


def full_entries(folder: Path, monkeypatch: pytest.MonkeyPatch, *, room: int) -> None:
    """The disk under ``folder`` takes ``room`` bytes more, then fails with ENOSPC."""
    write = os.write
    used = [0]

    def limited(fd: int, data: Any) -> int:
        try:
            where = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            where = ""
        if where.startswith(str(folder)):
            if used[0] + len(data) > room:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), where)
            used[0] += len(data)
        return write(fd, data)

    monkeypatch.setattr(os, "write", limited)


def full_index(folder: Path, monkeypatch: pytest.MonkeyPatch, *, pages: int) -> None:
    """The cache's SQLite index can grow to ``pages`` pages, then fails with SQLITE_FULL
    ('database or disk is full'), as on a full disk."""
    connect = sqlite3.connect

    def small(database: Any, *args: Any, **kwargs: Any) -> sqlite3.Connection:
        conn = connect(database, *args, **kwargs)
        if str(database).startswith(str(folder)):
            conn.execute(f"PRAGMA max_page_count={pages}")
        return conn

    monkeypatch.setattr(sqlite3, "connect", small)


@pytest.mark.parametrize("full", ["entries", "index"])
def test_reads_go_on_from_storage_when_the_cache_disk_fills(
    full: str, s3_server: Any, records_dataset: Callable[[int, int], Path], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    folder = records_dataset(256, 4)
    url = s3_server.upload_folder(folder)
    with Dataset(str(folder)) as local, Loader(local, **OPTIONS) as loader:
        expected = [local[i] for i in range(len(local))]
        epoch = [(b["index"].tolist(), list(b["name"])) for b in loader]
    cache = tmp_path / "cache"
    if full == "entries":
        full_entries(cache, monkeypatch, room=3_000)
    else:
        full_index(cache, monkeypatch, pages=8)
    with warnings.catch_warnings(record=True) as said, \
            Dataset(url, cache_dir=cache) as ds:
        warnings.simplefilter("always")  # every warning given is seen: none folded
        assert [ds[i] for i in range(128)] == expected[:128]  # plain reads
        assert ds.read_many(range(256)) == expected  # batched reads
        with Loader(ds, **OPTIONS) as loader:  # the read-ahead's fills
            assert [(b["index"].tolist(), list(b["name"])) for b in loader] == epoch
        stats = ds.storage_stats()
    told = [str(w.message) for w in said if issubclass(w.category, RuntimeWarning)]
    assert len(told) == 1 and "full disk" in told[0] and str(cache) in told[0]  # said once
    assert stats["cache_stepped_aside"] == 1
    assert 0 < stats["cache_admitted"] < 256  # it kept what fitted, then stepped aside
    assert stats["cache_hits"] > 0  # and what it kept was read
