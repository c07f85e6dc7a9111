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
    assert buffer_row.endswith("NOT UNIFORM") and exact_row.endswith("looks uniform")
    assert stored_row.endswith("NOT UNIFORM")
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


def _rows(text: str) -> dict[str, str]:
    """The table's rows by order: stored, shardfeed, buffer, file+buffer."""
    starts = {"no shuffle (order on disk)": "stored", "shardfeed exact shuffle": "shardfeed",
              "shuffle buffer (": "buffer", "shard shuffle + buffer (": "file+buffer"}
    return {
        name: line for line in text.splitlines() for start, name in starts.items()
        if line.strip().startswith(start)
    }


def _verdict(row: str) -> str:
    for verdict in ("NOT UNIFORM", "looks uniform", "too small to tell"):
        if row.endswith(verdict):
            return verdict
    raise AssertionError(f"no verdict at the end of {row!r}")


def _tiny_shards(folder: Path, labels: np.ndarray, shards: int,
                 floats: np.ndarray | None = None) -> None:
    """Records with only an int label (and a float score): the report reads nothing else."""
    from shardfeed.format.writer import ShardWriter

    folder.mkdir()
    scores = np.zeros(labels.size) if floats is None else floats
    parts = np.array_split(np.arange(labels.size), shards)
    for k, part in enumerate(parts):
        with ShardWriter(folder / f"train-{k:05d}.tfrecord") as writer:
            for i in part.tolist():
                writer.write_example({"image/encoded": b"x", "label": [int(labels[i])],
                                      "score": [float(scores[i])]})


def test_readme_tour_buffer_is_not_uniform(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """README's 5-minute tour: 36 photos in 3 class folders, packed, then the shuffle report
    with a buffer of 10. Its buffer has rho about +0.7: the verdict must say so."""
    import cv2

    rng = np.random.default_rng(20240501)
    for name in ("cat", "dog", "fox"):
        (tmp_path / "photos" / name).mkdir(parents=True)
        for i in range(12):
            pixels = rng.integers(0, 256, (24, 32, 3), dtype=np.uint8)
            cv2.imwrite(str(tmp_path / "photos" / name / f"{i:03d}.jpg"), pixels)
    monkeypatch.chdir(tmp_path)
    assert main(["pack", "photos/", "out/", "--shard-size", "64MB", "--no-progress"]) == 0
    capsys.readouterr()

    assert main(["shuffle-report", "out/", "--buffer", "10", "--batch", "8",
                 "--out", "report/"]) == 0
    text = capsys.readouterr().out
    rows = _rows(text)
    assert "36 records, 3 classes in 'image/class/label'" in text
    assert _verdict(rows["stored"]) == "NOT UNIFORM"
    assert _verdict(rows["buffer"]) == "NOT UNIFORM"
    assert _verdict(rows["shardfeed"]) == "looks uniform"
    assert "at 36 records a uniform shuffle keeps |rho| below" in text
    assert (tmp_path / "report" / "label_vs_position.png").is_file()

    assert main(["shuffle-report", "out/", "--buffer", "10", "--batch", "8", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    buffer = report["orders"]["buffer"]
    assert buffer["spearman_rho"] > report["tests"]["rho_limit"]
    assert buffer["verdict"] == "not uniform" and buffer["p_value"] < report["tests"]["alpha"]
    assert report["orders"]["shardfeed"]["verdict"] == "looks uniform"
    assert report["tests"]["tests"] == ["rho", "chi2", "last_class"]
    assert report["tests"]["chi2_bins"] == 2  # 36 records: 2 x 2 keeps 9 expected a cell


def test_large_sorted_dataset_flags_the_buffer_and_passes_the_exact_shuffle(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    labels = np.repeat(np.arange(8), 500)  # 4,000 records sorted by class
    _tiny_shards(tmp_path / "data", labels, shards=4)
    code = main(["shuffle-report", str(tmp_path / "data"), "--label-key", "label",
                 "--buffer", "500", "--file-shuffle", "--batch", "32", "--seed", "3"])
    assert code == 0
    text = capsys.readouterr().out
    rows = _rows(text)
    assert "4,000 records, 8 classes in 'label'" in text
    assert _verdict(rows["buffer"]) == "NOT UNIFORM"
    assert _verdict(rows["file+buffer"]) == "NOT UNIFORM"
    assert _verdict(rows["shardfeed"]) == "looks uniform"
    assert _verdict(rows["stored"]) == "NOT UNIFORM"


def test_float_labels_are_refused_naming_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    labels = np.repeat(np.arange(3), 120)
    _tiny_shards(tmp_path / "data", labels, shards=1,
                 floats=np.random.default_rng(0).random(labels.size))
    assert main(["shuffle-report", str(tmp_path / "data"), "--label-key", "score"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert "'score' holds float values" in captured.err
    assert "--label-key" in captured.err and "'label'" in captured.err  # the class feature


def test_float_label_vectors_from_a_csv_pack_are_refused(
    small_csv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A CSV packed with float columns only: the schema's label is a float vector."""
    out = tmp_path / "floats"
    assert main(["pack", str(small_csv), str(out), "--csv-floats", "F0..F1",
                 "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["shuffle-report", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "'labels' holds 2 values a record" in err and "--label-key" in err


def test_identifiers_are_not_classes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "ids.npy"
    np.save(path, np.arange(100))
    assert main(["shuffle-report", str(path)]) == 2
    err = capsys.readouterr().err
    assert "100 distinct values in 100 records" in err and "not a class" in err


def test_too_few_records_to_tell(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "five.npy"
    np.save(path, np.array([0, 0, 1, 1, 1]))
    assert main(["shuffle-report", str(path), "--buffer", "2"]) == 0
    text = capsys.readouterr().out
    rows = _rows(text)
    assert {_verdict(row) for row in rows.values()} == {"too small to tell"}
    assert "5 records, 2 classes" in text
    assert "the rank test cannot flag any rho" in text


def test_one_class_is_worded_as_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "one.npy"
    np.save(path, np.zeros(100, dtype=np.int64))
    assert main(["shuffle-report", str(path), "--buffer", "10"]) == 0
    text = capsys.readouterr().out
    assert "100 records, 1 class;" in text


def test_json_names_the_classes_the_pack_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["examples", str(tmp_path / "ex")]) == 0
    capsys.readouterr()
    assert main(["shuffle-report", str(tmp_path / "ex" / "out"), "--buffer", "4", "--batch", "8",
                 "--json", "--no-progress"]) == 0
    assert json.loads(capsys.readouterr().out)["class_names"] == ["cat", "dog", "fox"]
