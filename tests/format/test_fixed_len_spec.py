"""FeatureSpec with a fixed shape reads as tf.io.FixedLenFeature: every record's value has
that shape and dtype, a missing feature gets the default made to that shape (one value fills
it, as many values as it holds are reshaped), and a record of another count is an error."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from shardfeed.errors import SchemaError
from shardfeed.format.example import FeatureSpec, decode_example, encode_example
from shardfeed.format.schema import FeatureInfo, Schema

WITH = encode_example({"vec": np.arange(9, dtype=np.float32), "n": [4, 5], "name": b"a"})
WITHOUT = encode_example({"other": [1]})


def test_a_missing_feature_gets_the_default_in_the_spec_shape_and_dtype() -> None:
    spec = {"vec": FeatureSpec("float", shape=(9,), default=0.0),
            "n": FeatureSpec("int64", shape=(2,), default=[7, 8]),
            "name": FeatureSpec("bytes", shape=(), default="none")}
    present, missing = decode_example(WITH, spec=spec), decode_example(WITHOUT, spec=spec)
    for name in ("vec", "n"):
        assert isinstance(missing[name], np.ndarray)
        assert missing[name].shape == present[name].shape
        assert missing[name].dtype == present[name].dtype
    assert missing["vec"].tolist() == [0.0] * 9 and missing["vec"].dtype == np.float32
    assert missing["n"].tolist() == [7, 8] and missing["n"].dtype == np.int64
    assert missing["name"] == b"none"


@pytest.mark.parametrize(("default", "expected"), [
    (1.5, np.full((3, 3), 1.5)),                          # one value fills the shape
    ([1.5], np.full((3, 3), 1.5)),
    (list(range(9)), np.arange(9).reshape(3, 3)),         # a flat list of 9 is reshaped
    ([[0, 1, 2], [3, 4, 5], [6, 7, 8]], np.arange(9).reshape(3, 3)),  # as TF takes it
    (np.arange(9, dtype=np.int32), np.arange(9).reshape(3, 3)),
])
def test_default_fill_and_reshape(default: object, expected: np.ndarray) -> None:
    value = decode_example(WITHOUT, spec={"m": FeatureSpec("float", shape=(3, 3),
                                                           default=default)})["m"]
    assert value.dtype == np.float32 and value.shape == (3, 3)
    np.testing.assert_array_equal(value, expected)


def test_scalar_and_bytes_shapes() -> None:
    scalar = decode_example(WITHOUT, spec={"w": FeatureSpec("float", shape=(), default=1)})
    assert scalar["w"].shape == () and scalar["w"].dtype == np.float32 and scalar["w"] == 1
    names = decode_example(WITHOUT, spec={"s": FeatureSpec("bytes", shape=(2,), default="x")})
    assert names["s"] == [b"x", b"x"]


def test_an_empty_feature_reads_as_missing() -> None:
    """A feature whose value list is not set takes the default, as TF parses it."""
    from shardfeed.format.example import Example

    ex = Example()
    ex.features.feature["vec"].SetInParent()  # a Feature with no kind
    payload = ex.SerializeToString()
    out = decode_example(payload, spec={"vec": FeatureSpec("float", shape=(2,), default=3.0)})
    assert out["vec"].tolist() == [3.0, 3.0]
    with pytest.raises(SchemaError, match="'vec' has 0 values but the spec shape"):
        decode_example(payload, spec={"vec": FeatureSpec("float", shape=(2,))})


def test_each_record_gets_its_own_default_array() -> None:
    spec = {"vec": FeatureSpec("float", shape=(2,), default=0.0)}
    first = decode_example(WITHOUT, spec=spec)["vec"]
    first += 5  # a transform changing its sample in place
    assert decode_example(WITHOUT, spec=spec)["vec"].tolist() == [0.0, 0.0]


def test_a_record_of_another_count_names_the_record() -> None:
    with pytest.raises(SchemaError, match=r"rec 3: feature 'vec' has 9 values but the spec "
                                          r"shape \(4,\) needs 4"):
        decode_example(WITH, spec={"vec": FeatureSpec("float", shape=(4,), default=0.0)},
                       where="rec 3")


@pytest.mark.parametrize(("kind", "shape", "default", "match"), [
    ("float", (9,), [1.0, 2.0], r"has 2 values but shape \(9,\) holds 9"),
    ("int64", (2,), 0.5, "must hold integers"),
    ("int64", (), 2**70, "must hold integers"),
    ("float", (2,), "a", "must hold numbers"),
    ("bytes", (2,), 1, "must be bytes or str"),
    ("bytes", (3,), ["a", "b"], r"has 2 values but shape \(3,\) holds 3"),
])
def test_a_default_that_does_not_fit_fails_at_construction(
        kind: str, shape: tuple[int, ...], default: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        FeatureSpec(kind, shape=shape, default=default)  # type: ignore[arg-type]


def test_spec_pickles_with_its_default() -> None:
    spec = FeatureSpec("float", shape=(2,), default=[1.0, 2.0])
    again = pickle.loads(pickle.dumps(spec))
    assert again == spec and again.missing_value().tolist() == [1.0, 2.0]


def test_without_a_shape_the_default_is_returned_as_given() -> None:
    weight = np.float32(1.0)
    out = decode_example(WITHOUT, spec={"w": FeatureSpec("float", default=weight)})
    assert out["w"] is weight


def test_schema_as_read_takes_the_spec_length() -> None:
    from shardfeed.format.schema import schema_as_read

    stored = Schema(features={"vec": FeatureInfo("vec", "float", None),
                              "n": FeatureInfo("n", "int64", 2)})
    read = schema_as_read(stored, {"vec": FeatureSpec("float", shape=(3, 3), default=0.0),
                                   "n": FeatureSpec("int64"),
                                   "absent": FeatureSpec("int64", shape=(), default=0)})
    assert read.features["vec"].length == 9
    assert read.features["n"].length == 2 and "absent" not in read.features
    assert schema_as_read(stored, None) is stored
