"""The disk cache serves only what its key names, over S3-compatible storage (moto on
127.0.0.1): entries swapped, copied or linked in the cache folder are fetched again, never
served as another record; bare shards rewritten in place are read anew."""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shardfeed import Dataset, Loader
from shardfeed.format.writer import ShardWriter
from shardfeed.storage.disk_cache import DiskCache

OPTIONS = {"batch_size": 8, "shuffle": True, "seed": 3, "transform": None, "num_threads": 2,
           "rank": 0, "world_size": 1}


def stream(loader: Loader) -> list[tuple[list[int], list[bytes]]]:
    return [(b["index"].tolist(), list(b["name"])) for b in loader]


def data_gets(server: Any) -> int:
    """GETs of shard bytes (not the manifest, indexes or listings)."""
    return sum(1 for r in server.requests("GET") if r.path.endswith(".tfrecord"))


def tamper(cache: Path) -> list[Path]:
    """As an attacker (or a careless copy) would: among entry files of one size, swap two,
    copy a third over a fourth, and make a fifth a symbolic link to a sixth. The entries
    changed (each now holds another record's bytes, whole and with a sound CRC32C)."""
    by_size: dict[int, list[Path]] = defaultdict(list)
    for path in sorted((cache / "data").rglob("*.rec")):
        by_size[path.stat().st_size].append(path)
    group = max(by_size.values(), key=len)
    assert len(group) >= 6
    a, b, c, d, e, f = group[:6]
    blob_a, blob_b = a.read_bytes(), b.read_bytes()
    a.write_bytes(blob_b)
    b.write_bytes(blob_a)
    d.write_bytes(c.read_bytes())
    e.unlink()
    e.symlink_to(f)
    return [a, b, d, e]


def test_swapped_copied_and_linked_entries_are_fetched_again_not_served(
    s3_server: Any, records_dataset: Callable[[int, int], Path], tmp_path: Path
) -> None:
    folder = records_dataset(256, 4)
    url = s3_server.upload_folder(folder)
    with Dataset(str(folder)) as local, Loader(local, **OPTIONS) as loader:
        expected = [stream(loader) for _ in range(2)]
    cache = tmp_path / "cache"
    with Dataset(url, cache_dir=cache) as ds, Loader(ds, **OPTIONS) as loader:
        assert stream(loader) == expected[0]
    changed = tamper(cache)
    s3_server.clear_log()
    with Dataset(url, cache_dir=cache) as ds, Loader(ds, **OPTIONS) as loader:
        assert [stream(loader) for _ in range(2)] == expected  # every record its own
        stats = ds.storage_stats()
    assert stats["cache_corrupt"] == len(changed)
    # the changed entries only: read when found changed, and by the next epoch's chunk that
    # keeps them again
    assert 1 <= data_gets(s3_server) <= 2 * len(changed)
    assert not [p for p in (cache / "data").rglob("*") if p.is_symlink()]
    # fetched again and written back when a chunk next keeps them (a chunk scheduled before
    # the change was found thought them held): then every record is read from the cache
    with Dataset(url, cache_dir=cache) as ds, Loader(ds, **OPTIONS) as loader:
        assert stream(loader) == expected[0]
        s3_server.clear_log()
        assert stream(loader) == expected[1]
    assert data_gets(s3_server) == 0
    assert DiskCache(cache, max_bytes=None).verify() == []


def test_plain_reads_of_swapped_entries_fetch_their_own_records(
    s3_server: Any, records_dataset: Callable[[int, int], Path], tmp_path: Path
) -> None:
    folder = records_dataset(256, 4)
    url = s3_server.upload_folder(folder)
    with Dataset(str(folder)) as local:
        expected = [local[i] for i in range(len(local))]
    cache = tmp_path / "cache"
    with Dataset(url, cache_dir=cache) as ds:
        assert ds.read_many(range(256)) == expected
    changed = tamper(cache)
    s3_server.clear_log()
    with Dataset(url, cache_dir=cache) as ds:
        assert [ds[i] for i in range(256)] == expected
        assert ds.storage_stats()["cache_corrupt"] == len(changed)
        assert 1 <= data_gets(s3_server) <= len(changed)
        s3_server.clear_log()
        assert ds.read_many(range(256)) == expected  # written back when read
    assert data_gets(s3_server) == 0
    assert os.path.exists(cache / "data") and DiskCache(cache, max_bytes=None).verify() == []


def write_named(folder: Path, n: int, prefix: str) -> Path:
    """Two bare shards (indexes, no manifest) of ``n`` records named ``<prefix><i>``."""
    folder.mkdir(parents=True)
    for s in range(2):
        with ShardWriter(str(folder / f"part-{s:03d}.tfrecord")) as writer:
            for i in range(s * n // 2, (s + 1) * n // 2):
                writer.write_example({"index": [i], "name": f"{prefix}{i:03d}".encode()})
    return folder


def test_a_bare_shard_rewritten_in_place_with_its_size_is_read_anew(
    s3_server: Any, tmp_path: Path
) -> None:
    old = write_named(tmp_path / "old", 64, "a")
    new = write_named(tmp_path / "new", 64, "b")  # the same sizes and offsets, other bytes
    assert (old / "part-000.tfrecord").stat().st_size == (new / "part-000.tfrecord").stat().st_size
    url = s3_server.upload_folder(old)
    cache = tmp_path / "cache"
    with Dataset(url, cache_dir=cache) as ds, Loader(ds, **OPTIONS) as loader:
        assert ds.read_many(range(64))[0]["name"] == b"a000"
        stream(loader)  # every record now in the cache
    s3_server.filesystem().put_file(str(new / "part-000.tfrecord"), url[5:] + "/part-000.tfrecord")
    s3_server.clear_log()
    names = [f"b{i:03d}".encode() for i in range(32)] + [f"a{i:03d}".encode() for i in range(32, 64)]
    with Dataset(url, cache_dir=cache) as ds:
        assert [r["name"] for r in ds.read_many(range(64))] == names
        with Loader(ds, **OPTIONS) as loader:
            assert sorted(n for _, batch in stream(loader) for n in batch) == sorted(names)
    gets = {r.path.rsplit("/", 1)[-1] for r in s3_server.requests("GET")
            if r.path.endswith(".tfrecord")}
    assert gets == {"part-000.tfrecord"}  # the shard left alone is read from the cache
    assert DiskCache(cache, max_bytes=None).verify() == []
