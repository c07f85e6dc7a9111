"""The tf.train.Example codec: TensorFlow's records, round trips, an independent decoder."""

from __future__ import annotations

import itertools
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardfeed.errors import SchemaError
from shardfeed.format.example import (
    FeatureSpec,
    decode_example,
    encode_example,
    example_kinds,
)
from shardfeed.format.framing import scan, unframe

_KIND = {"bytes_list": "bytes", "int64_list": "int64", "float_list": "float"}


def _payloads(path: Path) -> list[bytes]:
    data = path.read_bytes()
    offsets = scan(path).tolist()
    return [
        bytes(unframe(data[a:b], path=str(path), record=i, offset=a))
        for i, (a, b) in enumerate(itertools.pairwise(offsets))
    ]


def _check_against_tf(decoded: dict[str, Any], expected: dict[str, Any]) -> None:
    assert set(decoded) == set(expected)
    for name, exp in expected.items():
        value = decoded[name]
        kind = exp["kind"]
        if kind == "bytes_list":
            items = [value] if isinstance(value, bytes) else value
            assert len(items) == len(exp["values"]), name
            for got, want in zip(items, exp["values"]):
                if "utf8" in want:
                    assert got.decode("utf-8") == want["utf8"], name
                else:
                    assert len(got) == want["len"], name
        elif kind == "int64_list":
            assert value.dtype == np.int64 and value.ndim == 1
            assert value.tolist() == exp["values"], name
        else:
            assert value.dtype == np.float32 and value.ndim == 1
            np.testing.assert_array_equal(value, np.array(exp["values"], dtype=np.float32))


@pytest.mark.parametrize("name,key", [("mixed", "records"), ("second", "second")])
def test_every_record_reads_as_tensorflow_read_it(
    tf_fixtures: Path, tf_expected: dict[str, Any], name: str, key: str
) -> None:
    payloads = _payloads(tf_fixtures / f"{name}.tfrecord")
    assert len(payloads) == len(tf_expected[key])
    for payload, want in zip(payloads, tf_expected[key]):
        assert len(payload) == want["serialized_len"]
        _check_against_tf(decode_example(payload), want["features"])
        assert example_kinds(payload) == {
            k: _KIND[v["kind"]] for k, v in want["features"].items()
        }


def test_reencoding_tensorflow_records_keeps_values(tf_fixtures: Path) -> None:
    for payload in _payloads(tf_fixtures / "second.tfrecord"):
        original = decode_example(payload)
        again = decode_example(encode_example(original))
        assert set(again) == set(original)
        for k in original:
            if isinstance(original[k], np.ndarray):
                np.testing.assert_array_equal(again[k], original[k])
            else:
                assert again[k] == original[k]


# --- an independent decoder: protobuf wire format by hand ------------------------------------


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7


def _fields(buf: bytes) -> list[tuple[int, int, Any]]:
    out: list[tuple[int, int, Any]] = []
    pos = 0
    while pos < len(buf):
        tag, pos = _varint(buf, pos)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 2:
            n, pos = _varint(buf, pos)
            value, pos = buf[pos:pos + n], pos + n
        elif wire == 5:
            value, pos = buf[pos:pos + 4], pos + 4
        else:
            raise AssertionError(f"unexpected wire type {wire}")
        out.append((number, wire, value))
    return out


def _wire_decode(payload: bytes) -> dict[str, tuple[str, list[Any]]]:
    """tensorflow.Example by the field numbers of TensorFlow's example.proto/feature.proto."""
    result: dict[str, tuple[str, list[Any]]] = {}
    for num, _, features in _fields(payload):
        assert num == 1  # Example.features
        for fnum, _, entry in _fields(features):
            assert fnum == 1  # Features.feature (map entry)
            key, feature = "", b""
            for enum, _, ev in _fields(entry):
                if enum == 1:
                    key = ev.decode()
                else:
                    feature = ev
            for knum, _, lst in _fields(feature):
                kind = {1: "bytes", 2: "float", 3: "int64"}[knum]
                values: list[Any] = []
                for _, wire, v in _fields(lst):
                    if kind == "bytes":
                        values.append(v)
                    elif kind == "float":
                        assert wire == 2, "floats must be packed"
                        values.extend(struct.unpack(f"<{len(v) // 4}f", v))
                    else:
                        assert wire == 2, "int64s must be packed"
                        p = 0
                        while p < len(v):
                            x, p = _varint(v, p)
                            values.append(x - (1 << 64) if x >= 1 << 63 else x)
                result[key] = (kind, values)
    return result


def test_our_examples_parse_with_an_independent_decoder() -> None:
    features = {
        "image/encoded": b"\xff\xd8jpegbytes",
        "image/filename": "dir/é.jpg",
        "image/class/label": 7,
        "labels": np.array([0.5, -1.25, 3.0], dtype=np.float32),
        "big": np.array([-(2**63), 2**63 - 1, 0], dtype=np.int64),
        "names": [b"a", b"", b"c"],
        "ints": [1, -2, 300],
        "empty": np.zeros(0, dtype=np.int64),
    }
    got = _wire_decode(encode_example(features))
    assert got["image/encoded"] == ("bytes", [b"\xff\xd8jpegbytes"])
    assert got["image/filename"] == ("bytes", ["dir/é.jpg".encode()])
    assert got["image/class/label"] == ("int64", [7])
    assert got["labels"] == ("float", [0.5, -1.25, 3.0])
    assert got["big"] == ("int64", [-(2**63), 2**63 - 1, 0])
    assert got["names"] == ("bytes", [b"a", b"", b"c"])
    assert got["ints"] == ("int64", [1, -2, 300])
    assert got["empty"] == ("int64", [])


def test_our_examples_parse_with_tensorflow(tmp_path: Path) -> None:
    tf = pytest.importorskip("tensorflow")
    from shardfeed.format.framing import frame

    path = tmp_path / "ours.tfrecord"
    path.write_bytes(frame(encode_example({"x": [1, 2], "y": 0.5, "s": b"hi"})))
    (raw,) = list(tf.data.TFRecordDataset(str(path)))
    parsed = tf.io.parse_single_example(
        raw,
        {
            "x": tf.io.FixedLenFeature([2], tf.int64),
            "y": tf.io.FixedLenFeature([], tf.float32),
            "s": tf.io.FixedLenFeature([], tf.string),
        },
    )
    assert parsed["x"].numpy().tolist() == [1, 2]
    assert float(parsed["y"].numpy()) == 0.5
    assert parsed["s"].numpy() == b"hi"


# --- round trips and specs -------------------------------------------------------------------

int64s = st.integers(-(2**63), 2**63 - 1)
float32s = st.floats(width=32, allow_nan=False)
values = st.one_of(
    st.binary(max_size=50),
    st.lists(st.binary(max_size=20), min_size=2, max_size=5),
    st.lists(int64s, min_size=1, max_size=10),
    st.lists(float32s, min_size=1, max_size=10),
)


@settings(max_examples=100, deadline=None)
@given(features=st.dictionaries(st.text(min_size=1, max_size=12), values, max_size=6))
def test_round_trip_all_kinds(features: dict[str, Any]) -> None:
    payload = encode_example(features)
    assert encode_example(features) == payload  # deterministic
    decoded = decode_example(payload)
    assert set(decoded) == set(features)
    for name, value in features.items():
        got = decoded[name]
        if isinstance(value, bytes) or isinstance(value[0], bytes):
            assert got == value
        elif isinstance(value[0], int):
            assert got.dtype == np.int64 and got.tolist() == value
        else:
            assert got.dtype == np.float32
            np.testing.assert_array_equal(got, np.array(value, dtype=np.float32))


def test_arrays_and_scalars_encode_by_dtype() -> None:
    decoded = decode_example(
        encode_example(
            {
                "u8": np.arange(6, dtype=np.uint8).reshape(2, 3),
                "f64": np.array([[1.5, 2.5]]),
                "flag": True,
                "x": 2.5,
                "s": np.array([b"a", b"b"]),
            }
        )
    )
    assert decoded["u8"].tolist() == [0, 1, 2, 3, 4, 5]
    assert decoded["f64"].dtype == np.float32 and decoded["f64"].tolist() == [1.5, 2.5]
    assert decoded["flag"].tolist() == [1]
    assert decoded["x"].tolist() == [2.5]
    assert decoded["s"] == [b"a", b"b"]


def test_bad_inputs_are_refused_with_the_fix() -> None:
    with pytest.raises(ValueError, match="empty list.*dtype"):
        encode_example({"a": []})
    with pytest.raises(TypeError, match="'a'"):
        encode_example({"a": [b"x", 1]})
    with pytest.raises(ValueError, match="int64"):
        encode_example({"a": 2**64})
    with pytest.raises(ValueError, match="int64"):
        encode_example({"a": np.array([2**64 - 1], dtype=np.uint64)})
    with pytest.raises(TypeError, match="complex"):
        encode_example({"a": np.array([1j])})
    with pytest.raises(TypeError):
        encode_example({"a": object()})


def test_spec_shapes_defaults_and_errors() -> None:
    payload = encode_example({"label": 3, "mask": np.arange(6), "name": b"n", "f": [0.5, 1.5]})
    out = decode_example(
        payload,
        spec={
            "label": FeatureSpec("int64", shape=()),
            "mask": FeatureSpec("int64", shape=(2, 3)),
            "name": FeatureSpec("bytes", shape=()),
            "f": FeatureSpec("float"),
            "weight": FeatureSpec("float", default=np.float32(1.0)),
        },
    )
    assert out["label"].shape == () and int(out["label"]) == 3
    assert out["mask"].shape == (2, 3)
    assert out["name"] == b"n"
    assert out["weight"] == np.float32(1.0)
    assert set(out) == {"label", "mask", "name", "f", "weight"}
    with pytest.raises(SchemaError, match="rec 9.*'missing'"):
        decode_example(payload, spec={"missing": FeatureSpec("int64")}, where="rec 9")
    with pytest.raises(SchemaError, match="'label' is int64 but the spec asks for float"):
        decode_example(payload, spec={"label": FeatureSpec("float")})
    with pytest.raises(SchemaError, match="'mask' has 6 values"):
        decode_example(payload, spec={"mask": FeatureSpec("int64", shape=(4,))})
    with pytest.raises(ValueError, match="kind"):
        FeatureSpec("string")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="shape"):
        FeatureSpec("int64", shape=[3])  # type: ignore[arg-type]


def test_garbage_payload_is_a_schema_error() -> None:
    with pytest.raises(SchemaError, match="record 4.*not a tf.train.Example"):
        decode_example(b"\xff\xff\xff\xff\xff", where="record 4")
