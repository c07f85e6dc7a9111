"""Manifest and schema: JSON round trips, validation, sidecars, inference from TF records."""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from shardfeed.errors import FormatError, SchemaError
from shardfeed.format.example import decode_example
from shardfeed.format.framing import scan, unframe
from shardfeed.format.manifest import Manifest, ShardInfo, load, load_sidecar, save_sidecars
from shardfeed.format.schema import FeatureInfo, ImageInfo, Schema, infer_schema


def _schema() -> Schema:
    return Schema(
        features={
            "image/encoded": FeatureInfo("image/encoded", "bytes", 1),
            "image/class/label": FeatureInfo("image/class/label", "int64", 1),
            "labels": FeatureInfo("labels", "float", None),
        },
        image=ImageInfo("image/encoded", "jpeg"),
        label_key="image/class/label",
    )


def test_manifest_round_trip(tmp_path: Path) -> None:
    m = Manifest(
        shards=[ShardInfo("a.tfrecord", 3, 100, 5), ShardInfo("b.tfrecord", 2, 50)],
        schema=_schema(), mode="referenced", root="images", group_key="day",
        order_key="timestamp", extra={"classes": ["cat", "dog"]},
    )
    m.save(tmp_path / "shardfeed.json")
    doc = json.loads((tmp_path / "shardfeed.json").read_text())
    assert doc["format"] == "shardfeed" and doc["version"] == 1 and doc["records"] == 5
    assert doc["root"] == "images"  # stored as given: relative to the manifest's folder
    back = load(tmp_path / "shardfeed.json")
    assert back.root == str(tmp_path / "images")  # resolved where the manifest is now
    assert dataclasses.replace(back, root="images") == m
    assert back.num_records == 5
    assert back.schema is not None and back.schema.image == ImageInfo("image/encoded", "jpeg")
    assert dict(back.extra) == {"classes": ["cat", "dog"]}


@pytest.mark.parametrize(
    "doc,match",
    [
        ({"format": "other"}, "not a shardfeed manifest"),
        ({"format": "shardfeed", "version": 99, "shards": []}, "upgrade shardfeed"),
        ({"format": "shardfeed", "version": 1}, "field shards: expected a list"),
        ({"format": "shardfeed", "version": 1, "shards": [{"path": "a"}]},
         r"field shards\[0\]\.bytes: expected an integer"),
        ({"format": "shardfeed", "version": 1, "records": 9,
          "shards": [{"path": "a", "records": 1, "bytes": 20}]}, "add up to 1"),
        ({"format": "shardfeed", "version": 1, "shards": [], "mode": "weird"}, "mode"),
        ({"format": "shardfeed", "version": 1, "shards": [],
          "schema": {"features": {"x": {"kind": "str"}}}}, "schema"),
    ],
)
def test_bad_manifests_are_refused(tmp_path: Path, doc: dict[str, object], match: str) -> None:
    path = tmp_path / "shardfeed.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(FormatError, match=match) as info:
        load(path)
    assert str(path) in str(info.value)


def test_manifest_not_json(tmp_path: Path) -> None:
    (tmp_path / "m.json").write_text("{nope")
    with pytest.raises(FormatError, match="not valid JSON"):
        load(tmp_path / "m.json")


def test_sidecars_round_trip_and_stale(tmp_path: Path) -> None:
    save_sidecars(tmp_path, group_ids=np.array([0, 0, 1]), order_keys=np.array([1, 2, 3]))
    groups = load_sidecar(str(tmp_path), "groups.npy", records=3)
    order = load_sidecar(str(tmp_path), "order.npy", records=3)
    assert groups.dtype == np.int64 and groups.tolist() == [0, 0, 1]
    assert order.dtype == np.float64 and order.tolist() == [1.0, 2.0, 3.0]
    with pytest.raises(FormatError, match="stale"):
        load_sidecar(str(tmp_path), "groups.npy", records=4)
    with pytest.raises(ValueError, match="integer"):
        save_sidecars(tmp_path, group_ids=np.array([0.5]))
    (tmp_path / "order.npy").unlink()
    with pytest.raises(FormatError, match="missing"):
        load_sidecar(str(tmp_path), "order.npy", records=3)


def test_schema_validation() -> None:
    with pytest.raises(ValueError, match="kind"):
        FeatureInfo("x", "string")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="encoding"):
        ImageInfo("x", "gif")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="height_key"):
        ImageInfo("image/raw", "raw")
    with pytest.raises(ValueError, match="not among the features"):
        Schema(features={"a": FeatureInfo("a", "int64")}, label_key="b")
    with pytest.raises(SchemaError, match=r"schema\.features\['a'\]\.kind"):
        Schema.from_json({"features": {"a": {}}})
    s = _schema()
    assert Schema.from_json(json.loads(json.dumps(s.to_json()))) == s


def test_infer_schema_from_tensorflow_records(tf_fixtures: Path) -> None:
    path = tf_fixtures / "mixed.tfrecord"
    data = path.read_bytes()
    offsets = scan(path).tolist()
    records = [decode_example(unframe(data[a:b], path="", record=0, offset=0))
               for a, b in itertools.pairwise(offsets)]
    schema = infer_schema(records)
    f = schema.features
    assert f["image/encoded"] == FeatureInfo("image/encoded", "bytes", 1)
    assert f["labels"] == FeatureInfo("labels", "float", 23)
    assert f["image/label/leaf"] == FeatureInfo("image/label/leaf", "int64", 11)
    assert schema.image is not None and schema.image.encoding == "mixed"  # JPEG and PNG
    assert schema.image.height_key == "image/height"
    assert schema.mask is not None and schema.mask.key == "mask_raw"
    assert schema.mask.encoding == "raw"
    assert schema.label_key == "image/class/label"
    jpeg_only = infer_schema(r for r in records if r["image/format"] == b"jpeg")
    assert jpeg_only.image is not None and jpeg_only.image.encoding == "jpeg"


def test_infer_schema_variable_and_conflicting() -> None:
    s = infer_schema([{"v": np.arange(2), "p": b"a/b.jpg"}, {"v": np.arange(3)}])
    assert s.features["v"].length is None
    assert s.features["p"].length is None  # missing in one record
    with pytest.raises(SchemaError, match="'v' is int64 in one record and float"):
        infer_schema([{"v": np.arange(2)}, {"v": np.zeros(2, dtype=np.float32)}])
    raw = infer_schema([{"image/raw": b"\0" * 12, "image/height": np.array([2]),
                         "image/width": np.array([2]), "image/channels": np.array([3])}])
    assert raw.image == ImageInfo("image/raw", "raw", "image/height", "image/width",
                                  "image/channels")
