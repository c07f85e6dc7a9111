"""Bare shards (no manifest) in the disk cache are keyed by what their store says changes:
over HTTP, Last-Modified; a server that says nothing gets no caching, and a warning."""

from __future__ import annotations

import email.utils
import http.server
import os
import re
import threading
import warnings
from pathlib import Path

import pytest

from shardfeed import Dataset
from shardfeed.format.writer import ShardWriter
from shardfeed.storage.files import version_of


class FolderServer:
    """Serves a local folder over HTTP on 127.0.0.1 (HEAD, GET, one byte range), with
    Last-Modified when ``validators``; counts the GETs of shard bytes."""

    def __init__(self, root: Path, *, validators: bool) -> None:
        self.gets = 0
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_HEAD(self) -> None:
                self._answer(body=False)

            def do_GET(self) -> None:
                self._answer(body=True)

            def _answer(self, *, body: bool) -> None:
                path = root / self.path.lstrip("/")
                if not path.is_file():
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                data = path.read_bytes()
                found = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
                status, part = 200, data
                if found:
                    start = int(found[1])
                    end = int(found[2]) if found[2] else len(data) - 1
                    status, part = 206, data[start : end + 1]
                self.send_response(status)
                self.send_header("Content-Length", str(len(part)))
                self.send_header("Accept-Ranges", "bytes")
                if found:
                    self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
                if validators:
                    self.send_header("Last-Modified", email.utils.formatdate(
                        path.stat().st_mtime, usegmt=True))
                self.end_headers()
                if body:
                    owner.gets += path.suffix == ".tfrecord"
                    self.wfile.write(part)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/{name}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def write_shard(path: Path, prefix: str, n: int = 20) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with ShardWriter(str(path)) as writer:
        for i in range(n):
            writer.write_example({"index": [i], "name": f"{prefix}{i:03d}".encode()})


def names(ds: Dataset) -> list[bytes]:
    return [r["name"] for r in ds.read_many(range(len(ds)))]


def test_a_shard_rewritten_on_an_http_server_is_read_anew(tmp_path: Path) -> None:
    site = tmp_path / "site"
    shard = site / "part-000.tfrecord"
    write_shard(shard, "a")
    os.utime(shard, (1_700_000_000, 1_700_000_000))
    server = FolderServer(site, validators=True)
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
    server = FolderServer(site, validators=False)
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
