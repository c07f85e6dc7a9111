"""pack with bad inputs: every bad file listed before anything is written, --skip-bad,
--check-decode, masks of the wrong size, non-image files reported, reruns and resumes."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import simplejpeg

import shardfeed
from shardfeed.tools.pack import output as packoutput
from shardfeed.tools.pack import pack
from shardfeed.tools.pack.check import BadInputsError, check_item, jpeg_end
from shardfeed.tools.pack.csvinput import CsvColumns
from shardfeed.tools.pack.items import PackItem


def _jpeg(seed: int, size: tuple[int, int] = (20, 24)) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (*size, 3), dtype=np.uint8)
    return bytes(simplejpeg.encode_jpeg(pixels, quality=90))


def _png(seed: int, size: tuple[int, int] = (20, 24)) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)
    ok, data = cv2.imencode(".png", pixels)
    assert ok
    return data.tobytes()


@pytest.fixture
def damaged_folder(class_folder: Path) -> Path:
    """The class folder plus four bad images, a GIF and a text file."""
    good = (class_folder / "cat" / "cat0.jpg").read_bytes()
    (class_folder / "cat" / "half.jpg").write_bytes(good[: len(good) // 2])
    (class_folder / "dog" / "empty.jpg").write_bytes(b"")
    (class_folder / "dog" / "notes.jpg").write_bytes(b"these are my notes\n")
    png = (class_folder / "dog" / "dog1.png").read_bytes()
    (class_folder / "emu" / "cut.png").write_bytes(png[:-30])
    ok, gif = cv2.imencode(".gif", np.full((20, 24, 3), 90, np.uint8))
    assert ok
    (class_folder / "emu" / "anim.gif").write_bytes(gif.tobytes())
    (class_folder / "emu" / "readme.txt").write_text("emus")
    return class_folder


BAD = {"half.jpg": "truncated JPEG", "empty.jpg": "empty (0 bytes)",
       "notes.jpg": "not an image", "cut.png": "truncated PNG"}


def test_every_bad_file_is_listed_and_nothing_is_written(damaged_folder: Path,
                                                          tmp_path: Path) -> None:
    out = tmp_path / "out"
    with pytest.raises(BadInputsError, match="4 input files.*nothing was written") as caught:
        pack(damaged_folder, out, records_per_shard=2, workers=3)
    found = {Path(p.path).name: p.problem for p in caught.value.problems}
    assert set(found) == set(BAD)
    for name, what in BAD.items():
        assert what in found[name]
    assert not out.exists()
    # the user removes the bad files; the same command now works
    for name in BAD:
        next(damaged_folder.rglob(name)).unlink()
    result = pack(damaged_folder, out, records_per_shard=2, workers=3)
    assert result.records == 10  # 9 images + the GIF
    assert result.ignored == (str(damaged_folder / "emu" / "readme.txt"),)


def test_skip_bad_packs_the_rest_and_lists_what_was_skipped(damaged_folder: Path,
                                                           tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = pack(damaged_folder, out, records_per_shard=4, skip_bad=True)
    assert result.records == 10
    assert result.skipped_list == str(out / "skipped.csv")
    with open(out / "skipped.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    listed = {Path(r["path"]).name: r["problem"] for r in rows}
    assert set(listed) == set(BAD) | {"readme.txt"}
    assert "not an image file (.txt)" in listed["readme.txt"]
    ds = shardfeed.Dataset(str(out))
    try:
        names = {ds[i]["image/filename"].decode() for i in range(len(ds))}
        assert "emu/anim.gif" in names and not {n for n in names if n.split("/")[-1] in BAD}
        with shardfeed.Loader(ds, batch_size=10,
                              transform=shardfeed.presets.eval(size=16)) as loader:
            assert next(iter(loader))["image"].shape == (10, 16, 16, 3)  # all decode
    finally:
        ds.close()


def test_every_truncation_of_a_jpeg_or_png_is_caught(tmp_path: Path) -> None:
    for kind, data in (("jpg", _jpeg(1)), ("png", _png(2))):
        for cut in range(1, len(data), max(1, len(data) // 97)):
            path = tmp_path / f"t.{kind}"
            path.write_bytes(data[:cut])
            problems = check_item(PackItem(str(path), "t", 0), decode=False, line=None)
            assert problems, f"{kind} cut at {cut} of {len(data)} bytes passed the check"
        path.write_bytes(data)
        assert check_item(PackItem(str(path), "t", 0), decode=False, line=None) == []


def test_jpeg_with_data_after_its_end_marker_is_whole(tmp_path: Path) -> None:
    """Motion photos append a video after the JPEG's end marker: still a whole JPEG."""
    data = _jpeg(3)
    path = tmp_path / "motion.jpg"
    path.write_bytes(data + b"\x00\x00\x00\x18ftypmp42" + bytes(range(256)) * 4)
    assert jpeg_end(path.read_bytes()) == len(data)
    assert check_item(PackItem(str(path), "m", 0), decode=True, line=None) == []


def test_check_decode_finds_damaged_data_inside_a_complete_jpeg(class_folder: Path,
                                                                 tmp_path: Path) -> None:
    data = bytearray(_jpeg(4))
    scan = data.index(b"\xff\xda") + 40
    data[scan : scan + 20] = b"\xff\xc4" * 10  # garbage in the image data; the end is intact
    (class_folder / "cat" / "garbled.jpg").write_bytes(bytes(data))
    assert pack(class_folder, tmp_path / "fast").records == 10  # headers and ends look fine
    with pytest.raises(BadInputsError, match=r"garbled\.jpg' does not decode") as caught:
        pack(class_folder, tmp_path / "slow", check="decode")
    assert len(caught.value.problems) == 1
    assert not (tmp_path / "slow").exists()


def test_mask_of_another_size_is_refused_with_both_sizes(tmp_path: Path) -> None:
    (tmp_path / "a.jpg").write_bytes(_jpeg(5, (20, 24)))
    (tmp_path / "b.jpg").write_bytes(_jpeg(6, (20, 24)))
    (tmp_path / "a.png").write_bytes(_png(7, (20, 24)))
    (tmp_path / "b.png").write_bytes(_png(8, (24, 20)))  # transposed
    (tmp_path / "d.csv").write_text("path,mask\na.jpg,a.png\nb.jpg,b.png\n")
    with pytest.raises(BadInputsError, match=r"line 3: '.*b\.png' \(mask\) is 24x20 .*"
                       r"'.*b\.jpg' is 20x24") as caught:
        pack(tmp_path / "d.csv", tmp_path / "out", csv=CsvColumns(mask="mask"))
    assert len(caught.value.problems) == 1
    result = pack(tmp_path / "d.csv", tmp_path / "out", csv=CsvColumns(mask="mask"),
                  skip_bad=True)
    assert result.records == 1 and result.skipped[0].line == 3


def test_input_changed_after_an_interrupted_pack_resumes(
    class_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pack stopped after two shards; the user then removes a file of a later shard: the
    resume keeps the two shards, writes the rest, and equals a clean pack of the new input."""
    out = tmp_path / "out"
    real = packoutput.write_shard
    written: list[str] = []

    def stop_after_two(path: str, payloads: Any) -> Any:
        if len(written) == 2:
            raise KeyboardInterrupt
        written.append(path)
        return real(path, payloads)

    monkeypatch.setattr(packoutput, "write_shard", stop_after_two)
    with pytest.raises(KeyboardInterrupt):
        pack(class_folder, out, records_per_shard=3)
    monkeypatch.undo()
    (class_folder / "emu" / "emu3.png").unlink()  # the last shard's
    result = pack(class_folder, out, records_per_shard=3, resume=True)
    assert (result.kept_shards, result.records, result.shards) == (2, 8, 3)
    clean = tmp_path / "clean"
    pack(class_folder, clean, records_per_shard=3)
    assert sorted(os.listdir(out)) == sorted(os.listdir(clean))
    for name in os.listdir(clean):
        if name.endswith(".tfrecord"):
            assert (out / name).read_bytes() == (clean / name).read_bytes()


def test_a_file_that_fails_while_writing_can_be_fixed_and_resumed(
    tmp_path: Path
) -> None:
    """Raw mode decodes while writing: a damage the header check cannot see stops the pack
    with the kept shards named, and --resume after the fix finishes it."""
    rows = ["path"]
    for i in range(6):
        (tmp_path / f"i{i}.jpg").write_bytes(_jpeg(10 + i))
        rows.append(f"i{i}.jpg")
    good = (tmp_path / "i4.jpg").read_bytes()
    data = bytearray(good)
    scan = data.index(b"\xff\xda") + 40
    data[scan : scan + 20] = b"\xff\xc4" * 10
    (tmp_path / "i4.jpg").write_bytes(bytes(data))
    (tmp_path / "d.csv").write_text("\n".join(rows) + "\n")
    out = tmp_path / "out"
    with pytest.raises(shardfeed.PackError, match=r"i4\.jpg.*2 complete shards.*--resume"):
        pack(tmp_path / "d.csv", out, mode="raw", records_per_shard=2)
    (tmp_path / "i4.jpg").write_bytes(good)
    result = pack(tmp_path / "d.csv", out, mode="raw", records_per_shard=2, resume=True)
    assert (result.kept_shards, result.records) == (2, 6)
    manifest = json.loads((out / "shardfeed.json").read_text())
    assert manifest["records"] == 6


def test_overwrite_with_bad_inputs_keeps_the_existing_dataset(damaged_folder: Path,
                                                               class_folder: Path,
                                                               tmp_path: Path) -> None:
    out = tmp_path / "out"
    good = tmp_path / "good"
    for name in ("cat", "dog"):
        (good / name).mkdir(parents=True)
        (good / name / "a.jpg").write_bytes((class_folder / "cat" / "cat0.jpg").read_bytes())
    pack(good, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(BadInputsError):
        pack(damaged_folder, out, overwrite=True)  # checked before anything is deleted
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_ppm_and_pgm_files_pack_as_the_docs_say(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    colour = rng.integers(0, 256, (12, 16, 3), dtype=np.uint8)
    grey = rng.integers(0, 256, (12, 16), dtype=np.uint8)
    for name, pixels in (("a/0.ppm", colour), ("b/0.pgm", grey)):
        (tmp_path / "src" / name).parent.mkdir(parents=True)
        assert cv2.imwrite(str(tmp_path / "src" / name), pixels)
    result = pack(tmp_path / "src", tmp_path / "out", mode="raw")
    assert result.records == 2 and not result.skipped
    with shardfeed.Dataset(str(tmp_path / "out")) as ds:
        shapes = sorted((int(ds[i]["image/height"][0]), int(ds[i]["image/channels"][0]))
                        for i in range(2))
    assert shapes == [(12, 1), (12, 3)]
