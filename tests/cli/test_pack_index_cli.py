"""pack and index from the command line: clear errors, bad inputs, --json, plurals, Spark
output folders, order-key units."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pytest

import shardfeed
from shardfeed.cli.main import main
from shardfeed.format.example import encode_example
from shardfeed.format.framing import frame


def _jpeg(path: Path, seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (12, 14, 3), dtype=np.uint8)
    ok, data = cv2.imencode(".jpg", pixels)
    assert ok
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.tobytes())
    return data.tobytes()


@pytest.fixture
def photos(tmp_path: Path) -> Path:
    root = tmp_path / "photos"
    for k, name in enumerate(("cat", "dog")):
        for i in range(3):
            _jpeg(root / name / f"{i}.jpg", 10 * k + i)
    return root


def test_pack_an_image_file_gives_one_clear_line(photos: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pack", str(photos / "cat" / "0.jpg"), str(tmp_path / "x")]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "is an image file" in err and "folder" in err and "Unicode" not in err


def test_pack_lists_every_bad_file_then_skip_bad_packs_the_rest(
    photos: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = (photos / "cat" / "0.jpg").read_bytes()
    (photos / "cat" / "cut.jpg").write_bytes(good[:-100])
    (photos / "dog" / "zero.jpg").write_bytes(b"")
    (photos / "dog" / "list.txt").write_text("not a photo")
    out = tmp_path / "out"
    assert main(["pack", str(photos), str(out), "--no-progress"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert [line.split("/")[-1] for line in err[:2]] == [
        "cut.jpg' is a truncated JPEG: it has no end-of-image marker (FF D9)",
        "zero.jpg' is empty (0 bytes)"]
    assert err[2].startswith("shardfeed pack: error: 2 input files cannot be packed")
    assert len(err) == 3 and not out.exists()

    assert main(["pack", str(photos), str(out), "--no-progress", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False and len(report["bad"]) == 2

    assert main(["pack", str(photos), str(out), "--no-progress", "--skip-bad"]) == 0
    text = capsys.readouterr().out
    assert "packed 6 records into 1 shard," in text
    assert (f"2 bad inputs skipped and 1 other file not packed: listed in "
            f"{out / 'skipped.csv'}") in text
    assert (out / "skipped.csv").read_text().count("\n") == 4


def test_pack_and_index_json_summaries(photos: Path, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert main(["pack", str(photos), str(out), "--records-per-shard", "4", "--json",
                 "--no-progress"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["ok"] is True
    assert (summary["records"], summary["shards"], summary["skipped"]) == (6, 2, [])
    assert summary["manifest"] == str(out / "shardfeed.json")
    assert summary["bytes"] == sum(p.stat().st_size for p in out.glob("*.tfrecord"))
    assert main(["index", str(out), "--manifest", str(tmp_path / "again.json"), "--json",
                 "--no-progress"]) == 0
    indexed = json.loads(capsys.readouterr().out)
    assert (indexed["records"], indexed["files"]) == (6, 2)
    assert [Path(p).name for p in indexed["paths"]] == [
        "shard-00000-of-00002.tfrecord", "shard-00001-of-00002.tfrecord"]


def _spark_output(folder: Path, parts: list[list[dict[str, object]]]) -> None:
    """A Spark/Hadoop job's output: part-r-NNNNN files, _SUCCESS, hidden .crc files."""
    folder.mkdir()
    for i, records in enumerate(parts):
        data = b"".join(frame(encode_example(r)) for r in records)
        (folder / f"part-r-{i:05d}").write_bytes(data)
        (folder / f".part-r-{i:05d}.crc").write_bytes(b"crc")
    (folder / "_SUCCESS").write_bytes(b"")


def test_index_takes_exactly_the_files_dataset_opens_in_a_spark_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "spark"
    start = 1_714_564_800_000
    records = [{"day": [1], "t_ms": [start + 8000 * i], "x": [i]} for i in range(5)]
    _spark_output(folder, [records[:3], records[3:]])
    opened = shardfeed.Dataset(str(folder))
    try:
        opened_files = [Path(u).name for u in opened.shard_urls]
        opened_records = len(opened)
    finally:
        opened.close()
    assert main(["index", str(folder), "--group-key", "day", "--order-key", "t_ms",
                 "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "indexed 5 records in 2 files" in out
    manifest = json.loads((folder / "shardfeed.json").read_text())
    assert [s["path"] for s in manifest["shards"]] == opened_files == [
        "part-r-00000", "part-r-00001"]
    assert manifest["records"] == opened_records == 5
    assert manifest["extra"]["order_key_unit"] == "ms"
    ds = shardfeed.Dataset(str(folder))
    try:
        assert ds.order_keys is not None
        assert np.diff(ds.order_keys).tolist() == [8.0] * 4  # epoch ms, not 8000 s
        assert len(shardfeed.Windows(ds, length=2, stride_seconds=8.0)) == 4
    finally:
        ds.close()


def test_plurals_in_pack_and_index_output(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    _jpeg(tmp_path / "one" / "a.jpg", 1)
    assert main(["pack", str(tmp_path / "one"), str(tmp_path / "out"), "--no-progress"]) == 0
    assert "packed 1 record into 1 shard," in capsys.readouterr().out
    assert main(["index", str(tmp_path / "out" / "shard-00000-of-00001.tfrecord"),
                 "--manifest", str(tmp_path / "m.json"), "--no-progress"]) == 0
    assert "indexed 1 record in 1 file" in capsys.readouterr().out
