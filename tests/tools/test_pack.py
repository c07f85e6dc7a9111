"""pack: round trips in every mode, labels, determinism, safety, resume, --from-tfrecord."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

from shardfeed.errors import PackError
from shardfeed.format.example import decode_example
from shardfeed.format.framing import scan, unframe
from shardfeed.tools import packoutput
from shardfeed.tools.csvinput import CsvColumns
from shardfeed.tools.pack import pack
from shardfeed.transforms.decode.image import decode_image

ALL_COLUMNS = CsvColumns(
    labels=("label",), floats="VF,IRR0..IRR2", onehot=("sky",), mask="mask", group="day",
    order="timestamp",
)


def records_of(out: Path) -> list[dict[str, Any]]:
    """Every record of a packed dataset, in manifest order, read with the format layer."""
    manifest = json.loads((out / "shardfeed.json").read_text())
    found = []
    for shard in manifest["shards"]:
        path = str(out / shard["path"])
        offsets = scan(path)
        data = Path(path).read_bytes()
        for i in range(offsets.size - 1):
            a, b = int(offsets[i]), int(offsets[i + 1])
            found.append(decode_example(unframe(data[a:b], path=path, record=i, offset=a)))
    return found


def shard_bytes(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


def test_folder_labels_and_class_names(class_folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = pack(class_folder, out, records_per_shard=4)
    assert (result.shards, result.records) == (3, 9)
    manifest = json.loads((out / "shardfeed.json").read_text())
    names = manifest["extra"]["vocabularies"]["image/class/label"]
    assert names == ["cat", "dog", "emu"]
    recs = records_of(out)
    for rec in recs:
        folder = rec["image/filename"].decode().split("/")[0]
        assert names[int(rec["image/class/label"][0])] == folder
        source = (class_folder / rec["image/filename"].decode()).read_bytes()
        assert rec["image/encoded"] == source  # embedded: bytes as on disk
        assert rec["image/format"] == (b"png" if source[:4] == b"\x89PNG" else b"jpeg")
        assert int(rec["image/height"][0]) == 20 and int(rec["image/width"][0]) == 24


@pytest.mark.parametrize("mode", ["embedded", "referenced", "raw"])
def test_dataset_round_trip_groups_sorted(mode: str, frames_csv: Path, tmp_path: Path) -> None:
    import shardfeed

    out = tmp_path / mode
    pack(frames_csv, out, mode=mode, csv=ALL_COLUMNS, records_per_shard=5)  # type: ignore[arg-type]
    assert json.loads((out / "shardfeed.json").read_text())["mode"] == mode
    ds = shardfeed.Dataset(str(out))
    try:
        assert len(ds) == 12
        recs = [ds[i] for i in range(len(ds))]
        days = [r["day"] for r in recs]
        assert days == sorted(days)  # groups contiguous, in sorted order
        stamps = [int(r["timestamp"][0]) for r in recs]
        for day in set(days):
            mine = [s for d, s in zip(days, stamps) if d == day]
            assert mine == sorted(mine) and len(mine) == 4
        assert ds.group_ids is not None and list(ds.group_ids) == [0] * 4 + [1] * 4 + [2] * 4
        assert ds.order_keys is not None and float(ds.order_keys[1] - ds.order_keys[0]) == 8.0
        root = frames_csv.parent
        for r in recs:
            assert r["labels"].shape == (4,)
            assert int(r["image/label/sky"].sum()) == 1
            if mode == "referenced":
                name = r["image/path"].decode()
                assert (Path(ds.manifest.root) / name).is_file()
                assert Path(ds.manifest.root) == root
            elif mode == "embedded":
                source = (root / r["image/filename"].decode()).read_bytes()
                assert r["image/encoded"] == source
                assert r["mask/format"] == b"png"
            else:
                h, w, c = (int(r[k][0]) for k in ("image/height", "image/width", "image/channels"))
                pixels = np.frombuffer(r["image/raw"], np.uint8).reshape(h, w, c)
                source = (root / r["image/filename"].decode()).read_bytes()
                assert np.array_equal(pixels, decode_image(source, mode="rgb"))
                bgr = cv2.imread(str(root / r["image/filename"].decode()))
                assert np.abs(pixels.astype(int) - bgr[..., ::-1]).mean() < 4
                mh, mw = int(r["mask/height"][0]), int(r["mask/width"][0])
                assert len(r["mask/raw"]) == mh * mw == h * w
    finally:
        ds.close()


def test_csv_float_ranges_and_onehot_values(frames_csv: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    pack(frames_csv, out, csv=ALL_COLUMNS, records_per_shard=100)
    manifest = json.loads((out / "shardfeed.json").read_text())
    vocab = manifest["extra"]["vocabularies"]
    assert vocab["labels"] == ["VF", "IRR0", "IRR1", "IRR2"]
    assert vocab["image/label/sky"] == ["clear", "cloudy", "rain"]
    assert manifest["schema"]["label_key"] == "image/class/label"
    import csv

    with open(frames_csv) as f:
        rows = {r["path"]: r for r in csv.DictReader(f)}
    for rec in records_of(out):
        row = rows[rec["image/filename"].decode()]
        want = [float(row[c]) for c in ("VF", "IRR0", "IRR1", "IRR2")]
        assert np.allclose(rec["labels"], want)
        hot = rec["image/label/sky"]
        assert vocab["image/label/sky"][int(np.argmax(hot))] == row["sky"]
        assert int(rec["image/class/label"][0]) == int(row["label"])


def test_workers_give_identical_bytes(frames_csv: Path, tmp_path: Path) -> None:
    outs = []
    for workers, executor in ((1, "thread"), (3, "thread"), (2, "process")):
        out = tmp_path / f"w{workers}"
        pack(frames_csv, out, mode="raw", csv=ALL_COLUMNS, shard_size="4kB", workers=workers,
             executor=executor)
        outs.append(shard_bytes(out))
    assert outs[0] == outs[1] == outs[2]
    assert sum(n.endswith(".tfrecord") for n in outs[0]) > 2


def test_non_empty_output_is_refused(class_folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(PackError, match=r"not empty.*--resume.*--overwrite"):
        pack(class_folder, out)
    result = pack(class_folder, out, overwrite=True)
    assert result.records == 9
    assert (out / "notes.txt").read_text() == "mine"
    before = shard_bytes(out)
    again = pack(class_folder, out, resume=True)  # finished: checked, nothing written
    assert again.already_complete and again.records == 9
    assert shard_bytes(out) == before
    with pytest.raises(PackError, match="finished dataset packed from other inputs.*--overwrite"):
        pack(class_folder, out, resume=True, records_per_shard=2)


def test_interrupted_pack_leaves_only_whole_shards_and_resumes_identically(
    frames_csv: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clean = tmp_path / "clean"
    pack(frames_csv, clean, csv=ALL_COLUMNS, records_per_shard=3, workers=2)
    out = tmp_path / "out"
    real = packoutput.write_shard
    written: list[str] = []

    def failing(path: str, payloads: Any) -> Any:
        if len(written) == 2:  # the 3rd shard breaks half-way through
            def half() -> Any:
                for i, p in enumerate(payloads):
                    if i == 1:
                        raise RuntimeError("power cut")
                    yield p
            return real(path, half())
        written.append(path)
        return real(path, payloads)

    monkeypatch.setattr(packoutput, "write_shard", failing)
    with pytest.raises(RuntimeError, match="power cut"):
        pack(frames_csv, out, csv=ALL_COLUMNS, records_per_shard=3, workers=2)
    monkeypatch.setattr(packoutput, "write_shard", real)
    names = sorted(os.listdir(out))
    assert "shardfeed.json" not in names
    assert not [n for n in names if n.endswith(".tmp")]
    shards = [n for n in names if n.endswith(".tfrecord")]
    assert shards == ["shard-00000-of-00004.tfrecord", "shard-00001-of-00004.tfrecord"]
    for name in shards:  # what is there is whole and identical to the clean run
        assert (out / name).read_bytes() == (clean / name).read_bytes()
    with pytest.raises(PackError, match="--resume"):
        pack(frames_csv, out, csv=ALL_COLUMNS, records_per_shard=3)
    result = pack(frames_csv, out, csv=ALL_COLUMNS, records_per_shard=3, resume=True)
    assert result.kept_shards == 2
    assert shard_bytes(out) == shard_bytes(clean)


def test_resume_with_other_options_is_refused(frames_csv: Path, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "out"

    def boom(path: str, payloads: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(packoutput, "write_shard", boom)
    with pytest.raises(KeyboardInterrupt):
        pack(frames_csv, out, csv=ALL_COLUMNS, records_per_shard=3)
    monkeypatch.undo()
    with pytest.raises(PackError, match="other options.*--overwrite"):
        pack(frames_csv, out, csv=ALL_COLUMNS, records_per_shard=4, resume=True)


def test_raw_mode_undecodable_image_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "bad.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    (tmp_path / "d.csv").write_text("path\nbad.jpg\n")
    with pytest.raises(PackError, match=r"line 2: '.*bad\.jpg' does not decode"):
        pack(tmp_path / "d.csv", tmp_path / "out", mode="raw")
    assert not (tmp_path / "out").exists()


def test_from_tfrecord_repacks_plain_and_gzip(tf_fixtures: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = pack([tf_fixtures / "mixed.tfrecord", tf_fixtures / "second.tfrecord"], out,
                  from_tfrecord=True, records_per_shard=8)
    assert (result.records, result.shards) == (30, 4)
    original = Path(tf_fixtures / "mixed.tfrecord").read_bytes()
    offsets = scan(str(tf_fixtures / "mixed.tfrecord"))
    repacked = records_of(out)
    for i in range(21):
        a, b = int(offsets[i]), int(offsets[i + 1])
        assert repacked[i] .keys() == decode_example(
            unframe(original[a:b], path="m", record=i, offset=a)).keys()
    assert b"".join((out / f"shard-0000{i}-of-00004.tfrecord").read_bytes()
                    for i in range(4)) == original + Path(tf_fixtures / "second.tfrecord").read_bytes()
    gz = pack(tf_fixtures / "compressed.tfrecord.gz", tmp_path / "gz", from_tfrecord=True)
    assert gz.records == 5
    manifest = json.loads((tmp_path / "gz" / "shardfeed.json").read_text())
    assert manifest["mode"] == "tfrecord" and manifest["records"] == 5


def test_from_tfrecord_damaged_input_names_record(tf_fixtures: Path, tmp_path: Path) -> None:
    from shardfeed.errors import CorruptRecordError

    with pytest.raises(CorruptRecordError, match=r"record 2 at byte 7854: bad data CRC"):
        pack(tf_fixtures / "damaged-data-crc.tfrecord", tmp_path / "o", from_tfrecord=True)
    assert not (tmp_path / "o" / "shardfeed.json").exists()
