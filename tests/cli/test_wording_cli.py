"""What the commands print about counts: '1 shard', '1 record', never '1 shards'; and --version."""

from __future__ import annotations

import re
from importlib.metadata import version
from pathlib import Path

import cv2
import numpy as np
import pytest

from shardfeed.cli.main import main
from shardfeed.tools.wording import count


@pytest.fixture
def one_record(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    """A dataset of one labelled JPEG in one shard, packed with the CLI."""
    pixels = np.random.default_rng(1).integers(0, 256, (16, 20, 3), dtype=np.uint8)
    cv2.imwrite(str(tmp_path / "a.jpg"), pixels)
    (tmp_path / "one.csv").write_text("path,label\na.jpg,0\n")
    out = tmp_path / "ds"
    assert main(["pack", str(tmp_path / "one.csv"), str(out), "--csv-labels", "label",
                 "--no-progress"]) == 0
    capsys.readouterr()
    return out


def _no_false_plural(text: str) -> None:
    wrong = re.findall(r"(?<![\d,.])1 (?:records|shards|classes|threads|batches|samples|"
                       r"frames|images|anchors|groups)\b", text)
    assert not wrong, wrong


def test_count_words() -> None:
    assert count(1, "shard") == "1 shard"
    assert count(0, "shard") == "0 shards"
    assert count(1_200, "record") == "1,200 records"
    assert count(3, "class") == "3 classes" and count(2, "batch") == "2 batches"
    assert count(1, "class") == "1 class"
    assert count(2, "image or mask", "images and masks") == "2 images and masks"


def test_inspect_and_verify_of_one_record(one_record: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(one_record)]) == 0
    text = capsys.readouterr().out
    assert "records   1 in 1 shard," in text
    assert re.search(r"shard-00000-of-00001\.tfrecord  1 record  ", text)
    _no_false_plural(text)
    assert main(["verify", str(one_record), "--decode", "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("ok: 1 record in 1 shard, 1 image decoded\n")  # no masks: none named


def test_bench_of_one_record_on_one_thread(one_record: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", str(one_record), "--size", "16", "--batch", "1", "--threads", "1",
                 "--seconds", "0.2", "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "(1 record), images," in text and ", 1 thread\n" in text
    assert "full decode of 1 record on 1 thread)" in text
    _no_false_plural(text)


def test_bench_windows_names_the_frames(small_csv: Path, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "days"
    assert main(["pack", str(small_csv), str(out), "--csv-labels", "label", "--csv-group", "day",
                 "--csv-order", "t", "--time-unit", "s", "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["bench", str(out), "--windows", "2", "--size", "16", "--batch", "2",
                 "--threads", "1", "--seconds", "0.2", "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "(6 records), windows of 2 frames," in text


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == f"shardfeed {version('shardfeed')}\n"
