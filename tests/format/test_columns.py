"""Records decoded as columns hold exactly what the per-record decode gives, and records that
are not alike give None (so the per-record path can name the one that differs)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from shardfeed.dataset import Dataset
from shardfeed.format.columns import decode_columns
from shardfeed.format.example import decode_example, encode_example


def test_columns_of_tensorflow_written_records_equal_the_records(tf_fixtures: Path) -> None:
    with Dataset(str(tf_fixtures / "mixed.tfrecord")) as ds:
        payloads = ds.read_payloads(range(len(ds)))
    columns = decode_columns(payloads)
    assert columns is not None
    records = [decode_example(p) for p in payloads]
    assert list(columns) == list(records[0])
    for name, column in columns.items():
        for row, record in enumerate(records):
            value = record[name]
            if isinstance(value, np.ndarray):
                assert column.dtype == value.dtype
                np.testing.assert_array_equal(column[row], value)
            else:
                assert column[row] == value


def test_records_that_differ_give_none() -> None:
    base = {"image/encoded": b"x", "label": [1]}
    same = [encode_example(base), encode_example({**base, "label": [2]})]
    assert decode_columns(same) is not None
    assert decode_columns([*same, encode_example({**base, "label": [1, 2]})]) is None
    assert decode_columns([*same, encode_example({**base, "label": [1.5]})]) is None
    assert decode_columns([*same, encode_example({"image/encoded": b"x"})]) is None
    assert decode_columns([*same, encode_example({**base, "extra": [0]})]) is None
    assert decode_columns([*same, b"\xff\xff"]) is None
    assert decode_columns([]) is None
    picked = decode_columns([*same, encode_example({**base, "extra": [0]})], names=["label"])
    assert picked is not None
    np.testing.assert_array_equal(picked["label"], [[1], [2], [1]])


def test_one_record_by_the_compiled_part_is_the_parsers() -> None:
    """decode_record (a record read alone) gives what the parser gives: bytes as bytes,
    numeric values as writable 1-D arrays of their dtype, in the order of the names asked;
    None for a record with another feature set (exact) or a name that does not encode."""
    from shardfeed.format import columns, native
    from shardfeed.format.columns import decode_record

    assert native.wire is not None
    record = {"image/encoded": b"\xff\xd8" + bytes(range(256)) * 3, "label": [7],
              "box": [0.25, 0.5, 1.0, 2.0], "ids": [1, -2, 3], "name": b"x.jpg"}
    payload = encode_example(record)
    want = decode_example(payload)
    for names in (list(record), ["ids", "name", "image/encoded", "box", "label"]):
        for _ in range(2):  # the second time with the names' encoding kept
            got = decode_record(payload, names, exact=True)
            assert got is not None and list(got) == names
            for name in names:
                value, expected = got[name], want[name]
                if isinstance(expected, bytes):
                    assert value == expected and type(value) is bytes
                else:
                    assert isinstance(value, np.ndarray) and value.ndim == 1
                    assert value.dtype == expected.dtype and value.flags.writeable
                    np.testing.assert_array_equal(value, expected)
    assert decode_record(payload, ["label", "name"], exact=True) is None  # not all of them
    assert decode_record(payload, ["label", "name"], exact=False) is not None
    assert decode_record(payload, ["label", "\udc80"], exact=False) is None
    assert decode_record(bytearray(payload), list(record), exact=True) is None
    columns._KEYS.clear()
    for k in range(columns._KEYS_KEPT + 5):  # many feature sets: the kept ones are bounded
        assert columns._keys_of([f"f{k}"]) == (f"f{k}".encode(),)
    assert len(columns._KEYS) <= columns._KEYS_KEPT
