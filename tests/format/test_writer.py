"""ShardWriter: complete shards appear whole and indexed; interrupted ones leave nothing."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import google_crc32c
import numpy as np
import pytest

from shardfeed.errors import StorageError
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


def fail_fsync_of(monkeypatch: pytest.MonkeyPatch, part: str) -> list[str]:
    """Make the disk fill up when a file whose path holds ``part`` is made durable (where a
    delayed-allocation file system reports ENOSPC); returns the paths that failed."""
    real = os.fsync
    failed: list[str] = []

    def fsync(fd: int) -> None:
        target = os.readlink(f"/proc/self/fd/{fd}")
        if part in target:
            failed.append(target)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return failed


def test_disk_full_while_writing_an_index_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    failed = fail_fsync_of(monkeypatch, ".idx.npy")
    path = tmp_path / "s.tfrecord"
    writer = ShardWriter(path)
    for i in range(5):
        writer.write(b"record %d" % i)
    with pytest.raises(StorageError) as info:
        writer.close()
    assert failed
    message = str(info.value)
    assert "disk is full" in message and "s.tfrecord.idx.npy" in message
    assert list(tmp_path.iterdir()) == []  # no .tmp, no .idx without its shard
    monkeypatch.undo()
    with ShardWriter(path) as again:  # once there is room, the same shard is written
        again.write(b"record")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "s.tfrecord", "s.tfrecord.idx", "s.tfrecord.idx.npy"]


def test_disk_full_while_writing_records_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fail_fsync_of(monkeypatch, "s.tfrecord.tmp")
    writer = ShardWriter(tmp_path / "s.tfrecord")
    writer.write(b"x" * 1000)
    with pytest.raises(StorageError, match="disk is full"):
        writer.close()
    assert list(tmp_path.iterdir()) == []
