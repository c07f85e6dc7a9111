"""Dataset: opening every kind of source, reading in order, errors that name the place."""

from __future__ import annotations

import os
import pickle
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

import shardfeed.dataset.open_shards as open_shards_module
import shardfeed.dataset.shards as shards_module
from shardfeed.dataset import Dataset, ReadOptions
from shardfeed.errors import CorruptRecordError, FormatError, SchemaError, StorageError
from shardfeed.format.example import FeatureSpec


def _names(records: list[dict[str, Any]]) -> list[str]:
    return [r["image/filename"].decode() for r in records]


@pytest.mark.parametrize("how", ["list", "glob", "folder"])
def test_open_tensorflow_files(tf_copy: Path, expected_filenames: list[str], how: str) -> None:
    source: Any = {
        "list": [tf_copy / "mixed.tfrecord", str(tf_copy / "second.tfrecord")],
        "glob": str(tf_copy / "*.tfrecord"),
        "folder": tf_copy,
    }[how]
    with Dataset(source) as ds:
        assert len(ds) == 30 and ds.num_shards == 2
        assert _names(ds.read_many(range(30))) == expected_filenames
        assert _names(list(ds)) == expected_filenames
        assert ds.locate(21) == (str(tf_copy / "second.tfrecord"), 0, 0)
        assert ds.locate(-1)[1] == 8
        assert ds.schema.label_key == "image/class/label"
        assert ds.group_ids is None and ds.order_keys is None
    # indexes were written beside the files, as DALI's tfrecord2idx writes them
    assert (tf_copy / "mixed.tfrecord.idx").read_bytes() == (
        Path(__file__).parents[1] / "data" / "tf" / "mixed.idx"
    ).read_bytes()
    assert (tf_copy / "second.tfrecord.idx.npy").exists()


def test_second_open_uses_written_indexes(tf_copy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    Dataset(tf_copy).close()

    def no_scan(*args: object, **kwargs: object) -> None:
        raise AssertionError("scanned again although an index exists")

    monkeypatch.setattr(shards_module, "scan", no_scan)
    with Dataset(tf_copy) as ds:
        assert len(ds) == 30


def test_unwritable_folder_keeps_index_in_memory(
    tf_copy: Path, monkeypatch: pytest.MonkeyPatch, expected_filenames: list[str]
) -> None:
    def refuse(path: object, offsets: object) -> None:
        raise StorageError(f"cannot write '{path}': permission denied")

    monkeypatch.setattr(shards_module, "write_text_index", refuse)
    with Dataset(tf_copy) as ds:
        assert _names(ds.read_many([29, 0])) == [expected_filenames[29], expected_filenames[0]]
    assert sorted(os.listdir(tf_copy)) == ["mixed.tfrecord", "second.tfrecord"]


def test_existing_dali_index_is_used(tf_copy: Path, tf_fixtures: Path) -> None:
    shutil.copy(tf_fixtures / "mixed.idx", tf_copy / "mixed.tfrecord.idx")
    with Dataset([tf_copy / "mixed.tfrecord"], build_index=False) as ds:
        assert len(ds) == 21
    with pytest.raises(FormatError, match="no index.*shardfeed index"):
        Dataset([tf_copy / "second.tfrecord"], build_index=False)


def test_stale_index_of_a_bare_file(tf_copy: Path) -> None:
    Dataset(tf_copy).close()
    with open(tf_copy / "second.tfrecord", "ab") as fh:
        fh.write(b"\0" * 10)
    with pytest.raises(FormatError, match="second.tfrecord.*changed after indexing"):
        Dataset(tf_copy)


def test_read_many_keeps_the_asked_order(tf_copy: Path) -> None:
    with Dataset(tf_copy) as ds:
        single = [ds[i] for i in range(len(ds))]
        asked = [29, 0, 5, 5, 21, -1, 3, 20]
        got = ds.read_many(np.array(asked))
        for i, rec in zip(asked, got):
            assert rec["image/filename"] == single[i]["image/filename"]
            np.testing.assert_array_equal(rec["labels"], single[i]["labels"])
        payloads = ds.read_payloads(asked)
        assert [len(p) for p in payloads] == [len(ds.read_payloads([i])[0]) for i in asked]
        assert ds.read_many([]) == []
        with pytest.raises(IndexError, match="30"):
            ds.read_many([30])
        for unsigned in ([2**64 - 1], [2, 2**64 - 1]):  # past 2**63: not a negative index
            with pytest.raises(IndexError, match=str(2**64 - 1)):
                ds.read_many(np.array(unsigned, dtype=np.uint64))
        for one in (-30, 29):
            assert ds.read_many(np.array([one]))[0]["image/filename"] == single[one % 30][
                "image/filename"]
        with pytest.raises(IndexError, match="-31"):
            ds.read_many([-31])
        with pytest.raises(TypeError, match="read_many"):
            ds["a"]  # type: ignore[index]
        with pytest.raises(TypeError):
            ds.read_many([0.5])  # type: ignore[list-item]


class CountingSource:
    """Wraps a ByteSource and records every range it is asked for."""

    log: ClassVar[list[tuple[str, int, int]]] = []

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.url = inner.url

    def size(self) -> int:
        return int(self.inner.size())

    def read(self, offset: int, length: int) -> bytes:
        self.log.append((self.url, offset, length))
        return bytes(self.inner.read(offset, length))

    def read_ranges(self, ranges: list[tuple[int, int]]) -> list[bytes]:
        return [self.read(o, n) for o, n in ranges]

    def close(self) -> None:
        self.inner.close()


@pytest.fixture
def counting(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int, int]]:
    real = open_shards_module.open_source
    log: ClassVar[list[tuple[str, int, int]]] = []
    CountingSource.log = log
    monkeypatch.setattr(open_shards_module, "open_source", lambda url: CountingSource(real(url)))
    return log


def test_read_many_coalesces_per_shard(
    make_packed: Callable[..., Path], counting: list[tuple[str, int, int]]
) -> None:
    folder = make_packed(shards=2, per_shard=10, payload_bytes=1000)
    with Dataset(folder, read_options=ReadOptions(coalesce_gap_bytes=0)) as ds:
        recs = ds.read_many([7, 3, 5, 4, 6, 12, 11, 10])
        assert [int(r["image/class/label"][0]) for r in recs] == [7, 3, 5, 4, 6, 12, 11, 10]
        # records 3..7 of shard 0 in one read, 10..12 of shard 1 in another
        assert len(counting) == 2
        assert {url.rsplit("/", 1)[-1] for url, _, _ in counting} == {
            "train-00000.tfrecord", "train-00001.tfrecord"}
        counting.clear()
        ds.read_many([0, 2, 4])  # gaps of one record: separate reads with gap 0
        assert len(counting) == 3
    with Dataset(folder, read_options=ReadOptions(coalesce_gap_bytes=2000)) as ds:
        counting.clear()
        recs = ds.read_many([4, 0, 2])  # nearby: one read, the gaps read and dropped
        assert [int(r["image/class/label"][0]) for r in recs] == [4, 0, 2]
        assert len(counting) == 1
    with Dataset(folder, read_options=ReadOptions(max_read_bytes=2500)) as ds:
        counting.clear()
        ds.read_many(range(10))  # adjacent, but a read stops growing past 2500 bytes
        assert len(counting) == 5


def test_many_threads_read_the_same_records(make_packed: Callable[..., Path]) -> None:
    folder = make_packed(shards=4, per_shard=50, payload_bytes=300)
    with Dataset(folder) as ds:
        reference = ds.read_payloads(range(len(ds)))
        errors: list[BaseException] = []

        def work(seed: int) -> None:
            rng = np.random.default_rng(seed)
            try:
                for _ in range(30):
                    idx = rng.integers(0, len(ds), size=int(rng.integers(1, 40)))
                    got = ds.read_payloads(idx)
                    if got != [reference[i] for i in idx.tolist()]:
                        errors.append(AssertionError(f"wrong payloads for {idx.tolist()}"))
            except BaseException as exc:  # noqa: BLE001 - handed to the main thread
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(s,)) for s in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []


def test_manifest_dataset(make_packed: Callable[..., Path]) -> None:
    folder = make_packed(shards=3, per_shard=5)
    for source in (folder, folder / "shardfeed.json"):
        with Dataset(source) as ds:
            assert len(ds) == 15 and ds.num_shards == 3
            assert [int(r["image/class/label"][0]) for r in ds.read_many(range(15))] == list(
                range(15))
            assert ds.group_ids is not None and ds.group_ids.tolist() == [i // 4 for i in range(15)]
            assert ds.order_keys is not None and ds.order_keys[3] == 24.0
            assert ds.schema.image is not None and ds.schema.image.key == "image/encoded"
            assert ds.root == str(folder / "images")
            assert ds.manifest.group_key == "day"
            assert ds.locate(7) == (str(folder / "train-00001.tfrecord"), 2, ds.locate(7)[2])
    with Dataset(folder, root="/elsewhere") as ds:
        assert ds.root == "/elsewhere"


def test_manifest_shard_size_mismatch(make_packed: Callable[..., Path]) -> None:
    folder = make_packed(shards=2, per_shard=3)
    with open(folder / "train-00001.tfrecord", "ab") as fh:
        fh.write(b"more")
    with pytest.raises(FormatError) as info:
        Dataset(folder)
    msg = str(info.value)
    assert "train-00001.tfrecord" in msg
    assert "shardfeed index" in msg and "pack --resume" in msg


def test_manifest_index_mismatch_found_on_first_use(make_packed: Callable[..., Path]) -> None:
    folder = make_packed(shards=2, per_shard=3)
    np.save(folder / "train-00000.tfrecord.idx.npy", np.array([0, 20], dtype=np.uint64))
    with Dataset(folder) as ds, pytest.raises(FormatError, match="train-00000.*3 records"):
        ds[0]


def test_crc_error_names_shard_record_and_offset(tf_copy: Path, tf_fixtures: Path,
                                                 tf_expected: dict[str, Any]) -> None:
    shutil.copy(tf_fixtures / "damaged-data-crc.tfrecord", tf_copy / "mixed.tfrecord")
    offset = tf_expected["offsets"]["mixed.tfrecord"][2]
    with Dataset(tf_copy) as ds:
        ds.read_many([0, 1, 3])
        with pytest.raises(CorruptRecordError) as info:
            ds.read_many([0, 2])
        err = info.value
        assert (err.path, err.record, err.offset) == (str(tf_copy / "mixed.tfrecord"), 2, offset)
        assert f"record 2 at byte {offset}" in str(err) and "mixed.tfrecord" in str(err)
    with Dataset(tf_copy, verify_crc=False) as ds:
        assert len(ds.read_payloads([2])[0]) == tf_expected["records"][2]["serialized_len"]


def test_truncated_shard_after_indexing(tf_copy: Path) -> None:
    with Dataset(tf_copy) as ds:
        data = (tf_copy / "second.tfrecord").read_bytes()
        (tf_copy / "second.tfrecord").write_bytes(data[:-100])
        with pytest.raises(CorruptRecordError, match="record 8.*truncated") as info:
            ds[29]
        assert info.value.record == 8


def test_compressed_and_empty_files(tf_fixtures: Path, tmp_path: Path) -> None:
    shutil.copy(tf_fixtures / "compressed.tfrecord.gz", tmp_path / "c.tfrecord.gz")
    with pytest.raises(FormatError, match="gunzip -c"):
        Dataset(tmp_path)
    shutil.copy(tf_fixtures / "empty.tfrecord", tmp_path / "e.tfrecord")
    with Dataset([tmp_path / "e.tfrecord"]) as ds:
        assert len(ds) == 0 and ds.read_many([]) == []
        assert ds.schema.features == {}


def test_bad_sources(tmp_path: Path) -> None:
    with pytest.raises(FormatError, match="no files match"):
        Dataset(str(tmp_path / "*.tfrecord"))
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(FormatError, match="no shardfeed.json and no TFRecord"):
        Dataset(tmp_path)
    with pytest.raises(StorageError, match="does not exist"):
        Dataset(tmp_path / "missing.tfrecord")
    with pytest.raises(ValueError, match="empty"):
        Dataset([])
    with pytest.raises(TypeError, match="Dataset source"):
        Dataset(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="verify_crc"):
        Dataset(tmp_path, verify_crc="yes")  # type: ignore[arg-type]


def test_feature_selection(make_packed: Callable[..., Path]) -> None:
    folder = make_packed(shards=1, per_shard=3)
    with Dataset(folder, features=["image/class/label", "day"]) as ds:
        assert set(ds[1]) == {"image/class/label", "day"}
    spec = {"image/class/label": FeatureSpec("int64", shape=()),
            "weight": FeatureSpec("float", default=1.0)}
    with Dataset(folder, features=spec) as ds:
        rec = ds[2]
        assert rec["image/class/label"].shape == () and int(rec["image/class/label"]) == 2
        assert rec["weight"] == 1.0
    with pytest.raises(SchemaError, match="'nope'"):
        Dataset(folder, features=["nope"])
    with Dataset(folder, features={"day": FeatureSpec("float")}) as ds, pytest.raises(
        SchemaError, match=r"train-00000.tfrecord', record 1 at byte \d+.*'day' is int64"
    ):
        ds[1]


def test_pickle_reopens(make_packed: Callable[..., Path]) -> None:
    folder = make_packed(shards=2, per_shard=3)
    with Dataset(folder) as ds:
        ds[0]
        again = pickle.loads(pickle.dumps(ds))
        assert len(again) == 6 and again.read_payloads([4]) == ds.read_payloads([4])
        again.close()


def test_closed_dataset_refuses_reads(make_packed: Callable[..., Path]) -> None:
    ds = Dataset(make_packed(shards=1, per_shard=2))
    ds.close()
    ds.close()
    with pytest.raises(ValueError, match="closed"):
        ds[0]


def test_dataset_on_object_storage(
    s3_server: Any, make_packed: Callable[..., Path], tf_copy: Path,
    expected_filenames: list[str],
) -> None:
    url = s3_server.upload_folder(make_packed(shards=2, per_shard=4))
    for source in (url, url + "/", url + "/shardfeed.json"):
        with Dataset(source) as opened:
            assert len(opened) == 8
    with Dataset(url + "/") as ds:
        assert len(ds) == 8
        assert [int(r["image/class/label"][0]) for r in ds.read_many([7, 0, 3])] == [7, 0, 3]
        assert ds.group_ids is not None and ds.group_ids.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    # bare TFRecord files: indexes built in memory, nothing written to the bucket
    bare = s3_server.upload_folder(tf_copy)
    fs = s3_server.filesystem()
    before = sorted(fs.ls(bare.removeprefix("s3://")))
    with Dataset([bare + "/mixed.tfrecord", bare + "/second.tfrecord"]) as ds:
        assert _names(ds.read_many(range(30))) == expected_filenames
    with Dataset(bare + "/*.tfrecord") as ds:
        assert len(ds) == 30
    assert sorted(fs.ls(bare.removeprefix("s3://"))) == before
