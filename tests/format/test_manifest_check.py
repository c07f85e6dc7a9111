"""A manifest and its sidecars are untrusted input: each damage is a FormatError naming the
file and the field, raised before anything is built from the claimed values."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shardfeed.errors import FormatError
from shardfeed.format.manifest import Manifest, ShardInfo, load, load_sidecar, save_sidecars
from shardfeed.format.manifest_check import nesting_depth
from shardfeed.format.schema import FeatureInfo, ImageInfo, Schema

GOOD: dict[str, Any] = {
    "format": "shardfeed", "version": 1, "mode": "embedded", "root": None, "group_key": "day",
    "order_key": None, "records": 3,
    "schema": {"features": {"image/encoded": {"kind": "bytes", "length": 1},
                            "day": {"kind": "int64", "length": 1}},
               "image": {"key": "image/encoded", "encoding": "jpeg", "height_key": None,
                         "width_key": None, "channels_key": None, "dtype": "uint8"},
               "mask": None, "label_key": None},
    "shards": [{"path": "a.tfrecord", "records": 2, "bytes": 100, "crc32c": 7},
               {"path": "b.tfrecord", "records": 1, "bytes": 40, "crc32c": None}],
    "extra": {"classes": ["x"]},
}


def _changed(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    doc = copy.deepcopy(GOOD)
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return doc


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "shardfeed.json"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    return path


def test_the_good_document_loads(tmp_path: Path) -> None:
    m = load(_write(tmp_path, json.dumps(GOOD)))
    assert m.num_records == 3 and m.shards[0] == ShardInfo("a.tfrecord", 2, 100, 7)


@pytest.mark.parametrize(
    "path,value,field",
    [
        (("shards", 0, "records"), 10**9, r"shards\[0\]\.records: 1000000000 records cannot fit"),
        (("shards", 0, "records"), 1.5, r"shards\[0\]\.records: expected an integer"),
        (("shards", 0, "records"), True, r"shards\[0\]\.records: expected an integer"),
        (("shards", 0, "records"), -1, r"shards\[0\]\.records: -1 is outside"),
        (("shards", 1, "bytes"), 10**30, r"shards\[1\]\.bytes: 10+ is outside"),
        (("shards", 1, "bytes"), "40", r"shards\[1\]\.bytes: expected an integer"),
        (("shards", 0, "crc32c"), 1 << 32, r"shards\[0\]\.crc32c: 4294967296 is outside"),
        (("shards", 0, "crc32c"), "x", r"shards\[0\]\.crc32c: expected an integer"),
        (("shards", 0, "path"), 5, r"shards\[0\]\.path: expected a string"),
        (("shards", 0, "path"), "a\x00b", r"shards\[0\]\.path: a path holding a NUL"),
        (("shards", 0, "path"), "\ud800", r"shards\[0\]\.path: a path that is not valid"),
        (("shards", 0, "path"), "", r"shards\[0\]\.path: an empty path"),
        (("shards", 0), [1], r"shards\[0\]: expected an object"),
        (("shards",), {"a": 1}, r"field shards: expected a list"),
        (("version",), True, r"field version: expected an integer"),
        (("version",), 0, r"field version: 0 is outside"),
        (("mode",), 7, r"field mode: expected a string"),
        (("mode",), "weird", r"field mode: 'weird' is not one of"),
        (("root",), 3, r"field root: expected a string"),
        (("group_key",), ["day"], r"field group_key: expected a string"),
        (("extra",), [1, 2], r"field extra: expected an object"),
        (("records",), 4, r"says 4 records but its shards add up to 3"),
        (("records",), "3", r"field records: expected an integer"),
        (("schema",), [1], r"field schema: expected an object"),
        (("schema", "features"), [1], r"field schema\.features: expected an object"),
        (("schema", "features", "day", "length"), 2**40, r"features\['day'\]\.length"),
        (("schema", "features", "day", "kind"), None, r"features\['day'\]\.kind"),
        (("schema", "image", "dtype"), "O", r"schema\.image\.dtype: expected the name of a"),
        (("schema", "image", "dtype"), "(", r"schema\.image\.dtype: expected the name of a"),
        (("schema", "image", "dtype"), "V8", r"schema\.image\.dtype: expected the name of a"),
        (("schema", "image", "key"), 1, r"schema\.image\.key: expected a non-empty string"),
        (("schema", "image"), "jpeg", r"schema\.image: expected an object"),
        (("schema", "label_key"), "nope", r"field schema: label_key 'nope' is not among"),
    ],
)
def test_each_damaged_field_is_named(
    tmp_path: Path, path: tuple[Any, ...], value: Any, field: str
) -> None:
    manifest = _write(tmp_path, json.dumps(_changed(path, value)))
    with pytest.raises(FormatError, match=r"shardfeed\.json'.*" + field):
        load(manifest)


@pytest.mark.parametrize(
    "text,what",
    [
        ("[" * 100_000 + "]" * 100_000, "nests arrays or objects 100000 levels deep"),
        ('{"format": "shardfeed", "extra": ' + '{"a":' * 5000 + "1" + "}" * 5001,
         "5001 levels deep"),
        (json.dumps(GOOD).replace('"records": 3', '"records": 1e400'), "field records"),
        (json.dumps(GOOD).replace('"records": 3', '"records": ' + "9" * 5000), "not valid JSON"),
        (json.dumps(GOOD).replace('"records": 3', '"records": NaN'), "field records"),
        ('{"format": "shardfeed"', "not valid JSON"),
    ],
)
def test_damaged_json_is_a_format_error(tmp_path: Path, text: str, what: str) -> None:
    with pytest.raises(FormatError, match=what):
        load(_write(tmp_path, text))


def test_bytes_that_are_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "shardfeed.json"
    path.write_bytes(b'{"format": "\xff"}')
    with pytest.raises(FormatError, match="not UTF-8"):
        load(path)


def test_nesting_depth_ignores_brackets_inside_strings() -> None:
    assert nesting_depth('{"a": "' + "[" * 1000 + '"}') == 1
    assert nesting_depth('{"a": "\\"' + "[" * 1000 + '"}') == 1
    assert nesting_depth("[" * 70 + "]" * 70) == 70


def test_a_manifest_written_by_pack_still_loads(tmp_path: Path) -> None:
    schema = Schema(features={"image/raw": FeatureInfo("image/raw", "bytes", 1),
                              "h": FeatureInfo("h", "int64", 1), "w": FeatureInfo("w", "int64", 1)},
                    image=ImageInfo("image/raw", "raw", "h", "w", dtype="uint16"))
    m = Manifest(shards=[ShardInfo("a.tfrecord", 3, 48 + 30, 1)], schema=schema, mode="raw",
                 extra={"deep": [[[{"ok": 1}]]]})
    m.save(tmp_path / "shardfeed.json")
    assert load(tmp_path / "shardfeed.json") == m


@pytest.mark.parametrize(
    "values,what",
    [(np.array(["a", "b", "c"]), "values of type '<U1'"),
     (np.zeros((3, 1), dtype=np.int64), "shape"),
     (np.arange(3, dtype=np.int32), "values of type '<i4'"),
     (np.arange(4, dtype=np.int64), "has shape \\(4,\\) but the dataset has 3 records")],
)
def test_a_sidecar_of_another_type_or_shape_is_refused(
    tmp_path: Path, values: np.ndarray, what: str
) -> None:
    np.save(tmp_path / "groups.npy", values)
    with pytest.raises(FormatError, match=r"groups\.npy.*" + what):
        load_sidecar(str(tmp_path), "groups.npy", records=3)


def test_a_pickled_sidecar_is_never_unpickled(tmp_path: Path) -> None:
    np.save(tmp_path / "order.npy", np.array([{"a": 1}, 2, 3], dtype=object),
            allow_pickle=True)
    with pytest.raises(FormatError, match=r"order\.npy.*'\|O'"):
        load_sidecar(str(tmp_path), "order.npy", records=3)


def test_sidecars_written_by_pack_load(tmp_path: Path) -> None:
    save_sidecars(tmp_path, group_ids=np.array([1, 1, 2]), order_keys=np.array([0.5, 1, 2]))
    assert load_sidecar(str(tmp_path), "groups.npy", records=3).tolist() == [1, 1, 2]
    assert load_sidecar(str(tmp_path), "order.npy", records=3).tolist() == [0.5, 1.0, 2.0]


def test_documents_built_in_python_are_checked_the_same() -> None:
    """from_json takes the parsed document: numbers past Python's printing limit still give
    a FormatError naming the field, not a ValueError from the message itself."""
    doc = _changed(("shards", 0, "records"), 10**5000)
    with pytest.raises(FormatError, match=r"shards\[0\]\.records: a 16610-bit number"):
        Manifest.from_json(doc, where="doc.json")
    doc = _changed(("schema", "features", "day", "length"), 10**5000)
    with pytest.raises(FormatError, match=r"features\['day'\]\.length: .* a 16610-bit int"):
        Manifest.from_json(doc, where="doc.json")
