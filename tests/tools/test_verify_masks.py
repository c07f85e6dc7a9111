"""`shardfeed verify --decode` checks masks as the Loader reads them, and their sizes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

# The mask file helpers live beside the transforms tests.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "transforms"))
from mask_files import (
    VOC,
    grey16_png,
    index_pattern,
    pack_csv,
    palette_png,
    rgb_png,
    write_foreign_tfrecord,
    write_seg_csv,
)

from shardfeed import Dataset
from shardfeed.cli.main import main

SIZE = 32


def verify_json(folder: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict]:
    code = main(["verify", str(folder), "--decode", "--json", "--no-progress"])
    return code, json.loads(capsys.readouterr().out)


def test_mask_of_another_size_is_a_bad_record(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    masks = [palette_png(index_pattern(SIZE, SIZE, i)) for i in range(4)]
    masks[2] = palette_png(index_pattern(SIZE, SIZE - 5, 2))  # 32×27 for a 32×32 image
    folder = write_foreign_tfrecord(tmp_path / "foreign", masks)
    capsys.readouterr()
    path, record, offset = Dataset(str(folder)).locate(2)
    code, report = verify_json(folder, capsys)
    assert code == 1 and report["ok"] is False
    [problem] = report["problems"]
    assert (problem["path"], problem["record"], problem["offset"]) == (path, record, offset)
    assert problem["kind"] == "mask size differs from image"
    assert "32×27" in problem["detail"] and "32×32" in problem["detail"]

    assert main(["verify", str(folder), "--decode", "--no-progress"]) == 1
    out = capsys.readouterr().out
    assert f"file '{path}', record 2 at byte {offset}: mask size differs from image" in out


def test_palette_masks_pass_and_colour_masks_are_a_warning(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    labels = [index_pattern(SIZE, SIZE, i) for i in range(3)]
    palette = pack_csv(write_seg_csv(tmp_path / "p", [palette_png(m) for m in labels]),
                       tmp_path / "palette")
    capsys.readouterr()
    code, report = verify_json(palette, capsys)
    assert code == 0 and report["decoded"] == 6 and report["warnings"] == []

    colour = pack_csv(write_seg_csv(tmp_path / "c", [rgb_png(VOC[m]) for m in labels]),
                      tmp_path / "colour")
    capsys.readouterr()
    code, report = verify_json(colour, capsys)
    assert code == 0  # the masks decode; a loader reads them given mask_colors
    [warning] = report["warnings"]
    assert warning.startswith("3 masks in file") and "mask_colors" in warning

    wide = pack_csv(write_seg_csv(tmp_path / "w", [grey16_png(m.astype(np.uint16) * 300)
                                                   for m in labels]), tmp_path / "wide")
    capsys.readouterr()
    code, report = verify_json(wide, capsys)
    assert code == 0 and "mask_dtype='uint16'" in report["warnings"][0]


def test_the_tf_guide_layout_is_checked_where_the_user_names_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Features of other names (TensorFlow's guide: image_raw, mask_raw of raw class ids,
    height, width): without names nothing is decoded, and the command says so; with them a
    mask of the wrong size is a bad record, named."""
    import simplejpeg

    from shardfeed.format.writer import ShardWriter

    folder = tmp_path / "guide"
    folder.mkdir()
    with ShardWriter(str(folder / "guide-00000.tfrecord")) as writer:
        for i in range(4):
            pixels = np.full((24, 32, 3), 40 * i, np.uint8)
            mask = np.zeros((24, 32 if i != 2 else 31), np.uint8)  # record 2: a column short
            writer.write_example({"height": [24], "width": [32], "image_raw":
                                  bytes(simplejpeg.encode_jpeg(pixels)),
                                  "mask_raw": mask.tobytes()})
    assert main(["verify", str(folder), "--decode", "--no-progress"]) == 0
    assert "found no image in any record" in capsys.readouterr().out
    named = ["verify", str(folder), "--decode", "--no-progress", "--key", "image_raw",
             "--mask-key", "mask_raw", "--mask-encoding", "raw", "--mask-height-key", "height",
             "--mask-width-key", "width"]
    assert main(named) == 1
    out = capsys.readouterr().out
    assert "record 2" in out and "mask" in out and "4 images and 3 masks decoded" in out
    with pytest.raises(SystemExit, match="--mask-height-key"):
        main(named[:-4])
    with pytest.raises(SystemExit, match="add --decode"):
        main([arg for arg in named if arg != "--decode"])
    assert main(["verify", str(folder), "--decode", "--no-progress", "--json"]) == 0
    assert any("found no image" in w for w in json.loads(capsys.readouterr().out)["warnings"])
