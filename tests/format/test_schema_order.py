"""A schema serialises the same way whatever order the records list their features in."""

from __future__ import annotations

import json

import numpy as np

from shardfeed.format.schema import infer_schema


def test_schema_serialises_features_in_name_order_whatever_the_record_order() -> None:
    a = {"z": np.array([1]), "a": b"x", "m": np.array([1.5], dtype=np.float32)}
    b = {"m": np.array([2.5], dtype=np.float32), "z": np.array([2]), "a": b"y"}
    one, two = infer_schema([a]).to_json(), infer_schema([b]).to_json()
    assert list(one["features"]) == ["a", "m", "z"]
    assert json.dumps(one) == json.dumps(two)
