"""TFRecord framing and scanning against TensorFlow's files and damaged variants."""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardfeed.errors import CorruptRecordError, FormatError
from shardfeed.format.crc import crc32c, mask, masked_crc32c, unmask
from shardfeed.format.framing import frame, scan, unframe, unframe_bytes


def test_crc32c_known_vectors() -> None:
    # RFC 3720 test vector and the classic "123456789" check value
    assert crc32c(b"123456789") == 0xE3069283
    assert crc32c(bytes(32)) == 0x8A9136AA
    assert unmask(mask(0x12345678)) == 0x12345678
    assert masked_crc32c(memoryview(b"123456789")) == mask(0xE3069283)


def test_scan_offsets_match_tensorflow(tf_fixtures: Path, tf_expected: dict[str, Any]) -> None:
    offsets = scan(tf_fixtures / "mixed.tfrecord", verify_data=True)
    assert offsets.dtype == np.uint64
    assert offsets[:-1].tolist() == tf_expected["offsets"]["mixed.tfrecord"]
    assert int(offsets[-1]) == (tf_fixtures / "mixed.tfrecord").stat().st_size
    second = scan(tf_fixtures / "second.tfrecord", verify_data=True)
    assert len(second) - 1 == len(tf_expected["second"])


@pytest.mark.parametrize("block_bytes", [16, 100, 4096, 1 << 20])
def test_scan_block_size_does_not_change_result(tf_fixtures: Path, block_bytes: int) -> None:
    want = scan(tf_fixtures / "mixed.tfrecord")
    got = scan(tf_fixtures / "mixed.tfrecord", verify_data=True, block_bytes=block_bytes)
    np.testing.assert_array_equal(got, want)


def test_scan_progress_reports_every_byte(tf_fixtures: Path) -> None:
    seen: list[int] = []
    scan(tf_fixtures / "mixed.tfrecord", progress=seen.append, block_bytes=10_000)
    assert sum(seen) == (tf_fixtures / "mixed.tfrecord").stat().st_size
    assert len(seen) > 1


def test_empty_file_has_no_records(tf_fixtures: Path) -> None:
    offsets = scan(tf_fixtures / "empty.tfrecord", verify_data=True)
    assert offsets.tolist() == [0]


def test_truncated_file(tf_fixtures: Path, tf_expected: dict[str, Any]) -> None:
    whole = tf_expected["damaged"]["damaged-truncated.tfrecord"]["whole_records"]
    with pytest.raises(CorruptRecordError) as info:
        scan(tf_fixtures / "damaged-truncated.tfrecord")
    err = info.value
    assert err.record == whole
    assert err.offset == tf_expected["offsets"]["mixed.tfrecord"][whole]
    assert "damaged-truncated.tfrecord" in str(err)
    assert "truncated" in str(err)
    assert f"{whole} whole records precede it" in str(err)


def test_bad_data_crc_only_found_when_asked(tf_fixtures: Path, tf_expected: dict[str, Any]) -> None:
    bad = tf_expected["damaged"]["damaged-data-crc.tfrecord"]["bad_record"]
    path = tf_fixtures / "damaged-data-crc.tfrecord"
    assert len(scan(path)) - 1 == len(tf_expected["records"])  # framing is intact
    with pytest.raises(CorruptRecordError) as info:
        scan(path, verify_data=True)
    assert info.value.record == bad
    assert info.value.offset == tf_expected["offsets"]["mixed.tfrecord"][bad]
    assert "data CRC" in str(info.value)
    assert f"record {bad}" in str(info.value)


def test_bad_length_crc(tf_fixtures: Path, tf_expected: dict[str, Any]) -> None:
    bad = tf_expected["damaged"]["damaged-length-crc.tfrecord"]["bad_record"]
    with pytest.raises(CorruptRecordError) as info:
        scan(tf_fixtures / "damaged-length-crc.tfrecord")
    assert info.value.record == bad
    assert info.value.offset == tf_expected["offsets"]["mixed.tfrecord"][bad]
    assert "length CRC" in str(info.value)


def test_gzip_file_refused_with_hint(tf_fixtures: Path) -> None:
    with pytest.raises(FormatError) as info:
        scan(tf_fixtures / "compressed.tfrecord.gz")
    assert not isinstance(info.value, CorruptRecordError)
    msg = str(info.value)
    assert "GZIP" in msg and "gunzip -c" in msg and "pack --from-tfrecord" in msg


def test_zlib_file_refused_with_hint(tf_fixtures: Path, tmp_path: Path) -> None:
    path = tmp_path / "z.tfrecord"
    path.write_bytes(zlib.compress((tf_fixtures / "second.tfrecord").read_bytes()))
    with pytest.raises(FormatError, match="ZLIB.*decompress first"):
        scan(path)


def test_random_bytes_are_not_a_tfrecord(tmp_path: Path) -> None:
    path = tmp_path / "noise.tfrecord"
    data = bytearray(np.random.default_rng(7).integers(0, 256, 5000, dtype=np.uint8).tobytes())
    data[0] = 0  # make sure it does not look compressed either
    path.write_bytes(bytes(data))
    with pytest.raises(FormatError, match="not a TFRecord file") as info:
        scan(path)
    assert not isinstance(info.value, CorruptRecordError)


def test_unframe_checks(tf_fixtures: Path) -> None:
    data = (tf_fixtures / "damaged-data-crc.tfrecord").read_bytes()
    offsets = scan(tf_fixtures / "mixed.tfrecord").tolist()
    rec = data[offsets[2]:offsets[3]]
    with pytest.raises(CorruptRecordError, match="bad data CRC") as info:
        unframe(rec, path="x.tfrecord", record=2, offset=offsets[2])
    assert (info.value.path, info.value.record, info.value.offset) == ("x.tfrecord", 2, offsets[2])
    # without verification the payload still comes back
    assert len(unframe(rec, path="x", record=2, offset=0, verify=False)) == len(rec) - 16
    with pytest.raises(CorruptRecordError, match="bad data CRC"):
        unframe_bytes(memoryview(rec), path="x", record=2, offset=0)
    with pytest.raises(CorruptRecordError, match="truncated|bytes were read"):
        unframe(rec[:-1], path="x", record=2, offset=0)
    with pytest.raises(CorruptRecordError, match="truncated"):
        unframe(rec[:5], path="x", record=2, offset=0)


payloads = st.lists(st.binary(max_size=300), min_size=1, max_size=8)


@given(payload=st.binary(max_size=2000))
def test_frame_round_trip(payload: bytes) -> None:
    framed = frame(payload)
    assert len(framed) == len(payload) + 16
    assert bytes(unframe(framed, path="p", record=0, offset=0)) == payload
    assert bytes(unframe(memoryview(framed), path="p", record=0, offset=0)) == payload
    got = unframe_bytes(memoryview(framed), path="p", record=0, offset=0)
    assert type(got) is bytes and got == payload


@settings(max_examples=60, deadline=None)
@given(records=payloads, block=st.sampled_from([16, 37, 512, 1 << 20]))
def test_scan_finds_every_record(tmp_path_factory: Any, records: list[bytes], block: int) -> None:
    path = tmp_path_factory.mktemp("scan") / "f.tfrecord"
    path.write_bytes(b"".join(frame(p) for p in records))
    offsets = scan(path, verify_data=True, block_bytes=block)
    assert np.diff(offsets).tolist() == [len(p) + 16 for p in records]


@settings(max_examples=80, deadline=None)
@given(records=payloads, data=st.data())
def test_any_truncation_is_detected(tmp_path_factory: Any, records: list[bytes], data: Any) -> None:
    blob = b"".join(frame(p) for p in records)
    bounds = set(np.cumsum([0] + [len(p) + 16 for p in records]).tolist())
    cut = data.draw(st.integers(1, len(blob) - 1))
    path = tmp_path_factory.mktemp("trunc") / "f.tfrecord"
    path.write_bytes(blob[:cut])
    if cut in bounds:  # a cut between records leaves a shorter valid file
        assert int(scan(path, verify_data=True)[-1]) == cut
    else:
        with pytest.raises(FormatError):
            scan(path, verify_data=True)


@settings(max_examples=80, deadline=None)
@given(records=payloads, data=st.data())
def test_any_byte_flip_is_detected(tmp_path_factory: Any, records: list[bytes], data: Any) -> None:
    blob = bytearray(b"".join(frame(p) for p in records))
    pos = data.draw(st.integers(0, len(blob) - 1))
    flip = data.draw(st.integers(1, 255))
    blob[pos] ^= flip
    path = tmp_path_factory.mktemp("flip") / "f.tfrecord"
    path.write_bytes(bytes(blob))
    with pytest.raises(FormatError):
        scan(path, verify_data=True)
