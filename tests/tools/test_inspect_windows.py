"""``inspect --windows``: valid windows and what was excluded, in Python, text and JSON."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pipeline"))

from test_windows import DAYS, expected_windows, write_frames

from shardfeed.cli.main import main
from shardfeed.errors import SchemaError
from shardfeed.tools.inspect import inspect


@pytest.fixture(scope="module")
def frames(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_frames(tmp_path_factory.mktemp("inspect-frames"))


def test_window_counts_and_exclusions(frames: Path) -> None:
    info = inspect(frames, windows=3, stride=2)["windows"]
    records = sum(len(t) for t in DAYS.values())
    assert info["count"] == len(expected_windows(DAYS, length=3, stride=2))
    assert info["excluded"]["group_end"] == records - info["count"]
    assert info["groups"] == 4 and info["groups_without_windows"] == 1  # day 2: two frames
    timed = inspect(frames, windows=3, stride_seconds=16, max_gap_seconds=30)["windows"]
    assert timed["count"] == len(expected_windows(DAYS, length=3, stride=2, max_gap=30))
    assert timed["tolerance_seconds"] == 8.0
    assert timed["excluded"]["total"] == records - timed["count"]
    assert timed["excluded"]["gap"] + timed["excluded"]["off_grid"] > 0


def test_cli_text_and_json(frames: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(frames), "--windows", "3", "--stride", "2"]) == 0
    text = capsys.readouterr().out
    assert "windows   10 of 3 frames, stride 2" in text
    assert "1 of 4 groups has no window" in text
    assert main(["inspect", str(frames), "--windows", "3", "--stride-seconds", "16",
                 "--max-gap-seconds", "30", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["windows"]["stride_seconds"] == 16.0
    assert data["windows"]["max_gap_seconds"] == 30.0
    assert set(data["windows"]["excluded"]) == {"group_end", "gap", "missing_time", "off_grid",
                                                "total"}


def test_errors(frames: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plain = write_frames(tmp_path / "plain", index=False)
    with pytest.raises(SchemaError, match="--csv-group"):
        inspect(plain, windows=2)
    assert main(["inspect", str(plain), "--windows", "2"]) == 1
    assert "--group-key" in capsys.readouterr().err
    assert main(["inspect", str(frames), "--stride", "2"]) == 2  # --stride without --windows
    assert "--windows" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["inspect", str(frames), "--windows", "2", "--stride", "2", "--stride-seconds", "8"])
