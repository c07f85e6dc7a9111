"""Index files are untrusted input: every offset is checked on load, with a FormatError
naming the file and the entry or line, in time and memory linear in the index."""

from __future__ import annotations

import io
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardfeed.errors import FormatError, ShardfeedError
from shardfeed.format.framing import scan
from shardfeed.format.index import (
    load_binary_index,
    parse_binary_index,
    parse_text_index,
    read_text_index,
    write_binary_index,
)


def _npy(values: list[int]) -> bytes:
    """A .npy file of ``values`` as NumPy writes it."""
    buf = io.BytesIO()
    np.save(buf, np.array(values, dtype="<u8"), allow_pickle=False)
    return buf.getvalue()


@pytest.mark.parametrize("wild", [1 << 62, 1 << 34, (1 << 64) - 1])
def test_a_wild_binary_offset_is_refused_on_load(tmp_path: Path, wild: int) -> None:
    path = tmp_path / "a.tfrecord.idx.npy"
    path.write_bytes(_npy([0, wild, 200]))
    for load in (lambda: load_binary_index(path), lambda: load_binary_index(path, mmap=False),
                 lambda: parse_binary_index(path.read_bytes(), path=str(path))):
        with pytest.raises(FormatError, match=r"a\.tfrecord\.idx\.npy', entry [01]"):
            load()


@pytest.mark.parametrize(
    "offsets,entry",
    [([5, 100], "first offset is 5"), ([0, 10, 100], "entry 0"), ([0, 50, 40], "entry 1"),
     ([0, 50, 50, 90], "entry 1")],
)
def test_offsets_must_start_at_0_and_grow_by_a_framed_record(
    tmp_path: Path, offsets: list[int], entry: str
) -> None:
    path = tmp_path / "b.idx.npy"
    path.write_bytes(_npy(offsets))
    with pytest.raises(FormatError, match=entry):
        load_binary_index(path)


def _with_header(header: bytes, values: list[int]) -> bytes:
    """A version 1.0 .npy file of ``header`` (padded as NumPy pads) and ``values`` as <u8."""
    body = header.ljust(117) + b"\n"
    data = b"\x93NUMPY\x01\x00" + len(body).to_bytes(2, "little") + body
    return data + np.array(values, dtype="<u8").tobytes()


@pytest.mark.parametrize(
    "header",
    [b"{'descr': '<u8', 'fortran_order': False, 'shape': ((((((((, }",  # TokenError before
     b"{'descr': '<u8', 'fortran_order': False, 'shape': (3,), 'x': 1}",
     b"{'descr': '|O', 'fortran_order': False, 'shape': (3,), }",
     b"{'descr': '<u8', 'fortran_order': False, 'shape': (99999999999999999999,), }",
     b"{'descr': '<u8', 'fortran_order': False, 'shape': (3, 1), }",
     b"{'descr': '<u8', 'fortran_order': False, 'shape': (-1,), }",
     b"{'descr': '<u8', 'fortran_order': False, 'shape': (4,), }"],
)
def test_a_damaged_npy_header_is_a_format_error(tmp_path: Path, header: bytes) -> None:
    data = _with_header(header, [0, 20, 40])
    path = tmp_path / "c.idx.npy"
    path.write_bytes(data)
    with pytest.raises(FormatError, match=r"c\.idx\.npy' is not a binary index"):
        load_binary_index(path)
    with pytest.raises(FormatError, match=r"is not a binary index"):
        parse_binary_index(data, path="c.idx.npy")


def test_a_huge_claimed_shape_allocates_nothing() -> None:
    """A header claiming 2**40 values fails on the data length before any allocation."""
    data = _with_header(b"{'descr': '<u8', 'fortran_order': False, 'shape': (1099511627776,), }",
                        [0, 20])
    tracemalloc.start()
    try:
        with pytest.raises(FormatError, match="1099511627776 values"):
            parse_binary_index(data, path="d.idx.npy")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


@pytest.mark.parametrize(
    "text,what",
    [(b"0 -1\n", "line 1: not an index"), (b"0 18446744073709551616\n", "line 1: a number past"),
     (b"0 20\n20 9223372036854775808\n", "line 2: a number past"),
     (b"0 20\n20 +5\n", "line 2: not an index"), (b"0 1_0\n", "line 1: not an index"),
     (b"0 20\n20 8\n", "line 2: record 1 starts at byte 20 and the next at byte 28"),
     (b"0 0\n", "line 1: record 0")],
)
def test_text_index_numbers_out_of_range_are_format_errors(
    tmp_path: Path, text: bytes, what: str
) -> None:
    path = tmp_path / "e.tfrecord.idx"
    path.write_bytes(text)
    with pytest.raises(FormatError, match=f"e.tfrecord.idx', {what}"):
        read_text_index(path)


def test_real_indexes_still_load(tf_fixtures: Path, tmp_path: Path) -> None:
    offsets = scan(tf_fixtures / "mixed.tfrecord")
    np.testing.assert_array_equal(read_text_index(tf_fixtures / "mixed.idx"), offsets)
    write_binary_index(tmp_path / "m.idx.npy", offsets)
    np.testing.assert_array_equal(load_binary_index(tmp_path / "m.idx.npy"), offsets)
    data = (tmp_path / "m.idx.npy").read_bytes()
    np.testing.assert_array_equal(parse_binary_index(data), offsets)


def test_a_pipe_in_place_of_an_index_does_not_block(tmp_path: Path) -> None:
    import os

    fifo = tmp_path / "f.idx.npy"
    os.mkfifo(fifo)
    with pytest.raises(FormatError, match="not a regular file"):
        load_binary_index(fifo)


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=300), text=st.binary(max_size=200))
def test_any_bytes_give_offsets_or_a_format_error(data: bytes, text: bytes) -> None:
    for parse in (lambda: parse_binary_index(b"\x93NUMPY\x01\x00" + data),
                  lambda: parse_binary_index(data), lambda: parse_text_index(text)):
        try:
            offsets = parse()
        except ShardfeedError as exc:
            assert isinstance(exc, FormatError)
            continue
        assert offsets[0] == 0 and bool(np.all(np.diff(offsets.astype(np.int64)) >= 16))
