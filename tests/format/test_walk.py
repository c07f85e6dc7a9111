"""The one TFRecord walker: each record's status, read through a storage byte source."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from shardfeed.format.framing import frame
from shardfeed.format.spec import FRAMING_BYTES, HEADER_BYTES
from shardfeed.format.walk import RecordStatus, Resume, WalkData, walk
from shardfeed.storage import open_source

PAYLOADS = [b"a" * 10, b"bb" * 300, b"", b"c" * 5000]


def _walk(path: Path, *, data: WalkData = "skip", resume: Resume | None = None,
          block_bytes: int = 1 << 20) -> list[RecordStatus]:
    source = open_source(str(path))
    try:
        return list(walk(source, data=data, resume=resume, block_bytes=block_bytes))
    finally:
        source.close()


def _offsets() -> list[int]:
    out, pos = [], 0
    for p in PAYLOADS:
        out.append(pos)
        pos += FRAMING_BYTES + len(p)
    return out + [pos]


@pytest.mark.parametrize("block_bytes", [16, 100, 1 << 20])
def test_walk_whole_file_yields_every_record_with_its_payload(
    tmp_path: Path, block_bytes: int
) -> None:
    path = tmp_path / "a.tfrecord"
    path.write_bytes(b"".join(frame(p) for p in PAYLOADS))
    got = _walk(path, data="payload", block_bytes=block_bytes)
    offsets = _offsets()
    assert [s.state for s in got] == ["ok"] * len(PAYLOADS)
    assert [s.offset for s in got] == offsets[:-1]
    assert [s.end for s in got] == offsets[1:]
    assert [s.payload for s in got] == PAYLOADS
    assert all(s.payload is None for s in _walk(path, data="check"))


def test_walk_reports_bad_data_crc_and_goes_on(tmp_path: Path) -> None:
    data = bytearray(b"".join(frame(p) for p in PAYLOADS))
    data[_offsets()[1] + HEADER_BYTES] ^= 1
    path = tmp_path / "a.tfrecord"
    path.write_bytes(bytes(data))
    states = [s.state for s in _walk(path, data="check")]
    assert states == ["ok", "bad_data_crc", "ok", "ok"]
    assert [s.state for s in _walk(path)] == ["ok"] * 4  # data not read, not checked


def test_walk_resumes_after_bad_length_crc_only_where_told(tmp_path: Path) -> None:
    offsets = _offsets()
    data = bytearray(b"".join(frame(p) for p in PAYLOADS))
    data[offsets[1]] ^= 1
    path = tmp_path / "a.tfrecord"
    path.write_bytes(bytes(data))
    stopped = _walk(path)
    assert [(s.state, s.record, s.offset, s.end) for s in stopped] == [
        ("ok", 0, 0, offsets[1]), ("bad_length_crc", 1, offsets[1], None)]
    resumed = _walk(path, resume=lambda record, pos: offsets[record + 1])
    assert [s.state for s in resumed] == ["ok", "bad_length_crc", "ok", "ok"]
    assert resumed[1].end == offsets[2]


def test_walk_reports_truncation_with_offsets(tmp_path: Path) -> None:
    offsets = _offsets()
    path = tmp_path / "a.tfrecord"
    whole = b"".join(frame(p) for p in PAYLOADS)
    path.write_bytes(whole[:offsets[3] + 5])
    last = _walk(path)[-1]
    assert (last.state, last.record, last.offset, last.length) == ("truncated", 3, offsets[3], None)
    path.write_bytes(whole[:-1])
    last = _walk(path)[-1]
    assert (last.state, last.record, last.offset, last.length) == (
        "truncated", 3, offsets[3], len(PAYLOADS[3]))


def test_walk_names_compressed_and_foreign_files(tmp_path: Path) -> None:
    gz = tmp_path / "a.tfrecord.gz"
    gz.write_bytes(gzip.compress(b"".join(frame(p) for p in PAYLOADS)))
    assert [s.state for s in _walk(gz)] == ["compressed"]
    text = tmp_path / "notes.txt"
    text.write_bytes(b"hello, this is plain text and not a record file\n")
    assert [s.state for s in _walk(text)] == ["not_tfrecord"]
    empty = tmp_path / "empty.tfrecord"
    empty.write_bytes(b"")
    assert _walk(empty) == []
