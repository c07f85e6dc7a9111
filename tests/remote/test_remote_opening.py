"""What opening and reading a dataset on object storage costs in requests (moto on 127.0.0.1)."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from shardfeed import Dataset, StorageError
from shardfeed.storage import files


def _log(server: Any) -> list[tuple[str, str]]:
    return [(r.method, r.path.rsplit("/", 1)[-1]) for r in server.requests()]


def test_opening_a_dataset_folder_is_one_get(
    s3_server: Any, records_dataset: Callable[[int, int], Path]
) -> None:
    """One GET for the manifest at open; on first use one GET per index, one HEAD per shard
    (its size, checked against the index), then only ranged GETs of shard bytes."""
    url = s3_server.upload_folder(records_dataset(40, 2))
    s3_server.clear_log()
    with Dataset(url) as ds:
        assert _log(s3_server) == [("GET", "shardfeed.json")]
        s3_server.clear_log()
        ds.read_many(range(40))
        first = _log(s3_server)
        s3_server.clear_log()
        ds.read_many(range(40))
        again = _log(s3_server)
    shards = ("part-000.tfrecord", "part-001.tfrecord")
    for shard in shards:
        assert first.count(("GET", shard + ".idx.npy")) == 1
        assert first.count(("HEAD", shard)) == 1
    others = [r for r in first if not r[1].startswith(shards)]
    assert others == []  # no LIST, no text index, no second manifest read
    assert sorted(set(again)) == [("GET", s) for s in shards]  # indexes and sizes kept


def test_trailing_slash_and_manifest_url_cost_the_same(
    s3_server: Any, records_dataset: Callable[[int, int], Path]
) -> None:
    url = s3_server.upload_folder(records_dataset(20, 2))
    for source in (url + "/", url + "/shardfeed.json"):
        s3_server.clear_log()
        with Dataset(source) as ds:
            assert len(ds) == 20
            assert _log(s3_server) == [("GET", "shardfeed.json")]


def test_folder_without_manifest_is_one_get_and_one_listing(
    s3_server: Any, records_dataset: Callable[[int, int], Path], tmp_path: Path
) -> None:
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("part-000.tfrecord", "part-001.tfrecord"):
        shutil.copy(records_dataset(20, 2) / name, bare / name)
    url = s3_server.upload_folder(bare)
    s3_server.clear_log()
    with Dataset(url) as ds:
        opened = _log(s3_server)
        assert len(ds) == 20 and ds.read_many([19])[0]["index"].tolist() == [19]
    bucket = url.removeprefix("s3://").split("/")[0]
    # the manifest's GET (not found), one LIST (a GET of the bucket), each file's indexes
    # (not found), then a scan of each file: its index is built in memory (obstore sizes
    # each file with a HEAD first)
    heads = [name for method, name in opened if method == "HEAD"]
    assert heads == ["part-000.tfrecord", "part-001.tfrecord"]
    assert [r for r in opened if r[0] == "GET"] == [("GET", "shardfeed.json"), ("GET", bucket),
                      ("GET", "part-000.tfrecord.idx.npy"), ("GET", "part-000.tfrecord.idx"),
                      ("GET", "part-001.tfrecord.idx.npy"), ("GET", "part-001.tfrecord.idx"),
                      ("GET", "part-000.tfrecord"), ("GET", "part-001.tfrecord")]


def test_spark_output_folder_on_object_storage(
    s3_server: Any, records_dataset: Callable[[int, int], Path], tmp_path: Path
) -> None:
    """A Spark/Hadoop job's output: part-r-NNNNN shards beside _SUCCESS and .crc files."""
    source = records_dataset(20, 2)
    spark = tmp_path / "spark"
    spark.mkdir()
    shutil.copy(source / "part-000.tfrecord", spark / "part-r-00000")
    shutil.copy(source / "part-001.tfrecord", spark / "part-r-00001")
    (spark / "_SUCCESS").write_bytes(b"")
    (spark / ".part-r-00000.crc").write_bytes(b"crc")
    url = s3_server.upload_folder(spark)
    with Dataset(url) as ds:
        assert [u.rsplit("/", 1)[-1] for u in ds.shard_urls] == ["part-r-00000", "part-r-00001"]
        assert [int(r["index"][0]) for r in ds] == list(range(20))


def test_missing_remote_folder_names_the_url(s3_server: Any) -> None:
    url = f"s3://{s3_server.new_bucket()}/nothing-here"
    with pytest.raises(StorageError, match="nothing-here.*does not exist"):
        Dataset(url)


def test_read_bytes_is_one_get(s3_server: Any) -> None:
    base = f"s3://{s3_server.new_bucket()}"
    files.write_bytes_atomic(base + "/a.bin", b"abc" * 1000)
    files.write_bytes_atomic(base + "/empty.bin", b"")
    s3_server.clear_log()
    assert files.read_bytes(base + "/a.bin") == b"abc" * 1000
    assert [r.method for r in s3_server.requests()] == ["GET"]
    assert files.read_bytes(base + "/empty.bin") == b""
    s3_server.clear_log()
    assert files.read_if_exists(base + "/missing.bin") is None
    assert [r.method for r in s3_server.requests()] == ["GET"]
    assert files.read_if_exists(base + "/a.bin") == b"abc" * 1000


def test_read_many_reads_remote_shards_at_the_same_time(
    s3_server: Any, records_dataset: Callable[[int, int], Path]
) -> None:
    """One record from each of 8 shards: 8 GETs in flight together, not one after another."""
    url = s3_server.upload_folder(records_dataset(64, 8))
    with Dataset(url, source_options={"max_concurrency": 8}) as ds:
        ds.read_many(range(0, 64, 8))  # indexes and sizes loaded
        wanted = [8 * k + 3 for k in range(8)]
        with s3_server.gate_ranged_gets(8) as gate:
            records = ds.read_many(wanted)
        assert [int(r["index"][0]) for r in records] == wanted
        # 8 at once unless the machine is very busy; one after another never reaches 2
        assert gate.most_waiting >= 2, "the shards were read one after another"
        assert ds.storage_stats()["requests"] == 16


def test_source_options_reach_the_shards(
    s3_server: Any, records_dataset: Callable[[int, int], Path]
) -> None:
    """``coalesce_gap_bytes=-1`` keeps neighbouring records apart: one GET each."""
    import pickle

    from shardfeed.dataset.reading import ReadOptions

    url = s3_server.upload_folder(records_dataset(40, 2))
    separate = ReadOptions(coalesce_gap_bytes=0, max_read_bytes=1)  # one range a record
    for options, gets in (({}, 1), ({"coalesce_gap_bytes": -1}, 5)):
        with Dataset(url, read_options=separate, source_options=options) as ds:
            for copy in (ds, pickle.loads(pickle.dumps(ds))):
                copy.read_many([0])
                s3_server.clear_log()
                assert len(copy.read_many(range(1, 6))) == 5
                assert len(s3_server.requests("GET")) == gets
                copy.close()
