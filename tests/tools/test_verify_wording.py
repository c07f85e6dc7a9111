"""``verify --decode`` says what it decoded: "9 images decoded" for a dataset of images
only (it said "9 images and masks"), images and masks counted apart where there are masks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardfeed.cli.main import main
from shardfeed.tools.pack import pack
from shardfeed.tools.pack.csvinput import CsvColumns


def _verify(folder: Path, capsys: pytest.CaptureFixture[str]) -> tuple[str, dict]:  # type: ignore[type-arg]
    assert main(["verify", str(folder), "--decode", "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert main(["verify", str(folder), "--decode", "--no-progress", "--json"]) == 0
    return text, json.loads(capsys.readouterr().out)


def test_images_only_are_not_called_masks(
    class_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pack(class_folder, tmp_path / "out")
    capsys.readouterr()
    text, report = _verify(tmp_path / "out", capsys)
    assert text.strip().splitlines()[-1] == "ok: 9 records in 1 shard, 9 images decoded"
    assert "mask" not in text
    assert (report["decoded"], report["images_decoded"], report["masks_decoded"]) == (9, 9, 0)


def test_images_and_masks_are_counted_apart(
    frames_csv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pack(frames_csv, tmp_path / "out", csv=CsvColumns(labels=("label",), mask="mask"))
    capsys.readouterr()
    text, report = _verify(tmp_path / "out", capsys)
    assert text.strip().splitlines()[-1] == (
        "ok: 12 records in 1 shard, 12 images and 12 masks decoded")
    assert (report["decoded"], report["images_decoded"], report["masks_decoded"]) == (24, 12, 12)
    assert [s["masks_decoded"] for s in report["shards"]] == [12]
