"""Large records (a high-resolution photo a record) read one at a time, as Patches and the
sample path read them: the values are the message parser's whatever the records hold, and a
damaged or odd one is named as before.

A record is decoded by the compiled part where it takes it (the copies of large values run
without the GIL); these tests hold it to the message parser record by record, and to itself
with the compiled part absent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shardfeed.dataset import Dataset
from shardfeed.errors import CorruptRecordError, SchemaError
from shardfeed.format import native
from shardfeed.format.example import Example, decode_example
from shardfeed.format.writer import ShardWriter

BIG = 300_000  # bytes of a record's image


def _records() -> list[dict[str, Any]]:
    rng = np.random.default_rng(0)
    base = [{"image/encoded": rng.bytes(BIG + i), "label": i, "box": [0.5, 0.25 * i],
             "name": f"photo-{i}.jpg"} for i in range(6)]
    base[2]["tags"] = [b"sky", b"sea"]  # another feature set, multi-valued bytes
    del base[3]["box"]  # one feature fewer
    base[4]["box"] = np.array([], np.float32)  # a feature with no values
    base[5]["label"] = [5, 6, 7]  # another length
    return base


def _kindless() -> bytes:
    """A record whose "box" feature has no value list set (TensorFlow reads it as empty)."""
    message = Example()
    features = message.features.feature
    features["image/encoded"].bytes_list.value.append(b"\x01" * BIG)
    features["label"].int64_list.value.append(6)
    features["box"].SetInParent()
    return message.SerializeToString()


@pytest.fixture
def big_shard(tmp_path: Path) -> Path:
    path = tmp_path / "big.tfrecord"
    with ShardWriter(path) as writer:
        for record in _records():
            writer.write_example(record)
        writer.write(_kindless())
    return path


def _same(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert sorted(got) == sorted(want)
    for name, value in want.items():
        if isinstance(value, np.ndarray):
            assert isinstance(got[name], np.ndarray)
            assert got[name].dtype == value.dtype and got[name].shape == value.shape
            np.testing.assert_array_equal(got[name], value)
            assert got[name].flags.writeable  # a user may write into a record's arrays
        else:
            assert type(got[name]) is type(value) and got[name] == value


def test_each_large_record_read_alone_is_what_the_parser_gives(big_shard: Path) -> None:
    with Dataset(str(big_shard)) as ds:
        payloads = ds.read_payloads(range(len(ds)))
        for i in [0, 1, 2, 3, 4, 5, 6, 1, 0]:  # each alone, as Patches reads an image
            _same(ds.read_many([i])[0], decode_example(payloads[i]))
            _same(ds[i], decode_example(payloads[i]))
        many = ds.read_many(range(len(ds)))
    for record, payload in zip(many, payloads):
        _same(record, decode_example(payload))
    assert many[0]["image/encoded"] == _records()[0]["image/encoded"]


def test_without_the_compiled_part_the_values_are_the_same(
        big_shard: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with Dataset(str(big_shard)) as ds:
        compiled = [ds.read_many([i])[0] for i in range(len(ds))]
    monkeypatch.setattr(native, "wire", None)
    with Dataset(str(big_shard)) as ds:
        for i, record in enumerate(compiled):
            _same(record, ds.read_many([i])[0])


def test_named_features_of_large_records(big_shard: Path) -> None:
    with Dataset(str(big_shard), features=["label", "image/encoded"]) as ds:
        record = ds.read_many([2])[0]
        assert list(record) == ["label", "image/encoded"]
        np.testing.assert_array_equal(record["label"], [2])
        assert record["image/encoded"] == _records()[2]["image/encoded"]
    with (Dataset(str(big_shard), features=["box"]) as ds,
          pytest.raises(SchemaError, match=r"record 3.*\['box'\] are missing.*default.*"
                        r"features=\{'box': FeatureSpec\('float', shape=\(\), default=0.0\)\} ")):
        ds.read_many([3])


def test_a_damaged_large_record_read_alone_is_named(big_shard: Path) -> None:
    with Dataset(str(big_shard)) as ds:
        offset = ds.locate(4)[2]
    data = bytearray(big_shard.read_bytes())
    data[offset + 12 + 500] ^= 0xFF  # a byte of record 4's image
    big_shard.write_bytes(bytes(data))
    with Dataset(str(big_shard)) as ds:
        _same(ds.read_many([3])[0], decode_example(ds.read_payloads([3])[0]))
        with pytest.raises(CorruptRecordError) as caught:
            ds.read_many([4])
    assert caught.value.record == 4 and caught.value.offset == offset
    assert "big.tfrecord" in str(caught.value)


def test_no_named_features_give_empty_records(big_shard: Path) -> None:
    with Dataset(str(big_shard), features=[]) as ds:
        assert ds.read_many([0, 2]) == [{}, {}]
        assert ds[1] == {}
