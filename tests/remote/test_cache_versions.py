"""Bare shards (no manifest) in the disk cache are keyed by what their store says changes:
over HTTP, Last-Modified; a server that says nothing gets no caching, and a warning."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest
from folder_server import FolderServer
from folder_server import write_shard as shared_write_shard

from shardfeed import Dataset
from shardfeed.storage.files import version_of


def write_shard(path: Path, prefix: str, n: int = 20) -> None:
    shared_write_shard(path, prefix, n)


def names(ds: Dataset) -> list[bytes]:
    return [r["name"] for r in ds.read_many(range(len(ds)))]


def test_a_shard_rewritten_on_an_http_server_is_read_anew(tmp_path: Path) -> None:
    site = tmp_path / "site"
    shard = site / "part-000.tfrecord"
    write_shard(shard, "a")
    os.utime(shard, (1_700_000_000, 1_700_000_000))
    server = FolderServer(site, last_modified=True)
    try:
        url, cache = server.url("part-000.tfrecord"), tmp_path / "cache"
        with Dataset([url], cache_dir=cache) as ds:
            assert names(ds)[0] == b"a000"
        with Dataset([url], cache_dir=cache) as ds:
            before = server.gets
            assert names(ds)[0] == b"a000" and server.gets == before  # from the cache
        write_shard(shard, "b")  # rewritten in place: same size, a later Last-Modified
        os.utime(shard, (1_700_000_100, 1_700_000_100))
        with Dataset([url], cache_dir=cache) as ds:
            assert names(ds) == [f"b{i:03d}".encode() for i in range(20)]
    finally:
        server.close()


def test_a_server_that_names_no_version_gets_no_caching_and_a_warning(tmp_path: Path) -> None:
    site = tmp_path / "site"
    write_shard(site / "part-000.tfrecord", "a")
    server = FolderServer(site, last_modified=False)
    try:
        url, cache = server.url("part-000.tfrecord"), tmp_path / "cache"
        with pytest.warns(RuntimeWarning, match="never from the disk cache"):
            ds = Dataset([url], cache_dir=cache)
        with ds, warnings.catch_warnings():
            warnings.simplefilter("error")
            assert names(ds)[0] == b"a000"
            before = server.gets
            assert names(ds)[0] == b"a000" and server.gets > before  # from the server again
            assert ds.storage_stats()["cache_admitted"] == 0
    finally:
        server.close()


def test_the_version_is_what_names_the_content_else_the_time_written() -> None:
    s3 = {"ETag": '"5d41"', "LastModified": "2026-01-01", "size": 5}
    assert version_of(s3) == 'ETag="5d41"'
    assert version_of({"Last-Modified": "Tue, 01 Jan 2030 00:00:00 GMT"}) is not None
    assert version_of({"generation": 17, "updated": "x"}) == "generation=17"
    assert version_of({"size": 5, "name": "b/x"}) is None
