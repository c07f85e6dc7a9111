"""Ingest bombs, each packed in a fresh process whose peak memory (VmHWM) is measured: tars
whose samples or JSON members inflate, Parquet files whose dictionary values, pages or list
values stand for gigabytes, tables whose rows do, a tar of headers. Each ends in a
PackError naming the file and the member or row, within 256 MiB and one record's bound
(``IngestLimits.record_bytes``)."""

from __future__ import annotations

import gzip
import io
import tarfile
import tracemalloc
import zlib
from pathlib import Path

import cv2
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from image_bombs import peak_rss_mb

from shardfeed import PackError, pack
from shardfeed.tools.pack.limits import IngestLimits

SMALL = 1 << 22
"""The max_pixels of most bombs here: one record may hold 38 MiB, so the bound is tight."""

PACK = """
import shardfeed
try:
    shardfeed.pack(ARGS["source"], ARGS["out"], max_pixels=ARGS["max_pixels"])
    RESULT["error"] = None
except shardfeed.PackError as exc:
    RESULT["error"], RESULT["message"] = "PackError", str(exc)
"""


def packed_in_a_child(source: Path, out: Path, max_pixels: int) -> tuple[float, str]:
    """Pack ``source`` in a fresh process: its peak memory (MiB) and the PackError's
    message (the test fails if it packed, or raised anything else)."""
    peak, result = peak_rss_mb(PACK, source=str(source), out=str(out), max_pixels=max_pixels)
    assert result["error"] == "PackError", result
    return peak, str(result["message"])


def bound_mib(max_pixels: int) -> float:
    return 256 + IngestLimits.of(max_pixels).record_bytes / (1 << 20)


def png() -> bytes:
    return bytes(cv2.imencode(".png", np.zeros((4, 4, 3), np.uint8))[1])


def gzip_zeros(size: int) -> bytes:
    """A gzip member of ``size`` zero bytes, compressed a block at a time."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = bytes(1 << 22)
    parts = [packer.compress(block[:min(len(block), size - at)])
             for at in range(0, size, len(block))]
    return b"".join([*parts, packer.flush()])


def tar_gz(path: Path, members: list[tuple[str, bytes | int]]) -> Path:
    """A .tar.gz of ``members``: bytes, or a count of zero bytes (compressed as they come,
    never whole in memory: gzip members one after another are one gzip stream)."""
    parts = []
    for name, body in members:
        info = tarfile.TarInfo(name)
        info.size = body if isinstance(body, int) else len(body)
        parts.append(gzip.compress(info.tobuf(tarfile.USTAR_FORMAT)))
        parts.append(gzip_zeros(body) if isinstance(body, int) else gzip.compress(body))
        parts.append(gzip.compress(bytes(-info.size % tarfile.BLOCKSIZE)))
    parts.append(gzip.compress(bytes(2 * tarfile.BLOCKSIZE)))
    path.write_bytes(b"".join(parts))
    return path


# -- tars ---------------------------------------------------------------------------------


def test_a_sample_of_members_each_under_the_limit_is_refused_at_the_record_limit(
    tmp_path: Path,
) -> None:
    """A sample whose 12 members of 32 MiB inflate to 384 MiB (each a value pack allows at
    max_pixels=2^22): refused at the member that takes it past one record, before that
    member is read (it was read whole, and the protobuf encoding failed at 3.9 GiB)."""
    members: list[tuple[str, bytes | int]] = [("s.png", png())]
    members += [(f"s.b{i:02d}", 32 << 20) for i in range(12)]
    bomb = tar_gz(tmp_path / "samples.tar.gz", members)
    assert bomb.stat().st_size < 1 << 20
    peak, message = packed_in_a_child(bomb, tmp_path / "out", SMALL)
    assert "samples.tar.gz" in message and "member 's.b01'" in message
    assert "over the limit of" in message and "for one record" in message
    assert "nothing of it was read" in message and "--max-pixels" in message
    assert peak < bound_mib(SMALL), peak


def test_a_json_member_is_refused_from_its_header_before_it_is_parsed(tmp_path: Path) -> None:
    """A 100 MB JSON array of zeros in a 100 KB .tar.gz (the issue's: parsed into 3.5 GiB of
    Python ints and packed); the JSON limit is max_pixels / 8 (16 MiB by default)."""
    body = b'{"v": [' + b"0," * (50 << 20) + b"0]}"
    bomb = tar_gz(tmp_path / "meta.tar.gz", [("s.png", png()), ("s.json", body)])
    del body
    assert bomb.stat().st_size < 1 << 20
    peak, message = packed_in_a_child(bomb, tmp_path / "out", 1 << 27)
    assert "meta.tar.gz" in message and "member 's.json'" in message
    assert f"over the limit of {16 << 20} for a JSON member" in message
    assert peak < 256, peak  # refused before a byte of it is read


def test_the_headers_of_a_tar_are_not_all_kept(tmp_path: Path) -> None:
    """tarfile keeps every header it reads: a .tar.gz of a few MB can hold millions of
    empty members (here 20,000, 10 MB kept before)."""
    info = tarfile.TarInfo("x")
    raw = io.BytesIO()
    for i in range(20_000):
        info.name = f"d{i:06d}/no-type"  # no type: no sample's member, passed over
        raw.write(info.tobuf(tarfile.USTAR_FORMAT))
    raw.write(bytes(2 * tarfile.BLOCKSIZE))
    path = tmp_path / "headers.tar.gz"
    path.write_bytes(gzip.compress(raw.getvalue()))
    tracemalloc.start()
    try:
        with pytest.raises(PackError, match="holds no rows"):
            pack(str(path), tmp_path / "out")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, peak


# -- Parquet ------------------------------------------------------------------------------


def dictionary_column(value: bytes, rows: int) -> pa.DictionaryArray:
    return pa.DictionaryArray.from_arrays(pa.array([0] * rows, pa.int32()), pa.array([value]))


def test_a_dictionary_value_repeated_by_every_row_is_read_once(tmp_path: Path) -> None:
    """The issue's 17 KB file: one 2 MB dictionary value that 1,100 rows repeat, 2.2 GiB
    as values (2.1 GiB before its PackError); read as Arrow's dictionary, it is converted a
    bounded slice of rows at a time and the first row's bad image named."""
    path = tmp_path / "dict.parquet"
    pq.write_table(pa.table({"image": dictionary_column(bytes(2_000_000), 1100),
                             "label": list(range(1100))}), path, compression="zstd")
    assert path.stat().st_size < 20_000
    peak, message = packed_in_a_child(path, tmp_path / "out", 1 << 27)
    assert "dict.parquet', row 0, column 'image'" in message
    assert peak < 400, peak  # a batch of 64 MiB, not the file's 2.2 GB


def test_a_list_repeating_a_dictionary_value_is_refused_by_its_row(tmp_path: Path) -> None:
    """One row whose list repeats a 2 MB dictionary value 100 times: 200 MB as values,
    over one record at max_pixels=2^22; refused before it is converted."""
    tags = pa.ListArray.from_arrays(pa.array([0, 100], pa.int32()),
                                    dictionary_column(bytes(2_000_000), 100))
    path = tmp_path / "tags.parquet"
    pq.write_table(pa.table({"image": [png()], "tags": tags}), path, compression="zstd")
    assert path.stat().st_size < 20_000
    peak, message = packed_in_a_child(path, tmp_path / "out", SMALL)
    assert "tags.parquet', row 0: its values take" in message
    assert "(most in column 'tags')" in message and "nothing of it was converted" in message
    assert peak < bound_mib(SMALL), peak


def test_a_page_over_one_record_is_refused_from_its_header(tmp_path: Path) -> None:
    """A plain page of 200 MB of zeros (2 KB as zstd): over one record at max_pixels=2^22,
    refused naming the row group and column before Arrow decompresses it."""
    path = tmp_path / "page.parquet"
    pq.write_table(pa.table({"image": pa.array([bytes(200 << 20)], pa.large_binary())}), path,
                   compression="zstd", use_dictionary=False)
    peak, message = packed_in_a_child(path, tmp_path / "out", SMALL)
    assert "page.parquet': row group 0, column 'image': a page of" in message
    assert "nothing of it was read" in message and "write_batch_size" in message
    assert peak < 200, peak


def test_list_values_a_dictionary_repeats_are_counted_from_the_page_headers(
    tmp_path: Path,
) -> None:
    """A row of 20 million int64 zeros stored by dictionary (a few hundred bytes): 320 MB
    once read with its levels; refused from the page headers at max_pixels=2^22."""
    values = pa.array(np.zeros(20_000_000, np.int64))
    column = pa.ListArray.from_arrays(pa.array([0, len(values)], pa.int32()), values)
    path = tmp_path / "ints.parquet"
    pq.write_table(pa.table({"image": [png()], "v": column}), path, compression="zstd")
    del values, column
    peak, message = packed_in_a_child(path, tmp_path / "out", SMALL)
    assert "ints.parquet': row group 0: its list column(s) 'v.list.element'" in message
    assert "row_group_size" in message
    assert peak < bound_mib(SMALL), peak


def test_a_damaged_page_header_is_refused_naming_the_column(tmp_path: Path) -> None:
    path = tmp_path / "damaged.parquet"
    pq.write_table(pa.table({"image": [png()] * 3, "label": [0, 1, 2]}), path,
                   use_dictionary=False, compression="none")
    column = pq.read_metadata(path).row_group(0).column(0)
    data = bytearray(path.read_bytes())
    data[column.data_page_offset] = 0x0C  # the header's first field: now a struct, unended
    data[column.data_page_offset + 1:column.data_page_offset + 40] = b"\x19" * 39
    path.write_bytes(bytes(data))
    with pytest.raises(PackError) as caught:
        pack(str(path), tmp_path / "out")
    message = str(caught.value)
    assert "damaged.parquet': row group 0, column 'image'" in message
    assert "the file is damaged" in message


# -- tables in memory ---------------------------------------------------------------------


def test_a_table_row_that_would_take_gigabytes_as_objects_is_refused_by_its_row(
    tmp_path: Path,
) -> None:
    """5 million int64 in one row are 40 MB of Arrow and 280 MB of Python ints."""
    values = pa.array(np.arange(5_000_000, dtype=np.int64))
    table = pa.table({"image": [png(), png()], "v": pa.ListArray.from_arrays(
        pa.array([0, 1, len(values)], pa.int32()), values)})
    with pytest.raises(PackError) as caught:
        pack(table, tmp_path / "out", max_pixels=SMALL)
    message = str(caught.value)
    assert "the Arrow table, row 1: its values take" in message
    assert "(most in column 'v')" in message


# -- Hugging Face ---------------------------------------------------------------------------


def saved_dataset(folder: Path) -> Path:
    datasets = pytest.importorskip("datasets")
    features = datasets.Features({"image": datasets.Image(), "label": datasets.Value("int64"),
                                  "caption": datasets.Value("string")})
    rows = {"image": [{"bytes": png(), "path": None}] * 4, "label": [0, 1, 2, 3],
            "caption": ["capA0", "capB1", "capC2", "capD3"]}
    datasets.Dataset.from_dict(rows, features=features).save_to_disk(str(folder))
    return folder / "data-00000-of-00001.arrow"


@pytest.mark.parametrize("damage", ["utf8", "offset"])
def test_a_damaged_arrow_file_is_refused_naming_it(tmp_path: Path, damage: str) -> None:
    """Text that is not UTF-8 (a UnicodeDecodeError before) and an offset past the data (a
    segmentation fault or a SystemError before) in a save_to_disk folder's .arrow file."""
    arrow = saved_dataset(tmp_path / "saved")
    data = bytearray(arrow.read_bytes())
    text = data.find(b"capA0capB1")
    assert text > 0
    if damage == "utf8":
        data[text + 5] = 0xFF
    else:  # the caption offsets (int32 0, 5, 10, 15, 20) come just before the text
        offsets = data.rfind(np.array([0, 5, 10, 15, 20], "<i4").tobytes(), 0, text)
        assert offsets > 0
        data[offsets + 8:offsets + 12] = np.array([1 << 30], "<i4").tobytes()
    arrow.write_bytes(bytes(data))
    _, message = packed_in_a_child(tmp_path / "saved", tmp_path / "out", 1 << 27)
    assert f"the file '{arrow}'" in message and "rows 0 to 3" in message
    assert "does not read as Arrow" in message and "save_to_disk" in message


def test_a_hugging_face_row_over_one_record_is_refused_by_its_row(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    data = datasets.Dataset.from_dict({"image": [png(), png()],
                                       "v": [[0], list(range(1_000_000))]})
    with pytest.raises(PackError) as caught:
        pack(data, tmp_path / "out", max_pixels=1 << 20)
    message = str(caught.value)
    assert "the Hugging Face dataset, row 1: its values take" in message
    assert "(most in column 'v')" in message
