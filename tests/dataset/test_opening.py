"""Which files of a folder are shards: TF's names, *.tfrecord, and Spark/Hadoop output."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from shardfeed import Dataset
from shardfeed.dataset.opening import _is_shard_name
from shardfeed.errors import FormatError


@pytest.mark.parametrize("name", [
    "train.tfrecord", "train.tfrecords", "x.tfrec", "train.tfrecord-00001-of-00128",
    "train-00001-of-01024", "part-00000", "part-r-00000", "part-m-00017", "part-r-00000.tfrecord",
    "part-00003-1f2e3d4c-5b6a-4789-9abc-def012345678-c000.tfrecord",
    "part-00003-1f2e3d4c-5b6a-4789-9abc-def012345678-c000", "s3://b/ds/part-r-00002",
])
def test_shard_names(name: str) -> None:
    assert _is_shard_name(name)


@pytest.mark.parametrize("name", [
    "_SUCCESS", "_committed_123", "_started_123", ".part-r-00000.crc", "part-r-00000.crc",
    ".train.tfrecord", "train.tfrecord.idx", "train.tfrecord.idx.npy", "shardfeed.json",
    "groups.npy", "train.tfrecord.tmp", "partition-0", "part-", "parts-00000", "README",
    "depart-00000",
])
def test_not_shard_names(name: str) -> None:
    assert not _is_shard_name(name)


def test_spark_output_folder(tf_fixtures: Path, tmp_path: Path) -> None:
    """A folder written by a Hadoop/Spark job opens as its part files, in name order."""
    folder = tmp_path / "spark-out"
    folder.mkdir()
    shutil.copy(tf_fixtures / "second.tfrecord", folder / "part-r-00001")
    shutil.copy(tf_fixtures / "mixed.tfrecord", folder / "part-r-00000")
    (folder / "_SUCCESS").write_bytes(b"")
    (folder / ".part-r-00000.crc").write_bytes(b"\x00" * 12)
    (folder / ".part-r-00001.crc").write_bytes(b"\x00" * 12)
    with Dataset(folder) as ds, Dataset([tf_fixtures / "mixed.tfrecord",
                                         tf_fixtures / "second.tfrecord"]) as expected:
        assert [Path(u).name for u in ds.shard_urls] == ["part-r-00000", "part-r-00001"]
        assert len(ds) == len(expected)
        assert ds.read_payloads(range(len(ds))) == expected.read_payloads(range(len(ds)))


def test_folder_of_bookkeeping_only_names_what_it_holds(tmp_path: Path) -> None:
    (tmp_path / "_SUCCESS").write_bytes(b"")
    with pytest.raises(FormatError, match=r"part-r-NNNNN.*it holds: _SUCCESS"):
        Dataset(tmp_path)


@pytest.mark.parametrize(("options", "error", "match"), [
    ({"max_concurrency": 0}, ValueError, "max_concurrency must be an int >= 1"),
    ({"max_concurency": 4}, TypeError, r"unknown option\(s\) \['max_concurency'\].*retries"),
    ({"retries": -1}, ValueError, "retries must be"),
    ({"storage_options": "anon"}, TypeError, "storage_options must be a mapping"),
    ([("retries", 1)], TypeError, "source_options must be a mapping"),
])
def test_source_options_are_checked_at_construction(
    tf_fixtures: Path, options: object, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        Dataset([tf_fixtures / "mixed.tfrecord"], source_options=options)  # type: ignore[arg-type]


def test_source_options_leave_local_reads_alone(tf_fixtures: Path) -> None:
    with Dataset([tf_fixtures / "mixed.tfrecord"], source_options={"retries": 1}) as ds, \
            Dataset([tf_fixtures / "mixed.tfrecord"]) as plain:
        assert ds.read_payloads(range(len(ds))) == plain.read_payloads(range(len(ds)))
        assert ds.storage_stats() == {"requests": 0, "bytes_fetched": 0, "retries": 0,
                                      "seconds": 0.0}
