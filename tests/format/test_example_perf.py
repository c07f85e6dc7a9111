"""The fast path of ``decode_example`` (every feature, no spec) gives exactly what the
contract says: same keys in the same order, same types, dtypes, shapes and values as a plain
conversion of the parsed message."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from shardfeed.format.example import Example, decode_example, encode_example


def _reference(payload: bytes) -> dict[str, Any]:
    """The documented conversion, written the slow and obvious way."""
    ex = Example()
    ex.ParseFromString(payload)
    out: dict[str, Any] = {}
    for name, feature in ex.features.feature.items():
        kind = feature.WhichOneof("kind")
        if kind == "int64_list":
            out[name] = np.fromiter(feature.int64_list.value, dtype=np.int64)
        elif kind == "float_list":
            out[name] = np.fromiter(feature.float_list.value, dtype=np.float32)
        elif kind == "bytes_list":
            values = list(feature.bytes_list.value)
            out[name] = values[0] if len(values) == 1 else values
        else:
            out[name] = []
    return out


def _assert_same(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert list(got) == list(want)
    for name, value in want.items():
        other = got[name]
        assert type(other) is type(value), name
        if isinstance(value, np.ndarray):
            assert other.dtype == value.dtype and other.shape == value.shape, name
            assert other.ndim == 1
            np.testing.assert_array_equal(other, value)
            # bit for bit, so -0.0 and NaN payloads survive too
            assert other.tobytes() == value.tobytes(), name
        else:
            assert other == value, name


def test_every_kind_and_length_decodes_as_the_contract_says() -> None:
    ex = Example()
    fmap = ex.features.feature
    fmap["empty_kind"].SetInParent()  # a Feature with no list set at all
    fmap["ints0"].int64_list.SetInParent()
    fmap["floats0"].float_list.SetInParent()
    fmap["bytes0"].bytes_list.SetInParent()
    payload = _merge(ex, {
        "one_int": 7,
        "big_ints": np.array([-(2**63), 2**63 - 1, 0, -1], dtype=np.int64),
        "floats": np.array([0.5, -0.0, np.inf, -np.inf, np.nan, 1e-45], dtype=np.float32),
        "one_bytes": b"\x00abc",
        "many_bytes": [b"a", b"", b"ccc"],
        "image/encoded": bytes(range(256)) * 8,
    })
    got = decode_example(payload)
    _assert_same(got, _reference(payload))
    assert got["one_int"].shape == (1,) and got["one_int"][0] == 7
    assert got["ints0"].dtype == np.int64 and got["ints0"].shape == (0,)
    assert got["floats0"].dtype == np.float32 and got["floats0"].shape == (0,)
    assert got["bytes0"] == [] and got["empty_kind"] == []
    assert got["many_bytes"] == [b"a", b"", b"ccc"]
    assert math.copysign(1.0, float(got["floats"][1])) == -1.0


def _merge(ex: Any, features: dict[str, Any]) -> bytes:
    other = Example()
    other.ParseFromString(encode_example(features))
    ex.MergeFrom(other)
    data: bytes = ex.SerializeToString()
    return data


def test_decoded_arrays_are_independent_of_the_message() -> None:
    payload = encode_example({"a": [1, 2, 3], "f": [0.25, 0.5]})
    first = decode_example(payload)
    first["a"][0] = 99
    first["f"][:] = 0
    again = decode_example(payload)
    np.testing.assert_array_equal(again["a"], [1, 2, 3])
    np.testing.assert_array_equal(again["f"], np.array([0.25, 0.5], dtype=np.float32))
    assert first["a"].flags.writeable and first["a"].flags.c_contiguous


_names = st.text(alphabet="abcdefghij/_", min_size=1, max_size=12)
_values = st.one_of(
    st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=20).map(
        lambda v: np.array(v, dtype=np.int64)
    ),
    st.lists(st.floats(width=32, allow_nan=False), min_size=1, max_size=20).map(
        lambda v: np.array(v, dtype=np.float32)
    ),
    st.binary(max_size=64),
    st.lists(st.binary(max_size=16), min_size=2, max_size=5),
)


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(_names, _values, min_size=1, max_size=8))
def test_random_examples_decode_like_the_reference(features: dict[str, Any]) -> None:
    payload = encode_example(features)
    _assert_same(decode_example(payload), _reference(payload))
