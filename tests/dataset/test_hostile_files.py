"""A downloaded dataset whose indexes, manifest or sidecars are damaged or hostile: opening or
reading it raises a ShardfeedError naming the file and the field, never MemoryError,
OverflowError, RecursionError or a tokenizer error, and nothing is allocated for a count the
files do not back."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shardfeed import Dataset
from shardfeed.errors import FormatError, ShardfeedError, StorageError


def _edit_manifest(folder: Path, change: Callable[[dict[str, Any]], None]) -> None:
    path = folder / "shardfeed.json"
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize("wild", [1 << 62, 1 << 34])
def test_a_wild_offset_in_a_binary_index(make_packed: Callable[..., Path], wild: int) -> None:
    folder = make_packed(shards=2, per_shard=3)
    index = folder / "train-00001.tfrecord.idx.npy"
    offsets = np.load(index)
    offsets[1] = wild  # the end still matches the shard: only a check of every offset sees it
    np.save(index, offsets)
    with Dataset(folder) as ds:
        assert [int(r["image/class/label"][0]) for r in ds.read_many([0, 1, 2])] == [0, 1, 2]
        with pytest.raises(FormatError, match=r"train-00001\.tfrecord\.idx\.npy', entry 1: "
                                              f"record 1 starts at byte {wild}"):
            ds[4]


def test_a_damaged_binary_index_header(make_packed: Callable[..., Path]) -> None:
    folder = make_packed(shards=1, per_shard=3)
    index = folder / "train-00000.tfrecord.idx.npy"
    index.write_bytes(index.read_bytes().replace(b"(4,)", b"((((", 1))
    with Dataset(folder) as ds, pytest.raises(
            FormatError, match=r"train-00000\.tfrecord\.idx\.npy' is not a binary index"):
        ds[0]


@pytest.mark.parametrize("number", [b"-1", b"18446744073709551616"])
def test_a_text_index_number_out_of_range(tf_copy: Path, number: bytes) -> None:
    shard = tf_copy / "mixed.tfrecord"
    (tf_copy / "mixed.tfrecord.idx").write_bytes(b"0 " + number + b"\n")
    with pytest.raises(FormatError, match=r"mixed\.tfrecord\.idx', line 1"):
        Dataset([shard])


def test_claimed_records_are_refused_before_anything_is_allocated(
    make_packed: Callable[..., Path],
) -> None:
    """``records: 10**9`` used to open, and the Loader then allocated 4 GB for the order."""
    folder = make_packed(shards=2, per_shard=3)
    (folder / "groups.npy").unlink()
    (folder / "order.npy").unlink()

    def claim(doc: dict[str, Any]) -> None:
        doc["shards"][0]["records"] = 10**9
        doc["records"] = 10**9 + 3
        doc["group_key"] = doc["order_key"] = None

    _edit_manifest(folder, claim)
    with pytest.raises(FormatError, match=r"shards\[0\]\.records: 1000000000 records cannot fit"):
        Dataset(folder)

    def claim_bytes(doc: dict[str, Any]) -> None:  # a size to match: the file says otherwise
        doc["shards"][0]["bytes"] = 16 * 10**9

    _edit_manifest(folder, claim_bytes)
    with pytest.raises(FormatError, match=r"train-00000\.tfrecord' is \d+ bytes but the "
                                          r"manifest says 16000000000"):
        Dataset(folder)


@pytest.mark.parametrize(
    "text",
    ["[" * 100_000 + "]" * 100_000,
     '{"format": "shardfeed", "version": 1, "shards": [], "records": 1e400}',
     '{"format": "shardfeed", "version": 1, "shards": [], "records": ' + "9" * 5000 + "}",
     '{"format": "shardfeed", "version": 1, "shards": [{"path": 5, "records": 0, "bytes": 0}]}',
     '{"format": "shardfeed", "version": 1, "shards": [], "root": 3}',
     '{"format": "shardfeed", "version": 1, "shards": [], "extra": [1]}'],
)
def test_a_damaged_manifest(make_packed: Callable[..., Path], text: str) -> None:
    folder = make_packed(shards=1, per_shard=2)
    (folder / "shardfeed.json").write_text(text)
    with pytest.raises(FormatError, match=r"shardfeed\.json'"):
        Dataset(folder)


def test_shard_paths_no_file_system_takes(make_packed: Callable[..., Path]) -> None:
    folder = make_packed(shards=1, per_shard=2)
    for path, error in (("x" * 5000, StorageError), ("shardfeed.json/x", StorageError),
                        ("a\x00b", FormatError)):
        _edit_manifest(folder, lambda doc, path=path: doc["shards"][0].update(path=path))
        with pytest.raises(error):
            Dataset(folder)


def test_a_folder_or_a_pipe_where_a_shard_or_index_should_be(
    make_packed: Callable[..., Path], tf_copy: Path
) -> None:
    folder = make_packed(shards=1, per_shard=2)
    shard = folder / "train-00000.tfrecord"
    size = shard.stat().st_size
    shard.unlink()
    shard.mkdir()
    _edit_manifest(folder, lambda doc: doc["shards"][0].update(bytes=size))
    with pytest.raises(FormatError, match="not a regular file"):
        Dataset(folder)
    os.mkfifo(tf_copy / "mixed.tfrecord.idx.npy")  # opening it would block forever
    with pytest.raises(FormatError, match=r"mixed\.tfrecord\.idx\.npy' is not a regular file"):
        Dataset(tf_copy / "mixed.tfrecord")


def test_a_pickled_sidecar(make_packed: Callable[..., Path]) -> None:
    folder = make_packed(shards=1, per_shard=3)
    np.save(folder / "groups.npy", np.array([object(), 1, 2], dtype=object), allow_pickle=True)
    with pytest.raises(FormatError, match=r"groups\.npy' is not a groups\.npy sidecar"):
        Dataset(folder)


def test_every_error_is_a_shardfeed_error_after_truncating_any_file(
    make_packed: Callable[..., Path], tmp_path: Path
) -> None:
    """Cut each file of a packed dataset at a few points: opening and reading it raise only
    ShardfeedError (or work, when the cut leaves the file valid)."""
    pristine = make_packed(shards=2, per_shard=3)
    for name in sorted(p.name for p in pristine.iterdir()):
        size = (pristine / name).stat().st_size
        for cut in sorted({0, 1, 9, size // 2, size - 1}):
            folder = tmp_path / f"cut-{name}-{cut}"
            shutil.copytree(pristine, folder)
            (folder / name).write_bytes((pristine / name).read_bytes()[:cut])
            try:
                with Dataset(folder) as ds:
                    ds.read_many(range(len(ds)))
            except ShardfeedError:
                pass
