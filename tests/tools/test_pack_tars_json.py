"""WebDataset JSON members as LAION-style metadata holds them: nulls, nested objects, arrays
of arrays, values no feature holds; what is kept (every key under its full path, the
member's bytes), and what is refused only when a label names it."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shardfeed import pack
from shardfeed.tools.pack.rows import RowFields
from tests.tools.test_pack_tars import png, read_back, refused, write_tar

LAION = {
    "url": "https://example.com/a.jpg", "caption": "a cat", "width": 512, "similarity": 0.31,
    "error_message": None,
    "meta": {"h": 3, "source": {"site": "example"}, "exif": None},
    "boxes": [[1, 2, 30, 40], [5, 6, 70, 80], [9, 10, 11, 12]],
    "tags": ["cat", "pet"],
    "annotations": [{"label": 1}, {"label": 2}],
    "ragged": [[1, 2], [3]],
    "hash": 2**70,
}


def laion_tar(path: Path) -> Path:
    second = {**LAION, "error_message": "timeout", "meta": {"h": 4, "source": {"site": "b"}}}
    return write_tar(path, [("s0.jpg", png(0)), ("s0.json", json.dumps(LAION).encode()),
                            ("s1.jpg", png(1)), ("s1.json", json.dumps(second).encode())])


def test_laion_style_json_packs_with_nothing_lost(tmp_path: Path) -> None:
    pack(str(laion_tar(tmp_path / "laion.tar")), tmp_path / "out")
    first, second = read_back(tmp_path / "out")
    assert "json/error_message" not in first  # null: absent from that record only
    assert second["json/error_message"] == b"timeout"
    assert int(first["json/meta/h"][0]) == 3 and int(second["json/meta/h"][0]) == 4
    assert first["json/meta/source/site"] == b"example"
    assert not any(k in first for k in ("json/h", "json/site", "json/source/site"))
    assert "json/meta/exif" not in first
    np.testing.assert_array_equal(first["json/boxes"], [1, 2, 30, 40, 5, 6, 70, 80, 9, 10, 11, 12])
    np.testing.assert_array_equal(first["json/boxes/shape"], [3, 4])
    assert first["json/tags"] == [b"cat", b"pet"] and "json/tags/shape" not in first
    assert int(first["json/width"][0]) == 512 and first["json/caption"] == b"a cat"
    for gone in ("json/annotations", "json/ragged", "json/hash"):  # no feature holds them
        assert gone not in first
    assert json.loads(first["json"]) == LAION  # the member itself: nothing is lost
    assert first["image/filename"] == b"s0"


@pytest.mark.parametrize(("label", "expected"), [
    ("json/error_message", "'json/error_message' holds null"),
    ("json/meta", "'json/meta' is named as a label and holds a JSON object"),
    ("json/annotations", "'json/annotations' holds an array of objects"),
    ("json/ragged", "'json/ragged' holds an array of objects, of nulls, of mixed kinds"),
    ("json/hash", "'json/hash' holds an integer beyond 64 bits"),
])
def test_a_value_no_feature_holds_is_refused_where_it_is_named_as_a_label(
    tmp_path: Path, label: str, expected: str,
) -> None:
    tar = laion_tar(tmp_path / "laion.tar")
    message = refused(str(tar), tmp_path / "out", fields=RowFields(labels=[label]))
    assert "laion.tar" in message and "'s0.json'" in message and expected in message
    assert "--label-columns" in message


def test_named_labels_keep_an_array_of_arrays_with_its_shape(tmp_path: Path) -> None:
    tar = laion_tar(tmp_path / "laion.tar")
    pack(str(tar), tmp_path / "out",
         fields=RowFields(labels=["json/boxes", "json/boxes/shape", "json/meta/h"]))
    first = read_back(tmp_path / "out")[0]
    assert sorted(k for k in first if k.startswith("json")) == [
        "json/boxes", "json/boxes/shape", "json/meta/h"]
    np.testing.assert_array_equal(first["json/boxes/shape"], [3, 4])


def test_an_integer_of_5000_digits_is_refused_by_tar_and_member_and_fast(
    tmp_path: Path,
) -> None:
    body = b'{"w": 1, "n": ' + b"7" * 5000 + b"}"
    tar = write_tar(tmp_path / "digits.tar", [("a.png", png(0)), ("a.json", body)])
    message = refused(str(tar), tmp_path / "out")
    assert "digits.tar" in message and "'a.json'" in message and "5000 digits" in message
    assert "write it as a JSON string" in message
    old = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)  # no limit of Python's own: still refused, by pack's
    try:
        message = refused(str(tar), tmp_path / "out2")
    finally:
        sys.set_int_max_str_digits(old)
    assert "5000 digits" in message


@pytest.mark.parametrize("body", [
    b'{"a/b": 1, "a": {"b": 2}}',          # two keys, one column
    b'{"box": [[1, 2]], "box/shape": [7]}',  # a key named like the shape beside it
])
def test_two_values_giving_one_column_are_refused_not_overwritten(
    tmp_path: Path, body: bytes,
) -> None:
    tar = write_tar(tmp_path / "clash.tar", [("a.png", png(0)), ("a.json", body)])
    message = refused(str(tar), tmp_path / "out")
    assert "'a.json'" in message and "rename one of the keys" in message


def test_deep_json_is_walked_or_refused_never_a_recursion_error(tmp_path: Path) -> None:
    deep: dict[str, Any] = {"leaf": 1}
    for _ in range(400):
        deep = {"k": deep}
    nested_lists = "[" * 400 + "1" + "]" * 400
    tar = write_tar(tmp_path / "deep.tar", [
        ("a.png", png(0)), ("a.json", json.dumps(deep).encode()),
        ("b.png", png(1)), ("b.json", b'{"x": ' + nested_lists.encode() + b"}"),
    ])
    pack(str(tar), tmp_path / "out")
    first, second = read_back(tmp_path / "out")
    assert int(first["json" + "/k" * 400 + "/leaf"][0]) == 1
    assert "json/x" not in second and json.loads(second["json"])["x"]


def test_too_many_keys_are_refused_until_the_ones_to_keep_are_named(tmp_path: Path) -> None:
    body = json.dumps({f"k{i}": i for i in range(5000)}).encode()
    tar = write_tar(tmp_path / "wide.tar", [("a.png", png(0)), ("a.json", body)])
    message = refused(str(tar), tmp_path / "out")
    assert "more than 4096 columns" in message and "--label-columns json/<key>" in message
    pack(str(tar), tmp_path / "named", fields=RowFields(labels=["json/k4999"]))
    assert int(read_back(tmp_path / "named")[0]["json/k4999"][0]) == 4999
    assert os.listdir(tmp_path / "out") == []
