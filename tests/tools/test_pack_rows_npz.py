"""``.npz`` archives are checked from their arrays' headers before a value is read, read a
row at a time, and anything that is not an archive of plain arrays is refused by name."""

from __future__ import annotations

import os
import pickle
import tracemalloc
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shardfeed import Dataset, PackError, pack
from shardfeed.transforms.decode.image import decode_image


def read_back(folder: Path) -> list[dict[str, Any]]:
    with Dataset(str(folder)) as ds:
        return ds.read_many(range(len(ds)))


def npy_header(dtype: str, shape: tuple[int, ...]) -> bytes:
    """The header NumPy writes for an array, without the array."""
    text = f"{{'descr': '{dtype}', 'fortran_order': False, 'shape': {shape}, }}"
    text += " " * (63 - (len(text) + 10) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text.encode()


def write_zeros_member(archive: zipfile.ZipFile, name: str, dtype: str,
                       shape: tuple[int, ...]) -> None:
    """A member holding an array of zeros, deflated as it is written (never whole in
    memory): an archive of a few megabytes that inflates to gigabytes."""
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    info = zipfile.ZipInfo(name)
    info.compress_type = zipfile.ZIP_DEFLATED
    with archive.open(info, "w", force_zip64=True) as member:
        member.write(npy_header(dtype, shape))
        block = bytes(1 << 24)
        for start in range(0, nbytes, len(block)):
            member.write(block[:nbytes - start])


def test_an_image_array_over_the_pixel_limit_is_refused_from_its_header(
    tmp_path: Path,
) -> None:
    bomb = tmp_path / "bomb.npz"
    with zipfile.ZipFile(bomb, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        write_zeros_member(archive, "image.npy", "|u1", (2, 12000, 12000))  # 288 MB
        archive.writestr("label.npy", npy_header("<i8", (2,)) + bytes(16))
    assert os.path.getsize(bomb) < 1 << 20
    tracemalloc.start()
    try:
        with pytest.raises(PackError) as caught:
            pack(str(bomb), tmp_path / "out")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    text = str(caught.value)
    assert str(bomb) in text and "'image'" in text and "2 images of 12000×12000" in text
    assert "288000000 bytes" in text and "max_pixels" in text
    assert peak < 16 << 20  # nothing near the array's size was allocated
    assert os.listdir(tmp_path / "out") == []


def test_a_large_archive_is_packed_a_row_at_a_time(tmp_path: Path) -> None:
    """64 images of 1024×1024 zeros (64 MiB inflated, a few hundred KiB on disk)."""
    path = tmp_path / "zeros.npz"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        write_zeros_member(archive, "image.npy", "|u1", (64, 1024, 1024))
        archive.writestr("label.npy", npy_header("<i8", (64,)) + np.arange(64).tobytes())
    tracemalloc.start()
    try:
        result = pack(str(path), tmp_path / "out", records_per_shard=32)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert result.records == 64
    assert peak < 32 << 20  # np.load would hold the 64 MiB array at once
    records = read_back(tmp_path / "out")
    assert [int(r["label"][0]) for r in records] == list(range(64))
    first = decode_image(records[0]["image/encoded"], mode="unchanged", where="test")
    assert first.shape == (1024, 1024) and not first.any()


def test_arrays_round_trip_with_every_plain_type(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    images = rng.integers(0, 65536, (5, 4, 3), dtype=np.uint16).astype(">u2")  # big-endian
    np.savez(tmp_path / "a.npz", image=images, y=np.arange(5, dtype=np.int16),
             w=np.linspace(0, 1, 5, dtype=np.float32), ok=np.array([True, False] * 2 + [True]),
             name=np.array([f"n{i}" for i in range(5)]), box=rng.random((5, 2, 2)))
    pack(str(tmp_path / "a.npz"), tmp_path / "out")
    records = read_back(tmp_path / "out")
    assert all(np.array_equal(decode_image(r["image/encoded"], mode="unchanged", where="t"),
                              images[i].astype(np.uint16)) for i, r in enumerate(records))
    assert [int(r["y"][0]) for r in records] == list(range(5))
    assert [int(r["ok"][0]) for r in records] == [1, 0, 1, 0, 1]
    assert [r["name"] for r in records] == [f"n{i}".encode() for i in range(5)]
    assert np.allclose([r["box"] for r in records],
                       np.load(tmp_path / "a.npz")["box"].reshape(5, 4).astype(np.float32))


@pytest.mark.parametrize("kind", ["npy", "pickle", "text"])
def test_a_file_that_is_no_archive_is_refused_by_what_it_is(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "data.npz"
    images = np.zeros((2, 4, 4), np.uint8)
    if kind == "npy":
        with open(path, "wb") as f:
            np.save(f, images)
        expected = "a single NumPy array saved as .npy"
    elif kind == "pickle":
        path.write_bytes(pickle.dumps({"image": images}))
        expected = "a Python pickle, not an .npz archive; pickles are never loaded"
    else:
        path.write_text("image,label\nTOPSECRET,1\n")
        expected = "not an .npz archive (no zip signature at byte 0)"
    with pytest.raises(PackError) as caught:
        pack(str(path), tmp_path / "out")
    text = str(caught.value)
    assert f"'{path}' is {expected}" in text and "numpy.savez" in text
    assert "TOPSECRET" not in text


def test_object_arrays_damaged_members_and_odd_headers_are_named(tmp_path: Path) -> None:
    images = np.zeros((3, 4, 4), np.uint8)
    np.savez(tmp_path / "objects.npz", image=images, label=np.array([{"a": 1}] * 3))
    with pytest.raises(PackError, match=r"objects.npz: the array 'label' holds Python objects"
                                        r".*no pickles"):
        pack(str(tmp_path / "objects.npz"), tmp_path / "o")

    # a label array whose header claims more rows than its member holds
    with zipfile.ZipFile(tmp_path / "short.npz", "w") as archive:
        archive.writestr("image.npy", npy_header("|u1", (3, 4, 4)) + images.tobytes())
        archive.writestr("label.npy", npy_header("<i8", (3,)) + bytes(16))
    with pytest.raises(PackError, match=r"short.npz: the array 'label' claims 3 <?int64 values "
                                        r"\(24 bytes\) but its member holds 16"):
        pack(str(tmp_path / "short.npz"), tmp_path / "s")

    # a label row of a gigabyte is not read to find out
    with zipfile.ZipFile(tmp_path / "wide.npz", "w") as archive:
        archive.writestr("image.npy", npy_header("|u1", (3, 4, 4)) + images.tobytes())
        archive.writestr("label.npy", npy_header("<f8", (3, 1 << 28)))
    with pytest.raises(PackError, match=r"wide.npz: the array 'label' has rows of 268435456 "
                                        r"float64 values \(2147483648 bytes\), over the"):
        pack(str(tmp_path / "wide.npz"), tmp_path / "w")

    # a damaged member: its CRC no longer matches
    np.savez(tmp_path / "flip.npz", image=images + 1, label=np.arange(3))
    data = bytearray((tmp_path / "flip.npz").read_bytes())
    at = data.index(bytes([1] * 16))
    data[at] ^= 0xFF
    (tmp_path / "flip.npz").write_bytes(bytes(data))
    with pytest.raises(PackError, match=r"cannot read the .npz archive '.*flip.npz'.*CRC"):
        pack(str(tmp_path / "flip.npz"), tmp_path / "f")
    for out in "oswf":
        assert os.listdir(tmp_path / out) == []


@pytest.mark.parametrize("key", ["label", "image"])
def test_an_array_in_fortran_order_is_refused_never_packed_with_its_rows_scrambled(
    tmp_path: Path, key: str,
) -> None:
    """A 2-D label array (and a 3-D image array) saved from a Fortran-order array: read a
    row at a time as if in C order, row 0 would hold values of several rows."""
    images = np.arange(4 * 3 * 5, dtype=np.uint8).reshape(4, 3, 5)
    labels = np.arange(8, dtype=np.int64).reshape(4, 2)
    arrays = {"image": images, "label": labels}
    arrays[key] = np.asfortranarray(arrays[key])
    assert not arrays[key].flags.c_contiguous
    np.savez(tmp_path / "fortran.npz", **arrays)
    with pytest.raises(PackError) as caught:
        pack(str(tmp_path / "fortran.npz"), tmp_path / "out")
    text = str(caught.value)
    assert "fortran.npz" in text and f"the array '{key}'" in text and "Fortran" in text
    assert "numpy.ascontiguousarray" in text
    assert os.listdir(tmp_path / "out") == []
    np.savez(tmp_path / "c.npz", image=images, label=labels)  # the same in C order packs
    pack(str(tmp_path / "c.npz"), tmp_path / "c")
    assert [r["label"].tolist() for r in read_back(tmp_path / "c")] == labels.tolist()
