"""ShardWriter: complete shards appear whole and indexed; interrupted ones leave nothing."""

from __future__ import annotations

from pathlib import Path

import google_crc32c
import numpy as np
import pytest

from shardfeed.format.example import decode_example
from shardfeed.format.framing import scan, unframe
from shardfeed.format.index import load_binary_index, read_text_index
from shardfeed.format.writer import ShardWriter


def test_writer_produces_an_indexed_shard(tmp_path: Path) -> None:
    path = tmp_path / "train-00000.tfrecord"
    with ShardWriter(path) as writer:
        for i in range(7):
            assert writer.write_example({"label": i, "image/encoded": b"x" * i}) == i
        assert not path.exists()  # only the temp name while writing
        assert (tmp_path / "train-00000.tfrecord.tmp").exists()
    info = writer.close()  # idempotent after the with block
    assert info.path == "train-00000.tfrecord"
    assert info.records == 7
    data = path.read_bytes()
    assert info.bytes == len(data)
    assert info.crc32c == google_crc32c.value(data)
    offsets = scan(path, verify_data=True)
    np.testing.assert_array_equal(load_binary_index(str(path) + ".idx.npy"), offsets)
    np.testing.assert_array_equal(read_text_index(str(path) + ".idx"), offsets)
    assert not (tmp_path / "train-00000.tfrecord.tmp").exists()
    labels = [
        int(decode_example(unframe(data[a:b], path="", record=0, offset=0))["label"][0])
        for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist())
    ]
    assert labels == list(range(7))


def test_exception_in_block_leaves_no_shard(tmp_path: Path) -> None:
    path = tmp_path / "s.tfrecord"
    with pytest.raises(RuntimeError), ShardWriter(path) as writer:
        writer.write(b"payload")
        raise RuntimeError("interrupted")
    assert list(tmp_path.iterdir()) == []


def test_abort_removes_temp_and_blocks_writes(tmp_path: Path) -> None:
    writer = ShardWriter(tmp_path / "s.tfrecord", name="sub/s.tfrecord")
    writer.write(b"a")
    writer.abort()
    writer.abort()
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match="closed"):
        writer.write(b"b")
    with pytest.raises(ValueError, match="aborted"):
        writer.close()


def test_empty_shard_and_custom_name(tmp_path: Path) -> None:
    with ShardWriter(tmp_path / "e.tfrecord", name="sub/e.tfrecord") as writer:
        pass
    info = writer.close()
    assert (info.path, info.records, info.bytes) == ("sub/e.tfrecord", 0, 0)
    assert (tmp_path / "e.tfrecord").read_bytes() == b""
    assert (tmp_path / "e.tfrecord.idx").read_bytes() == b""


def test_remote_path_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="local"):
        ShardWriter("s3://bucket/x.tfrecord")
