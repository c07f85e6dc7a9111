"""Gather: 23 scalar float features per record (a time-lapse frame's VF, IRR0..IRR21) become
one (B, 23) float32 target, on the batch path and sample by sample, with records that lack a
feature (FeatureSpec defaults) and with Windows (the last frame's vector)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import simplejpeg

from shardfeed.dataset import Dataset
from shardfeed.errors import SchemaError
from shardfeed.format.example import FeatureSpec
from shardfeed.format.writer import ShardWriter
from shardfeed.pipeline import Loader
from shardfeed.pipeline.windows import Windows
from shardfeed.tools.index import index_files
from shardfeed.transforms import Compose, Gather, presets

KEYS = ["VF"] + [f"IRR{j}" for j in range(22)]
RECORDS = 20


def value(i: int, j: int) -> float:
    return float(i * 100 + j) / 4  # exact in float32


def row(i: int) -> np.ndarray:
    return np.array([value(i, j) for j in range(len(KEYS))], np.float32)


def write_frames(folder: Path, *, lacking: int | None = None) -> Path:
    """Records of 23 scalar float features, a JPEG, a day (2 days of 10) and a time;
    ``lacking``: that record has no IRR5."""
    folder.mkdir()
    image = simplejpeg.encode_jpeg(np.full((24, 32, 3), 90, np.uint8))
    for shard, ids in enumerate((range(10), range(10, RECORDS))):
        with ShardWriter(str(folder / f"part-{shard}.tfrecord")) as writer:
            for i in ids:
                features: dict[str, Any] = {"image/encoded": image, "index": [i],
                                            "day": [i // 10], "timestamp": [8.0 * (i % 10)]}
                for j, key in enumerate(KEYS):
                    if not (i == lacking and key == "IRR5"):
                        features[key] = [value(i, j)]
                writer.write_example(features)
    return folder


@pytest.fixture(scope="module")
def frames(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_frames(tmp_path_factory.mktemp("gather") / "frames")


def _batches(loader: Loader) -> list[dict[str, Any]]:
    with loader:
        return [{k: np.array(v) for k, v in b.items()} for b in loader]


@pytest.mark.parametrize("with_image", [False, True])
def test_23_features_become_one_b_by_23_target(frames: Path, with_image: bool,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    gather = Gather(KEYS, into="labels", dtype="float32")
    transform = Compose([presets.eval(size=16), gather]) if with_image else gather
    batch_rows = []
    apply_batch = Gather.apply_batch

    def counted(self: Gather, *args: Any) -> Any:
        result = apply_batch(self, *args)
        batch_rows.append(result is not None)
        return result

    monkeypatch.setattr(Gather, "apply_batch", counted)
    batches = _batches(Loader(Dataset(str(frames)), batch_size=8, transform=transform,
                              shuffle=False))
    assert batch_rows and all(batch_rows)  # the batch path kept (slices, not samples)
    first = batches[0]
    assert first["labels"].shape == (8, 23) and first["labels"].dtype == np.float32
    assert not set(KEYS) & set(first)  # the 23 columns are replaced by one
    if with_image:
        assert first["image"].shape == (8, 16, 16, 3)
    labels = np.concatenate([b["labels"] for b in batches])
    ids = np.concatenate([b["index"] for b in batches]).reshape(-1)
    np.testing.assert_array_equal(labels, np.stack([row(int(i)) for i in ids]))


def test_sample_by_sample_gives_the_same_rows(frames: Path) -> None:
    """A plain-function transform before it: no batch form, every sample on its own."""
    def passthrough(sample: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
        return sample

    transform = Compose([passthrough, Gather(KEYS, into="labels")])
    batches = _batches(Loader(Dataset(str(frames)), batch_size=8, transform=transform,
                              shuffle=True, seed=3))
    for b in batches:
        expected = np.stack([row(int(i)) for i in b["index"].reshape(-1)])
        np.testing.assert_array_equal(b["labels"], expected)


def test_a_record_lacking_a_feature_takes_its_default(tmp_path: Path) -> None:
    folder = write_frames(tmp_path / "f", lacking=6)
    spec = {key: FeatureSpec("float", shape=(), default=-1.0) for key in KEYS}
    spec["index"] = FeatureSpec("int64", shape=())
    loader = Loader(Dataset(str(folder), features=spec), batch_size=4,
                    transform=Gather(KEYS, into="labels"), shuffle=False)
    labels = np.concatenate([b["labels"] for b in _batches(loader)])
    assert labels.shape == (RECORDS, 23) and labels.dtype == np.float32
    expected = row(6)
    expected[KEYS.index("IRR5")] = -1.0
    np.testing.assert_array_equal(labels[6], expected)
    np.testing.assert_array_equal(labels[7], row(7))


def test_a_missing_feature_without_default_names_it(tmp_path: Path) -> None:
    folder = write_frames(tmp_path / "f", lacking=2)
    loader = Loader(Dataset(str(folder)), batch_size=4, shuffle=False,
                    transform=Gather(KEYS, into="labels"))
    with pytest.raises(SchemaError, match="no feature 'IRR5'.*default"):
        _batches(loader)


def test_windows_take_the_last_frames_vector(tmp_path: Path) -> None:
    folder = write_frames(tmp_path / "days")
    index_files(folder, group_key="day", order_key="timestamp")
    windows = Windows(Dataset(str(folder)), length=3, stride=2)
    transform = Compose([presets.eval(size=16), Gather(KEYS, into="labels")])
    batches = _batches(Loader(windows, batch_size=4, transform=transform, shuffle=True,
                              seed=1))
    for b in batches:
        assert b["image"].shape == (4, 3, 16, 16, 3)
        assert b["labels"].shape == (4, 23) and b["labels"].dtype == np.float32
        assert b["timestamp"].shape == (4, 3)  # the order key: one a frame
        last = b["index"]  # a numeric feature: a label, the last frame's like "labels"
        assert (b["timestamp"][:, -1] == 8.0 * (last % 10)).all()
        np.testing.assert_array_equal(b["labels"], np.stack([row(int(i)) for i in last]))
    assert sum(len(b["labels"]) for b in batches) == len(windows)


def test_one_call() -> None:
    sample = {"a": np.array([1.5], np.float32), "b": np.int64(2), "c": np.array([3, 4]),
              "name": b"x"}
    out = Gather(["c", "a", "b"], into="y")(sample, None)  # type: ignore[arg-type]
    assert out["y"].tolist() == [3.0, 4.0, 1.5, 2.0] and out["y"].dtype == np.float32
    assert set(out) == {"name", "y"}
    kept = Gather(["a", "b"], into="y", dtype="float64", keep=True)(sample, None)  # type: ignore[arg-type]
    assert set(kept) == {"a", "b", "c", "name", "y"} and kept["y"].dtype == np.float64
    ints = Gather(["b", "c"], into="y", dtype="int32")(sample, None)  # type: ignore[arg-type]
    assert ints["y"].tolist() == [2, 3, 4] and ints["y"].dtype == np.int32


@pytest.mark.parametrize(("keys", "dtype", "match"), [
    (["name"], "float32", "'name' holds .*not numbers"),
    (["a"], "int64", "'a' holds floats"),
    (["big"], "int32", "do not fit int32"),
])
def test_values_that_do_not_fit(keys: list[str], dtype: Any, match: str) -> None:
    sample = {"a": np.array([1.5], np.float32), "name": b"x", "big": np.array([2**40])}
    with pytest.raises(SchemaError, match=match):
        Gather(keys, into="y", dtype=dtype)(sample, None)  # type: ignore[arg-type]


@pytest.mark.parametrize(("args", "options", "error"), [
    ("VF", {"into": "y"}, TypeError),
    ([], {"into": "y"}, ValueError),
    (["a", "a"], {"into": "y"}, ValueError),
    (["a"], {"into": ""}, ValueError),
    (["a"], {"into": "y", "dtype": "float16"}, ValueError),
    (["a", "y"], {"into": "y", "keep": True}, ValueError),
])
def test_bad_arguments_fail_at_construction(args: Any, options: dict[str, Any],
                                            error: type[Exception]) -> None:
    with pytest.raises(error):
        Gather(args, **options)
