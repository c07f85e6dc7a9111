"""index on TensorFlow's files, verify on damaged ones, inspect."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from shardfeed.errors import CorruptRecordError, FormatError
from shardfeed.tools.index import index_files
from shardfeed.tools.inspect import inspect
from shardfeed.tools.pack import pack
from shardfeed.tools.verify import report as V
from shardfeed.tools.verify import verify


@pytest.fixture
def tf_copy(tf_fixtures: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "tf"
    folder.mkdir()
    for name in ("mixed.tfrecord", "second.tfrecord"):
        shutil.copy(tf_fixtures / name, folder / name)
    return folder


def test_index_reproduces_tfrecord2idx_and_group_arrays(tf_copy: Path, tf_fixtures: Path) -> None:
    result = index_files(tf_copy, group_key="day", order_key="timestamp", workers=2)
    assert (result.files, result.records) == (2, 30)
    for name, idx in (("mixed", "mixed.idx"), ("second", "second.idx")):
        assert (tf_copy / f"{name}.tfrecord.idx").read_bytes() == (tf_fixtures / idx).read_bytes()
    expected = json.loads((tf_fixtures / "expected.json").read_text())
    recs = expected["records"] + expected["second"]
    days = [r["features"]["day"]["values"][0] for r in recs]
    stamps = [r["features"]["timestamp"]["values"][0] for r in recs]
    assert np.load(tf_copy / "groups.npy").tolist() == days
    assert np.load(tf_copy / "order.npy").tolist() == stamps
    offsets = np.load(tf_copy / "mixed.tfrecord.idx.npy")
    assert offsets[:-1].tolist() == expected["offsets"]["mixed.tfrecord"]


def test_indexed_folder_opens_as_dataset(tf_copy: Path) -> None:
    import shardfeed

    index_files(sorted(tf_copy.glob("*.tfrecord")), group_key="day")
    ds = shardfeed.Dataset(str(tf_copy))
    try:
        assert len(ds) == 30
        assert ds.group_ids is not None and int(ds.group_ids[7]) == 1
        assert ds[21]["image/filename"] == b"day000/frame0000.jpeg"
    finally:
        ds.close()


def test_index_refuses_compressed_and_non_tfrecord(tf_fixtures: Path, tmp_path: Path) -> None:
    shutil.copy(tf_fixtures / "compressed.tfrecord.gz", tmp_path / "c.tfrecord.gz")
    with pytest.raises(FormatError, match=r"c\.tfrecord\.gz.*GZIP.*--from-tfrecord"):
        index_files(tmp_path / "c.tfrecord.gz")
    (tmp_path / "notes.tfrecord").write_bytes(b"hello, this is not a tfrecord file at all")
    with pytest.raises(FormatError, match=r"notes\.tfrecord' is not a TFRecord"):
        index_files(tmp_path / "notes.tfrecord")
    with pytest.raises(FormatError, match=r"missing\.tfrecord' does not exist"):
        index_files(tmp_path / "missing.tfrecord")
    assert not (tmp_path / "shardfeed.json").exists()


def test_index_truncated_file_names_record(tf_fixtures: Path, tmp_path: Path) -> None:
    shutil.copy(tf_fixtures / "damaged-truncated.tfrecord", tmp_path / "t.tfrecord")
    with pytest.raises(CorruptRecordError, match=r"record 5 at byte 22421: truncated"):
        index_files(tmp_path / "t.tfrecord")


def test_index_empty_file_has_no_records(tf_fixtures: Path, tmp_path: Path) -> None:
    shutil.copy(tf_fixtures / "empty.tfrecord", tmp_path / "e.tfrecord")
    result = index_files(tmp_path / "e.tfrecord")
    assert result.records == 0
    assert (tmp_path / "e.tfrecord.idx").read_bytes() == b""


@pytest.mark.parametrize(
    ("name", "kind", "record", "offset"),
    [
        ("damaged-data-crc.tfrecord", V.BAD_DATA_CRC, 2, 7854),
        ("damaged-length-crc.tfrecord", V.BAD_LENGTH_CRC, 4, 16380),
        ("damaged-truncated.tfrecord", V.TRUNCATED, 5, 22421),
        ("compressed.tfrecord.gz", V.COMPRESSED, 0, 0),
    ],
)
def test_verify_damaged_fixtures_exactly(
    tf_fixtures: Path, name: str, kind: str, record: int, offset: int
) -> None:
    report = verify(tf_fixtures / name, decode=True)
    assert not report.ok
    assert [(p.kind, p.record, p.offset) for p in report.problems] == [(kind, record, offset)]
    assert name in str(report.problems[0])


def test_verify_good_and_empty_and_not_tfrecord(tf_fixtures: Path, tmp_path: Path) -> None:
    report = verify([tf_fixtures / "mixed.tfrecord", tf_fixtures / "empty.tfrecord"],
                    decode=True, workers=2)
    assert report.ok and report.records == 21
    assert sum(s.decoded for s in report.shards) == 42  # 21 images + 21 raw masks
    assert any("empty" in w for w in report.warnings)
    (tmp_path / "x.tfrecord").write_bytes(b"just some text, long enough to hold a header")
    bad = verify(tmp_path / "x.tfrecord")
    assert [p.kind for p in bad.problems] == [V.NOT_TFRECORD]


def test_verify_length_crc_continues_with_index(tf_fixtures: Path, tmp_path: Path) -> None:
    shutil.copy(tf_fixtures / "damaged-length-crc.tfrecord", tmp_path / "d.tfrecord")
    shutil.copy(tf_fixtures / "mixed.idx", tmp_path / "d.tfrecord.idx")
    report = verify(tmp_path / "d.tfrecord", decode=True)
    assert [(p.kind, p.record) for p in report.problems] == [(V.BAD_LENGTH_CRC, 4)]
    assert report.records == 21  # the records after the bad header were checked too


def test_verify_manifest_checks_and_bad_images(class_folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    pack(class_folder, out, records_per_shard=4)
    assert verify(out, decode=True).ok
    shard = out / "shard-00001-of-00003.tfrecord"
    data = bytearray(shard.read_bytes())
    data[-100] ^= 0xFF  # inside the last record's image bytes
    shard.write_bytes(bytes(data))
    report = verify(out, decode=True)
    kinds = [(p.kind, p.path.endswith(shard.name)) for p in report.problems]
    assert (V.CHECKSUM_MISMATCH, True) in kinds and (V.BAD_DATA_CRC, True) in kinds
    shard.write_bytes(bytes(data[:-10]))
    kinds2 = [p.kind for p in verify(out).problems]
    assert V.SIZE_MISMATCH in kinds2 and V.TRUNCATED in kinds2
    (out / "shard-00002-of-00003.tfrecord").unlink()
    assert V.MISSING_FILE in [p.kind for p in verify(out).problems]


def test_verify_undecodable_image_and_missing_reference(tmp_path: Path, make_image) -> None:  # type: ignore[no-untyped-def]
    make_image(tmp_path / "a.jpg", 1)
    make_image(tmp_path / "b.jpg", 2)
    (tmp_path / "d.csv").write_text("path\na.jpg\nb.jpg\n")
    pack(tmp_path / "d.csv", tmp_path / "ref", mode="referenced")
    pack(tmp_path / "d.csv", tmp_path / "emb")
    (tmp_path / "b.jpg").write_bytes(b"\xff\xd8\xff\xe0garbage")
    report = verify(tmp_path / "emb", decode=True)
    assert report.ok  # embedded bytes do not change with the source
    report = verify(tmp_path / "ref", decode=True)
    assert [(p.kind, p.record) for p in report.problems] == [(V.UNDECODABLE_IMAGE, 1)]
    (tmp_path / "a.jpg").unlink()
    report = verify(tmp_path / "ref")
    assert [(p.kind, p.record) for p in report.problems] == [(V.MISSING_REFERENCED, 0)]
    assert "a.jpg" in report.problems[0].detail


def test_inspect_packed_dataset(frames_csv: Path, tmp_path: Path) -> None:
    from shardfeed.tools.pack.csvinput import CsvColumns

    out = tmp_path / "out"
    pack(frames_csv, out, csv=CsvColumns(labels=("label",), group="day", order="timestamp"),
         records_per_shard=5)
    info = inspect(out, records=2)
    assert info["records"] == 12 and len(info["shards"]) == 3
    assert info["groups"]["count"] == 3
    assert info["groups"]["records_per_group"] == {"min": 4, "median": 4.0, "max": 4}
    assert info["groups"]["order_span_seconds"]["max"] == 24.0
    roles = {r["name"]: (r["role"], r["encoding"]) for r in info["schema"]}
    assert roles["image/encoded"] == ("image", "jpeg")
    assert roles["image/class/label"] == ("label", None)
    assert info["first_records"][0]["image/encoded"].endswith("bytes>")
    json.dumps(info)


def test_inspect_bare_tfrecord(tf_fixtures: Path) -> None:
    info = inspect(tf_fixtures / "mixed.tfrecord")
    assert info["manifest"] is None and info["records"] == 21
    assert {r["name"] for r in info["schema"]} >= {"labels", "image/encoded", "mask_raw"}


def test_several_folders_and_globs_as_the_cli_passes_them(
    tf_copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from shardfeed.cli.main import main

    other = tmp_path / "other"
    other.mkdir()
    shutil.copy(tf_copy / "mixed.tfrecord", other / "again.tfrecord")
    sources = [str(tf_copy), str(other / "*.tfrecord")]
    assert verify(sources).records == 51 and inspect(sources)["records"] == 51
    assert main(["verify", *sources, "--no-progress"]) == 0
    assert "ok: 51 records in 3 shards" in capsys.readouterr().out
