"""The pack / index / inspect / verify commands, run as a user runs them."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from shardfeed.cli.main import main

PACK_ARGS = ["--csv-labels", "label", "--csv-floats", "F0..F1", "--csv-group", "day",
             "--csv-order", "t", "--time-unit", "s", "--records-per-shard", "4",
             "--no-progress"]


def test_pack_inspect_verify(small_csv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert main(["pack", str(small_csv), str(out), *PACK_ARGS]) == 0
    assert "packed 6 records into 2 shards" in capsys.readouterr().out
    assert main(["inspect", str(out), "--records", "1"]) == 0
    text = capsys.readouterr().out
    assert "records   6 in 2 shards" in text and "groups    2 by 'day'" in text
    assert main(["inspect", str(out), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["records"] == 6 and info["groups"]["count"] == 2
    assert main(["verify", str(out), "--decode", "--no-progress"]) == 0
    assert capsys.readouterr().out.startswith("ok: 6 records in 2 shards")


def test_pack_refuses_non_empty_output_with_one_line(small_csv: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert main(["pack", str(small_csv), str(out), *PACK_ARGS]) == 0
    capsys.readouterr()
    assert main(["pack", str(small_csv), str(out), *PACK_ARGS]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--overwrite" in err and str(out) in err
    assert main(["pack", str(small_csv), str(out), *PACK_ARGS, "--overwrite"]) == 0


def test_pack_bad_csv_label_exit_1(small_csv: Path, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pack", str(small_csv), str(tmp_path / "o"), "--csv-labels", "day"]) == 1
    err = capsys.readouterr().err
    assert "line 2, column 'day': 'a' is not an integer" in err and "d.csv" in err


def test_usage_errors_exit_2(small_csv: Path, tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["pack", str(small_csv), str(tmp_path / "o"), "--resume", "--overwrite"])
    assert exc.value.code == 2
    assert main(["pack", str(small_csv), str(tmp_path / "o"), "--shard-size", "lots"]) == 2


def test_verify_json_lists_bad_record_exit_1(tf_fixtures: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["verify", str(tf_fixtures / "damaged-data-crc.tfrecord"),
                 str(tf_fixtures / "mixed.tfrecord"), "--json", "--no-progress"])
    assert code == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False and report["records"] == 42
    assert [(p["record"], p["offset"], p["kind"]) for p in report["problems"]] == [
        (2, 7854, "bad data CRC")]


def test_index_then_inspect(tf_fixtures: Path, tmp_path: Path,
                            capsys: pytest.CaptureFixture[str]) -> None:
    shutil.copy(tf_fixtures / "mixed.tfrecord", tmp_path / "mixed.tfrecord")
    assert main(["index", str(tmp_path / "*.tfrecord"), "--group-key", "day",
                 "--order-key", "timestamp", "--no-progress"]) == 0
    assert "indexed 21 records in 1 file" in capsys.readouterr().out
    assert main(["inspect", str(tmp_path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["groups"]["count"] == 3 and info["mode"] == "tfrecord"
    assert main(["index", str(tf_fixtures / "compressed.tfrecord.gz"),
                 "--manifest", str(tmp_path / "c.json")]) == 1
    assert "--from-tfrecord" in capsys.readouterr().err


def test_help_teaches_with_examples(capsys: pytest.CaptureFixture[str]) -> None:
    for command in ("pack", "index", "inspect", "verify"):
        with pytest.raises(SystemExit) as exc:
            main([command, "--help"])
        assert exc.value.code == 0
        text = capsys.readouterr().out
        assert "examples:" in text and f"shardfeed {command} " in text


def test_python_dash_m_runs(tf_fixtures: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "shardfeed", "verify", str(tf_fixtures / "mixed.tfrecord")],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "ok: 21 records in 1 shard" in proc.stdout


def test_inspect_names_float_label_columns_values_not_classes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["examples", str(tmp_path / "ex")]) == 0
    capsys.readouterr()
    assert main(["inspect", str(tmp_path / "ex" / "days")]) == 0
    text = capsys.readouterr().out
    assert "values    labels: 5 floats (VF, IRR0, IRR1, IRR2, IRR3)" in text
    assert "classes   labels" not in text  # five float columns are no five classes
