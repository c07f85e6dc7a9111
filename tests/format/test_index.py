"""Index files: DALI text .idx byte equality and the binary .idx.npy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardfeed.errors import FormatError
from shardfeed.format.framing import scan
from shardfeed.format.index import (
    format_text_index,
    load_binary_index,
    parse_text_index,
    read_text_index,
    write_binary_index,
    write_text_index,
)


@pytest.mark.parametrize("name", ["mixed", "second"])
def test_text_index_equals_tfrecord2idx(tf_fixtures: Path, tmp_path: Path, name: str) -> None:
    offsets = scan(tf_fixtures / f"{name}.tfrecord")
    out = tmp_path / f"{name}.idx"
    write_text_index(out, offsets)
    assert out.read_bytes() == (tf_fixtures / f"{name}.idx").read_bytes()
    np.testing.assert_array_equal(read_text_index(tf_fixtures / f"{name}.idx"), offsets)


def test_empty_index(tmp_path: Path) -> None:
    write_text_index(tmp_path / "e.idx", np.zeros(1, dtype=np.uint64))
    assert (tmp_path / "e.idx").read_bytes() == b""
    assert read_text_index(tmp_path / "e.idx").tolist() == [0]


def test_binary_index_is_memory_mapped(tf_fixtures: Path, tmp_path: Path) -> None:
    offsets = scan(tf_fixtures / "mixed.tfrecord")
    write_binary_index(tmp_path / "m.idx.npy", offsets)
    loaded = load_binary_index(tmp_path / "m.idx.npy")
    assert isinstance(loaded, np.memmap)
    assert loaded.dtype == np.uint64
    np.testing.assert_array_equal(loaded, offsets)
    np.testing.assert_array_equal(load_binary_index(tmp_path / "m.idx.npy", mmap=False), offsets)


def test_bad_text_index_is_refused(tmp_path: Path) -> None:
    with pytest.raises(FormatError, match="not contiguous"):
        parse_text_index(b"0 10\n12 10\n", path="gap.idx")
    with pytest.raises(FormatError, match="not an index"):
        parse_text_index(b"0 10\nhello\n", path="bad.idx")
    with pytest.raises(FormatError, match="odd number"):
        parse_text_index(b"0 10 20\n", path="odd.idx")


def test_bad_binary_index_is_refused(tmp_path: Path) -> None:
    np.save(tmp_path / "f.idx.npy", np.arange(3, dtype=np.float32))
    with pytest.raises(FormatError, match="f.idx.npy"):
        load_binary_index(tmp_path / "f.idx.npy")
    (tmp_path / "g.idx.npy").write_bytes(b"garbage")
    with pytest.raises(FormatError, match="re-run `shardfeed index`"):
        load_binary_index(tmp_path / "g.idx.npy")


def test_unsorted_offsets_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="non-decreasing"):
        write_binary_index(tmp_path / "x.idx.npy", np.array([0, 10, 5], dtype=np.uint64))


@settings(max_examples=50, deadline=None)
@given(sizes=st.lists(st.integers(16, 10**12), max_size=50))
def test_index_round_trips(tmp_path_factory: Any, sizes: list[int]) -> None:
    offsets = np.cumsum([0, *sizes], dtype=np.uint64)
    text = format_text_index(offsets)
    lines = text.decode().splitlines()
    assert len(lines) == len(sizes)
    if sizes:
        assert lines[-1] == f"{int(offsets[-2])} {sizes[-1]}"
    np.testing.assert_array_equal(parse_text_index(text), offsets)
    path = tmp_path_factory.mktemp("idx") / "r.idx.npy"
    write_binary_index(path, offsets)
    np.testing.assert_array_equal(load_binary_index(path), offsets)


def test_an_operating_system_error_is_not_blamed_on_the_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    from shardfeed.format import index as index_module
    from shardfeed.format import npyfile

    path = tmp_path / "a.idx.npy"
    index_module.write_binary_index(path, np.array([0, 20], dtype=np.uint64))

    def no_descriptors(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(npyfile.np, "memmap", no_descriptors)
    with pytest.raises(OSError, match="Too many open files") as info:
        index_module.load_binary_index(path)
    assert "delete" not in str(info.value)
