"""The compiled part of the format layer gives exactly what the Python code gives.

Every check runs the same input through both (``native.wire`` set, then None) and compares:
payloads and errors of reads, columns of Examples (values, dtypes, writability, None). The
inputs are what writers produce (ours, TensorFlow's fixtures) and what they do not: encodings
protobuf accepts but no writer uses, and damaged bytes, where the compiled part must hand
over rather than guess.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import google_crc32c
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardfeed.dataset import Dataset
from shardfeed.errors import CorruptRecordError
from shardfeed.format import native
from shardfeed.format.columns import decode_columns
from shardfeed.format.example import encode_example
from shardfeed.format.framing import frame
from shardfeed.pipeline import native_patches
from shardfeed.transforms.decode import native_rows, png_rows

WIRE = native.wire


@pytest.fixture
def python_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(native, "wire", None)
    yield


def without_compiled(fn: Any, *args: Any, **kwargs: Any) -> Any:
    saved = native.wire
    native.wire = None
    try:
        return fn(*args, **kwargs)
    finally:
        native.wire = saved


def test_the_compiled_parts_are_built() -> None:
    """`make` builds them on every machine of this project (a C compiler and zlib's headers
    are there); a package without them is slower, never different, so this is the check
    that the fast path is the one the other tests and the benchmarks measure."""
    assert WIRE is not None, "shardfeed.format._wire was not compiled: re-run `make`"
    assert png_rows.compiled is not None, (
        "shardfeed.transforms.decode._png was not compiled: re-run `make`"
    )
    assert native_rows.compiled is not None, (
        "shardfeed.transforms.decode._jpeg_rows was not compiled (it needs libjpeg's headers: "
        "Debian's libjpeg-dev): re-run `make`"
    )
    assert native_patches.compiled is not None, (
        "shardfeed.pipeline._jpeg_record was not compiled (it needs libjpeg's headers): "
        "re-run `make`"
    )


def same_columns(a: dict[str, Any] | None, b: dict[str, Any] | None) -> None:
    if a is None or b is None:
        assert a is b
        return
    assert list(a) == list(b)
    for name in a:
        x, y = a[name], b[name]
        if isinstance(x, np.ndarray):
            assert isinstance(y, np.ndarray) and x.dtype == y.dtype and x.shape == y.shape
            assert x.tobytes() == y.tobytes(), name  # NaN bits included
            assert x.flags.writeable == y.flags.writeable
        else:
            assert x == y, name


def both_ways(payloads: list[bytes], names: list[str] | None = None) -> dict[str, Any] | None:
    fast = decode_columns(payloads, names=names)
    slow = without_compiled(decode_columns, payloads, names=names)
    same_columns(fast, slow)
    return fast


# -- CRC -----------------------------------------------------------------------------------


@given(st.binary(max_size=3000))
def test_crc32c_equals_google_crc32c(data: bytes) -> None:
    assert WIRE is not None
    assert WIRE.crc32c(data) == google_crc32c.value(data)


@pytest.mark.parametrize("size", [767, 768, 769, 775, 776, 1536, 2304 + 13, 100_003])
def test_crc32c_of_records_long_enough_for_three_lanes(size: int) -> None:
    # 768 bytes and more go through three interleaved lanes, joined by a shift
    assert WIRE is not None
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    assert WIRE.crc32c(data) == google_crc32c.value(data)


# -- Example columns -------------------------------------------------------------------------

values = st.one_of(
    st.lists(st.binary(max_size=20), min_size=1, max_size=3).map(
        lambda v: v if len(v) != 1 else v[0]),
    st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=4).map(
        lambda v: np.array(v, dtype=np.int64)),
    st.lists(st.floats(width=32, allow_nan=True), min_size=1, max_size=4).map(
        lambda v: np.array(v, dtype=np.float32)),
    st.sampled_from([np.array([], dtype=np.int64), np.array([], dtype=np.float32)]),
)
records = st.dictionaries(st.text(min_size=1, max_size=8), values, min_size=1, max_size=5)


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(records, min_size=1, max_size=4), st.data())
def test_columns_equal_the_parsers_on_any_records(rows: list[dict[str, Any]],
                                                  data: st.DataObject) -> None:
    payloads = [encode_example(r) for r in rows]
    both_ways(payloads)
    names = sorted(rows[0])
    picked = data.draw(st.lists(st.sampled_from(names), min_size=1, max_size=3, unique=True))
    both_ways(payloads, picked)


def test_signalling_nan_bits_are_those_the_parser_gives() -> None:
    signalling = np.array([0x7F800001, 0x7FA00000, 0xFF800123], dtype=np.uint32).view(np.float32)
    columns = both_ways([encode_example({"f": signalling})])
    assert columns is not None and np.isnan(columns["f"]).all()


def test_alike_records_of_many_features_equal_the_parser(tf_fixtures: Path) -> None:
    with Dataset(str(tf_fixtures / "mixed.tfrecord")) as ds:
        payloads = ds.read_payloads(range(len(ds)))
    assert both_ways(payloads) is not None
    rows = [{"image/encoded": os.urandom(50 + i), "label": [i], "w": [0.5, float(i)],
             "names": [b"a", b"bc"], "empty": b""} for i in range(40)]
    columns = both_ways([encode_example(r) for r in rows])
    assert columns is not None and columns["label"].flags.writeable
    empty_bytes = example(entry(b"tags", field(1, b"")), PLAIN)  # TensorFlow writes these
    columns = both_ways([empty_bytes, empty_bytes])
    assert columns is not None and columns["tags"] == [[], []]


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def field(number: int, payload: bytes) -> bytes:
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def example(*entries: bytes) -> bytes:
    return field(1, b"".join(field(1, e) for e in entries))


def entry(key: bytes, feature: bytes) -> bytes:
    return field(1, key) + field(2, feature)


PLAIN = entry(b"label", field(3, field(1, varint(7))))


@pytest.mark.parametrize("odd", [
    # protobuf reads these, no writer writes them: the parser decides
    entry(b"n", field(3, b"\x08\x05\x08\x06")),                 # unpacked int64s
    entry(b"n", field(3, field(1, varint(1)) + field(1, varint(2)))),  # two packed runs
    entry(b"n", field(2, b"\x0d" + struct.pack("<f", 1.5))),    # unpacked float
    field(2, b"x") + field(1, b"n"),                            # value before key
    entry(b"label", field(3, field(1, varint(9)))),             # the same key twice
    entry(b"\xff\xfe", field(1, field(1, b"x"))),               # a key that is not UTF-8
    entry(b"n", b""),                                           # a feature of no kind
    entry(b"n", field(1, b"") + field(3, b"")),                 # two kinds set
    entry(b"n", field(3, field(1, b"\xff" * 10 + b"\x01"))),    # an 11-byte varint
])
def test_encodings_no_writer_produces_give_the_parsers_answer(odd: bytes) -> None:
    both_ways([example(PLAIN), example(PLAIN, odd)])
    both_ways([example(PLAIN, odd)], ["label"])


@pytest.mark.parametrize("tail", [
    b"\x12\x00",            # another field in Example
    b"\x0a\x00",            # a second Features message (merged by protobuf)
    b"\x0a\x05abc",         # a length past the end
    b"\x80",                # a cut varint
])
def test_damaged_or_merged_messages_give_the_parsers_answer(tail: bytes) -> None:
    both_ways([example(PLAIN), example(PLAIN) + tail])


@settings(max_examples=200)
@given(st.integers(0, 10_000), st.integers(0, 255), st.booleans())
def test_any_damaged_byte_gives_the_parsers_answer(at: int, value: int, cut: bool) -> None:
    rows = [{"image/encoded": b"\x89PNG" + bytes(range(30)), "label": [3], "w": [0.25],
             "name": b"file.png"} for _ in range(2)]
    payloads = [encode_example(r) for r in rows]
    damaged = bytearray(payloads[1])
    at %= len(damaged)
    if cut:
        del damaged[at:]
    else:
        damaged[at] = value
    payloads[1] = bytes(damaged)
    both_ways(payloads)
    both_ways(payloads, ["label", "w"])


# -- framing ----------------------------------------------------------------------------------


def dataset_bytes(tmp_path: Path, payloads: list[bytes]) -> Path:
    path = tmp_path / "d.tfrecord"
    path.write_bytes(b"".join(frame(p) for p in payloads))
    return path


def test_reads_through_the_compiled_checks_equal_the_python_ones(tmp_path: Path) -> None:
    payloads = [encode_example({"x": os.urandom(i % 97), "i": [i]}) for i in range(500)]
    path = dataset_bytes(tmp_path, payloads)
    order = np.random.default_rng(0).permutation(500)
    with Dataset(str(path)) as ds:
        fast = ds.read_payloads(order)
        slow = without_compiled(ds.read_payloads, order)
    assert fast == slow == [payloads[i] for i in order]


@pytest.mark.parametrize("verify", [True, False])
@pytest.mark.parametrize("where", ["length", "length_crc", "data", "data_crc"])
def test_a_damaged_record_is_named_alike_by_both(tmp_path: Path, where: str,
                                                 verify: bool) -> None:
    payloads = [encode_example({"x": bytes([i]) * 40}) for i in range(50)]
    path = dataset_bytes(tmp_path, payloads)
    raw = bytearray(path.read_bytes())
    record = 17
    at = sum(len(p) + 16 for p in payloads[:record])
    within = {"length": 0, "length_crc": 9, "data": 20,
              "data_crc": 16 + len(payloads[record]) - 2}[where]
    raw[at + within] ^= 0x40
    with Dataset(str(path)):  # indexed while sound
        pass
    path.write_bytes(bytes(raw))  # then damaged in place (same size: the index still fits)
    with Dataset(str(path)) as ds:  # opened after: a shard changed while open is another error
        ds.verify_crc = verify
        outcomes = []
        for read in (ds.read_payloads, lambda idx: without_compiled(ds.read_payloads, idx)):
            try:
                outcomes.append(("ok", read(range(50))))
            except CorruptRecordError as exc:
                outcomes.append(("error", str(exc)))
    assert outcomes[0] == outcomes[1]
    if where in ("length", "length_crc") or verify:
        assert outcomes[0][0] == "error" and f"record {record}" in outcomes[0][1]


def test_large_reads_checked_without_the_gil_equal_the_python_ones(tmp_path: Path) -> None:
    """Past 1 MiB a read's CRCs are checked with the GIL released: same payloads, same error."""
    payloads = [encode_example({"x": os.urandom(150_000), "i": [i]}) for i in range(12)]
    path = dataset_bytes(tmp_path, payloads)
    with Dataset(str(path)) as ds:
        assert ds.read_payloads(range(12)) == payloads
        raw = bytearray(path.read_bytes())
        raw[sum(len(p) + 16 for p in payloads[:5]) + 5000] ^= 1
        path.write_bytes(bytes(raw))
        messages = []
        for read in (ds.read_payloads, lambda idx: without_compiled(ds.read_payloads, idx)):
            with pytest.raises(CorruptRecordError) as caught:
                read(range(12))
            messages.append(str(caught.value))
    assert messages[0] == messages[1] and "record 5" in messages[0]
