"""A shard rewritten on object storage (same size, manifest left as it was) is never read as
its old bytes: every request asks for the version the Dataset pinned (S3 If-Match through
obstore and s3fs; HTTP If-Match, else If-Unmodified-Since) and a refusal is a
ShardChangedError; the disk cache keys records by the store's version too, is listed again
each Loader pass, and a Dataset opened after the rewrite reads the new bytes. A store with
only a modification time cannot tell two writes of one second apart: such a version is never
cached, so the bytes read are those there now."""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from folder_server import FolderServer
from folder_server import write_shard as shared_write_shard
from s3_fixture import S3Server

from shardfeed import Dataset, Loader, ShardChangedError
from shardfeed.tools.index import index_files

N = 64
SHARD = "part-000.tfrecord"


def write_shard(path: Path, prefix: str) -> None:
    shared_write_shard(path, prefix, N)


def expected(prefix: str) -> list[bytes]:
    return [f"{prefix}{i:03d}".encode() for i in range(N)]


def names(ds: Dataset) -> list[bytes]:
    return [bytes(r["name"]) for r in ds.read_many(range(len(ds)))]  # type: ignore[arg-type]


def loader_names(loader: Loader) -> list[bytes]:
    return sorted(n for batch in loader for n in batch["name"])


# -- S3 (moto) ---------------------------------------------------------------------------------


@pytest.fixture()
def on_s3(s3_server: S3Server, tmp_path: Path) -> tuple[str, bytes]:
    """A dataset (shard, index, manifest with its checksum) on the S3 server, and the bytes
    of its shard rewritten: the same size, other records."""
    folder = tmp_path / "ds"
    write_shard(folder / SHARD, "a")
    index_files(str(folder))
    write_shard(tmp_path / "new" / SHARD, "b")
    new = (tmp_path / "new" / SHARD).read_bytes()
    assert len(new) == (folder / SHARD).stat().st_size
    return s3_server.upload_folder(folder), new


def rewrite(s3_server: S3Server, url: str, data: bytes) -> None:
    fs = s3_server.filesystem()
    fs.pipe_file(f"{url.removeprefix('s3://')}/{SHARD}", data)  # the manifest is left as is
    fs.invalidate_cache()


@pytest.fixture(params=["obstore", "s3fs"])
def reader(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "s3fs":  # fsspec's road to S3, where s3fs is installed
        pytest.importorskip("s3fs")
        monkeypatch.setenv("SHARDFEED_OBSTORE", "0")
    else:
        pytest.importorskip("obstore")
    return str(request.param)


def test_a_rewritten_object_raises_on_the_next_read(
        s3_server: S3Server, on_s3: tuple[str, bytes], reader: str) -> None:
    url, new = on_s3
    with Dataset(url) as ds:
        assert names(ds) == expected("a")
        rewrite(s3_server, url, new)
        with pytest.raises(ShardChangedError, match=f"{SHARD}' changed since this Dataset "
                           "opened it") as raised:
            ds.read_many(range(N))
        assert raised.value.path.endswith(SHARD)
        refused = [r for r in s3_server.requests("GET") if r.path.endswith(SHARD)]
        assert refused  # asked of the store, which refused the old version
    with Dataset(url) as ds:
        assert names(ds) == expected("b")


def test_a_loader_with_a_disk_cache_raises_on_the_pass_after_the_rewrite(
        s3_server: S3Server, on_s3: tuple[str, bytes], tmp_path: Path) -> None:
    url, new = on_s3
    cache = tmp_path / "cache"
    with Dataset(url, cache_dir=cache) as ds, Loader(ds, batch_size=16, shuffle=True,
                                                     seed=1, transform=None) as loader:
        assert loader_names(loader) == expected("a")
        loader.set_epoch(1)
        assert loader_names(loader) == expected("a")  # from the cache
        assert ds.storage_stats()["cache_hits"] > 0
        rewrite(s3_server, url, new)
        loader.set_epoch(2)
        with pytest.raises(ShardChangedError):
            loader_names(loader)


def test_a_dataset_opened_after_the_rewrite_never_reads_the_old_records_cached(
        s3_server: S3Server, on_s3: tuple[str, bytes], tmp_path: Path) -> None:
    """The manifest still names the old checksum: the store's ETag keys the cache too."""
    url, new = on_s3
    cache = tmp_path / "cache"
    with Dataset(url, cache_dir=cache) as ds, Loader(ds, batch_size=16, seed=1,
                                                     transform=None) as loader:
        assert loader_names(loader) == expected("a")
    with Dataset(url, cache_dir=cache) as ds:
        assert ds.cached_in(cache)["records"] == N
    rewrite(s3_server, url, new)
    with Dataset(url, cache_dir=cache) as ds:
        assert ds.cached_in(cache)["records"] == 0
        assert names(ds) == expected("b")
        with Loader(ds, batch_size=16, seed=1, transform=None) as loader:
            assert loader_names(loader) == expected("b")


# -- HTTP ---------------------------------------------------------------------------------------


@pytest.fixture()
def site(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """A served folder holding one shard, and the bytes it is rewritten with beside it."""
    write_shard(tmp_path / "site" / SHARD, "a")
    write_shard(tmp_path / "new" / SHARD, "b")
    yield tmp_path / "site" / SHARD, tmp_path / "new" / SHARD


def replace(shard: Path, new: Path, *, mtime: float) -> None:
    temp = shard.with_name("replacement.tmp")
    temp.write_bytes(new.read_bytes())
    os.utime(temp, (mtime, mtime))
    os.replace(temp, shard)


@pytest.mark.parametrize("etags", [True, False])
def test_a_rewrite_on_a_web_server_raises_within_the_open_dataset(
        site: tuple[Path, Path], etags: bool) -> None:
    """The server names the old version's ETag (or its time, the new one a minute later):
    the request for it is refused."""
    shard, new = site
    then = time.time() - 3600
    os.utime(shard, (then, then))
    server = FolderServer(shard.parent, etags=etags)
    try:
        with Dataset([server.url(SHARD)]) as ds:
            assert names(ds) == expected("a")
            replace(shard, new, mtime=then + 60)
            with pytest.raises(ShardChangedError):
                ds.read_many(range(N))
            assert server.refused > 0
    finally:
        server.close()


def test_a_rewrite_within_the_second_on_a_store_of_times_only_reads_the_new_bytes(
        site: tuple[Path, Path], tmp_path: Path) -> None:
    """Last-Modified only, rewritten within the same second: no reader can tell the two
    versions apart, so the version is weak and nothing is kept under it: the records read
    after the rewrite, in the open Dataset and in one opened after with the same cache, are
    the new ones."""
    shard, new = site
    second = int(time.time())
    os.utime(shard, (second, second))
    server = FolderServer(shard.parent, etags=False)
    cache = tmp_path / "cache"
    try:
        url = server.url(SHARD)
        with pytest.warns(RuntimeWarning, match="no modification time a minute old"):
            first = Dataset([url], cache_dir=cache)
        with first, warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            assert names(first) == expected("a")
            replace(shard, new, mtime=second + 0.5)  # the same Last-Modified
            assert names(first) == expected("b")
            with Dataset([url], cache_dir=cache) as after:
                assert names(after) == expected("b")
                assert after.storage_stats()["cache_hits"] == 0
    finally:
        server.close()


def test_a_time_a_minute_old_keys_the_cache_and_a_rewrite_is_read_anew(
        site: tuple[Path, Path], tmp_path: Path) -> None:
    shard, new = site
    then = time.time() - 3600
    os.utime(shard, (then, then))
    server = FolderServer(shard.parent, etags=False)
    cache = tmp_path / "cache"
    try:
        url = server.url(SHARD)
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)  # cached: no warning
            with Dataset([url], cache_dir=cache) as ds:
                assert names(ds) == expected("a")
            with Dataset([url], cache_dir=cache) as ds:
                assert names(ds) == expected("a") and ds.storage_stats()["cache_hits"] == N
        replace(shard, new, mtime=then + 60)
        with Dataset([url], cache_dir=cache) as ds:
            assert names(ds) == expected("b")
    finally:
        server.close()


def test_a_web_server_without_listings_is_looked_at_one_head_a_shard_each_pass(
        tmp_path: Path) -> None:
    """No listing: the versions come from a HEAD of each shard (several at once), when the
    Dataset opens and when each pass starts; a shard rewritten between passes raises."""
    site = tmp_path / "site"
    then = time.time() - 3600
    for s in range(5):
        write_shard(site / f"part-{s:03d}.tfrecord", "abcde"[s])
        os.utime(site / f"part-{s:03d}.tfrecord", (then, then))
    write_shard(tmp_path / "new" / SHARD, "z")
    server = FolderServer(site, etags=True)
    try:
        urls = [server.url(f"part-{s:03d}.tfrecord") for s in range(5)]
        with Dataset(urls, cache_dir=tmp_path / "cache") as ds, Loader(
                ds, batch_size=32, shuffle=True, seed=1, transform=None) as loader:
            assert len(loader_names(loader)) == 5 * N
            loader.set_epoch(1)
            assert len(loader_names(loader)) == 5 * N
            assert ds.storage_stats()["cache_hits"] > 0
            replace(site / SHARD, tmp_path / "new" / SHARD, mtime=then)
            loader.set_epoch(2)
            with pytest.raises(ShardChangedError, match=SHARD):
                loader_names(loader)
    finally:
        server.close()
