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
