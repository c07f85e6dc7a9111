"""The shuffle-report command: table, --json, plots, errors, help."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from shardfeed.cli.main import main


@pytest.fixture
def sorted_labels(tmp_path: Path) -> Path:
    path = tmp_path / "labels.npy"
    np.save(path, np.repeat(np.arange(10), 2_000))  # 20,000 label-sorted records
    return path


def test_json_output_parses_and_has_the_fields(
    sorted_labels: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["shuffle-report", str(sorted_labels), "--buffer", "2000", "--seed", "4",
                 "--epoch", "1", "--batch", "64", "--json"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["records"] == 20_000
    assert (report["seed"], report["epoch"], report["buffer_size"], report["batch_size"]) == (
        4, 1, 2_000, 64
    )
    assert report["source"] == str(sorted_labels)
    assert set(report["orders"]) == {"stored", "shardfeed", "buffer"}
    for stats in report["orders"].values():
        assert {"spearman_rho", "mean_abs_displacement", "chi2", "chi2_dof", "chi2_p_value",
                "latest_label", "latest_first_position", "mean_labels_per_batch",
                "label_first_positions", "description"} <= set(stats)
    assert report["orders"]["buffer"]["spearman_rho"] > 0.85
    assert abs(report["orders"]["shardfeed"]["spearman_rho"]) < 0.05


def test_table_says_which_order_is_biased(
    sorted_labels: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "report"
    assert main(["shuffle-report", str(sorted_labels), "--buffer", "2000", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    buffer_row = next(line for line in text.splitlines() if "shuffle buffer (2,000)" in line)
    exact_row = next(line for line in text.splitlines() if "shardfeed exact shuffle" in line)
    stored_row = next(line for line in text.splitlines() if "order on disk" in line)
    assert "BIASED" in buffer_row and "looks uniform" in exact_row
    assert "not shuffled" in stored_row
    assert "20,000 records, 10 classes" in text
    assert (out / "position_vs_index.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "label_vs_position.png").stat().st_size > 10_000
    assert str(out / "position_vs_index.png") in text


def test_file_shuffle_on_labels_only_is_a_usage_error(
    sorted_labels: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["shuffle-report", str(sorted_labels), "--file-shuffle"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--file-shuffle needs shards" in err


def test_bad_buffer_is_refused_by_argparse(sorted_labels: Path) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["shuffle-report", str(sorted_labels), "--buffer", "0"])
    assert exit_info.value.code == 2


def test_help_teaches_with_examples(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["shuffle-report", "--help"])
    text = capsys.readouterr().out
    assert "examples:" in text and "shardfeed shuffle-report data/train --out report/" in text
    for option in ("--label-key", "--buffer", "--seed", "--epoch", "--file-shuffle", "--batch",
                   "--out", "--json"):
        assert option in text


def test_on_real_shards(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dataset_module = pytest.importorskip("shardfeed.dataset")
    if not hasattr(dataset_module, "Dataset"):
        pytest.skip("shardfeed.dataset.Dataset is not available yet")
    from shardfeed.format.writer import ShardWriter

    files = []
    for k in range(3):
        path = tmp_path / f"part-{k}.tfrecord"
        with ShardWriter(path) as writer:
            for i in range(300):
                writer.write_example({"image/encoded": b"x", "label": [k]})
        files.append(str(path))
    code = main(["shuffle-report", *files, "--label-key", "label", "--buffer", "50",
                 "--file-shuffle", "--json"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["records"] == 900 and report["classes"] == 3
    assert report["label_key"] == "label"
    assert "file+buffer" in report["orders"]
