"""shuffle_report: labels from an array or a dataset, the summary, the plots."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shardfeed.errors import SchemaError
from shardfeed.tools.shuffle_report import read_labels, shuffle_report

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SORTED_LABELS = np.repeat(np.arange(10), 7_000)  # 70,000 label-sorted records


def png_size(path: Path) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk, after checking the signature."""
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


@dataclass
class FakeSchema:
    label_key: str | None
    features: dict[str, Any] = field(default_factory=dict)


@dataclass
class FakeShard:
    records: int


@dataclass
class FakeManifest:
    shards: list[FakeShard]


class FakeDataset:
    """The Dataset contract the report relies on: len, read_many, schema, manifest, close."""

    def __init__(self, labels: list[Any], *, label_key: str | None = "image/class/label",
                 shard_sizes: list[int] | None = None) -> None:
        self.labels = labels
        self.schema = FakeSchema(label_key)
        self.manifest = None if shard_sizes is None else FakeManifest(
            [FakeShard(s) for s in shard_sizes]
        )
        self.calls: list[int] = []

    def __len__(self) -> int:
        return len(self.labels)

    def read_many(self, indices: Any) -> list[dict[str, Any]]:
        indices = list(indices)
        self.calls.append(len(indices))
        return [
            {"image/encoded": b"jpeg", "image/class/label": np.array([self.labels[i]])}
            if isinstance(self.labels[i], int)
            else {"image/encoded": b"jpeg", "image/class/label": self.labels[i]}
            for i in indices
        ]

    def locate(self, i: int) -> tuple[str, int, int]:
        return ("train-00000.tfrecord", i, 100 * i)


def test_report_on_label_sorted_array_shows_the_buffer_bias(tmp_path: Path) -> None:
    report = shuffle_report(SORTED_LABELS, buffer_size=10_000, out_dir=tmp_path)
    json.dumps(report)  # plain JSON types only
    assert report["records"] == 70_000
    assert report["classes"] == 10
    orders = report["orders"]
    assert set(orders) == {"stored", "shardfeed", "buffer"}
    assert orders["stored"]["spearman_rho"] == pytest.approx(1.0)
    assert 0.85 < orders["buffer"]["spearman_rho"] < 0.95
    assert orders["buffer"]["latest_label"] == "9"
    assert orders["buffer"]["latest_first_position"] > 40_000
    assert orders["buffer"]["chi2_p_value"] < 1e-6
    assert abs(orders["shardfeed"]["spearman_rho"]) < 0.02
    assert orders["shardfeed"]["chi2_p_value"] > 1e-4
    assert orders["shardfeed"]["latest_first_position"] < 200
    assert orders["shardfeed"]["mean_labels_per_batch"] == pytest.approx(
        report["expected_labels_per_batch"], abs=0.05
    )
    assert orders["buffer"]["mean_labels_per_batch"] < 8
    for name in ("position_vs_index", "label_vs_position"):
        path = Path(report["plots"][name])
        assert path.parent == tmp_path
        width, height = png_size(path)
        assert width >= 800 and height >= 300


def test_report_uses_the_exact_epoch_order() -> None:
    from shardfeed.sampling.permutation import EpochOrder
    from shardfeed.tools.shuffle_report.stats import spearman_rho

    labels = np.arange(5_000) % 7
    report = shuffle_report(labels, seed=3, epoch=2, buffer_size=100)
    exact = EpochOrder(5_000, seed=3, epoch=2, shuffle=True)[0:5_000]
    assert report["orders"]["shardfeed"]["spearman_rho"] == pytest.approx(spearman_rho(exact))
    other = shuffle_report(labels, seed=3, epoch=3, buffer_size=100)
    assert other["orders"]["shardfeed"] != report["orders"]["shardfeed"]
    assert other["orders"]["buffer"] != report["orders"]["buffer"]


def test_file_shuffle_needs_shard_sizes_that_add_up() -> None:
    with pytest.raises(ValueError, match="shard_sizes"):
        shuffle_report(SORTED_LABELS[:1000], file_shuffle=True)
    with pytest.raises(ValueError, match="add up to 900 records but there are 1000"):
        shuffle_report(SORTED_LABELS[:1000], file_shuffle=True, shard_sizes=[300] * 3)
    report = shuffle_report(SORTED_LABELS, file_shuffle=True, shard_sizes=[7_000] * 10)
    shuffled_files = report["orders"]["file+buffer"]
    # shards in random order: rho falls, but the chi-square test still sees the bias
    assert abs(shuffled_files["spearman_rho"]) < 0.6
    assert shuffled_files["chi2_p_value"] < 1e-6


def test_report_reads_labels_from_a_dataset_in_chunks(tmp_path: Path) -> None:
    labels = [int(v) for v in np.repeat(np.arange(4), 5_000)]
    dataset = FakeDataset(labels, shard_sizes=[5_000] * 4)
    seen: list[tuple[int, int]] = []
    report = shuffle_report(
        dataset, buffer_size=1_000, file_shuffle=True, progress=lambda d, t: seen.append((d, t)),
        out_dir=tmp_path / "plots",
    )
    assert sum(dataset.calls) == 20_000 and max(dataset.calls) > 1_000  # large chunks
    assert seen[-1] == (20_000, 20_000)
    assert report["label_key"] == "image/class/label"
    assert report["classes"] == 4
    assert report["orders"]["buffer"]["latest_first_position"] > 10_000
    assert "file+buffer" in report["orders"]
    assert png_size(tmp_path / "plots" / "label_vs_position.png")[0] > 0


def test_string_and_one_hot_labels_become_classes() -> None:
    names = [b"cat", b"dog", b"eel"]
    dataset = FakeDataset([names[i // 100] for i in range(300)])
    report = shuffle_report(dataset, buffer_size=10)
    assert report["class_names"] == ["cat", "dog", "eel"]
    assert report["orders"]["buffer"]["latest_label"] == "eel"
    one_hot = np.eye(3, dtype=np.int64)[np.repeat(np.arange(3), 50)]
    report = shuffle_report(one_hot, buffer_size=10)
    assert report["class_names"] == ["0", "1", "2"]  # one-hot: the class is where the 1 is
    multi_hot = np.array([[1, 1, 0], [0, 1, 1]] * 20)  # several labels a record: no class
    with pytest.raises(ValueError, match="3 values a record"):
        shuffle_report(multi_hot, buffer_size=10)


def test_labels_that_are_not_classes_are_refused() -> None:
    with pytest.raises(ValueError, match=r"label array holds float values \(e.g. 0.25, 0.5"):
        shuffle_report(np.tile([0.25, 0.5, 0.75], 100))
    with pytest.raises(ValueError, match="varying number of values a record"):
        shuffle_report(FakeDataset([[1, 2], [3]] * 10, label_key="image/class/label"))
    with pytest.raises(ValueError, match="60 distinct values in 100 records"):
        shuffle_report(np.arange(100) % 60)
    floats = FakeDataset([float(i % 3) for i in range(30)])
    with pytest.raises(ValueError, match=r"'image/class/label' holds float values.*--label-key"):
        shuffle_report(floats)
    # a schema that says float: refused before a single record is read
    from shardfeed.format.schema import FeatureInfo

    scored = FakeDataset([0.5] * 30, label_key="score")
    scored.schema.features["score"] = FeatureInfo("score", "float", 1)
    scored.schema.features["image/class/label"] = FeatureInfo("image/class/label", "int64", 1)
    with pytest.raises(ValueError, match="such as 'image/class/label'"):
        shuffle_report(scored)
    assert scored.calls == []
    # half the records as classes is still classes: two records a class
    assert shuffle_report(np.arange(100) % 50, buffer_size=10)["classes"] == 50


def test_missing_label_feature_names_the_record_and_the_fix() -> None:
    dataset = FakeDataset([1, 2, 3], label_key=None)
    # no label key in the schema and none given: position statistics only
    report = shuffle_report(dataset)
    assert report["classes"] is None
    assert report["orders"]["buffer"]["label_first_positions"] is None
    with pytest.raises(SchemaError, match=r"record 0 at byte 0 has no feature 'label'.*label_key"):
        read_labels(dataset, "label")


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="buffer_size must be >= 1"):
        shuffle_report(SORTED_LABELS, buffer_size=0)
    with pytest.raises(TypeError, match="batch_size must be an int"):
        shuffle_report(SORTED_LABELS, batch_size=2.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least 2"):
        shuffle_report(np.array([1]))
    with pytest.raises(TypeError, match="one label"):
        shuffle_report(np.zeros((2, 2, 2)))


def _write_dataset(folder: Path, labels: np.ndarray, shards: int) -> None:
    from shardfeed.format.writer import ShardWriter

    folder.mkdir()
    for k, part in enumerate(np.array_split(labels, shards)):
        with ShardWriter(folder / f"train-{k:05d}.tfrecord") as writer:
            for label in part.tolist():
                writer.write_example({"image/encoded": b"x" * 10, "image/class/label": [label]})


def test_report_on_real_tfrecord_shards(tmp_path: Path) -> None:
    dataset_module = pytest.importorskip("shardfeed.dataset")
    if not hasattr(dataset_module, "Dataset"):
        pytest.skip("shardfeed.dataset.Dataset is not available yet")
    labels = np.repeat(np.arange(5), 400)
    _write_dataset(tmp_path / "data", labels, shards=4)
    report = shuffle_report(tmp_path / "data", buffer_size=100, out_dir=tmp_path / "out")
    assert report["records"] == 2_000
    assert report["classes"] == 5
    assert report["orders"]["stored"]["label_first_positions"] == {
        "0": 0, "1": 400, "2": 800, "3": 1_200, "4": 1_600,
    }
    assert report["orders"]["buffer"]["spearman_rho"] > 0.9
