"""WebDataset tar shards packed as a user packs them (``shardfeed.pack`` and ``shardfeed pack``)
and as an attacker crafts them: members kept apart, never merged or lost; duplicates,
repeated keys, links and oversized members refused by tar and member; ``.tar.gz`` shards and
two-part types (``x.rgb.jpg``, ``x.seg.png``)."""

from __future__ import annotations

import gzip
import io
import json
import os
import tarfile
import tracemalloc
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

from shardfeed import Dataset, PackError, pack
from shardfeed.cli.main import main
from shardfeed.tools.pack.rows import RowFields

Member = tuple[str, bytes]


def png(seed: int, shape: tuple[int, ...] = (6, 5, 3)) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)
    return bytes(cv2.imencode(".png", pixels)[1])


def jpeg(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (8, 8, 3), dtype=np.uint8)
    return bytes(cv2.imencode(".jpg", pixels)[1])


def write_tar(path: Path, members: Sequence[Member | tarfile.TarInfo], mode: str = "w") -> Path:
    with tarfile.open(path, mode) as tar:  # type: ignore[call-overload]
        for m in members:
            if isinstance(m, tarfile.TarInfo):
                tar.addfile(m)
                continue
            info = tarfile.TarInfo(m[0])
            info.size = len(m[1])
            tar.addfile(info, io.BytesIO(m[1]))
    return path


def read_back(folder: Path) -> list[dict[str, Any]]:
    with Dataset(str(folder)) as ds:
        return ds.read_many(range(len(ds)))


def refused(source: Any, out: Path, **kwargs: Any) -> str:
    """The message of the PackError that packing ``source`` raises; the output stays empty."""
    with pytest.raises(PackError) as info:
        pack(source, out, **kwargs)
    assert os.listdir(out) == []
    return str(info.value)


# -- 5: members kept apart, duplicates and repeated keys refused, the key kept ----------------


def test_a_json_member_keeps_its_keys_apart_from_the_cls_label_and_the_image(
    tmp_path: Path,
) -> None:
    tar = write_tar(tmp_path / "a.tar", [
        ("s0.png", png(0)), ("s0.cls", b"2"),
        ("s0.json", json.dumps({"label": 7, "image": "elsewhere.png", "w": 0.5}).encode()),
    ])
    pack(str(tar), tmp_path / "out")
    (record,) = read_back(tmp_path / "out")
    assert int(record["label"][0]) == 2  # the .cls label, not the JSON's
    assert int(record["json/label"][0]) == 7
    assert record["json/image"] == b"elsewhere.png"  # kept, as text
    assert float(record["json/w"][0]) == 0.5
    assert record["image/encoded"] == png(0)
    assert record["image/filename"] == b"s0"


def test_two_members_of_one_type_in_a_sample_are_refused_by_tar_and_member(
    tmp_path: Path,
) -> None:
    tar = write_tar(tmp_path / "dup.tar", [("a.png", png(0)), ("a.cls", b"0"),
                                           ("a.png", png(1))])
    message = refused(str(tar), tmp_path / "out")
    assert "dup.tar" in message and "'a.png'" in message and "two members" in message


def test_a_key_seen_again_later_in_the_tar_is_refused(tmp_path: Path) -> None:
    tar = write_tar(tmp_path / "again.tar", [("a.png", png(0)), ("b.png", png(1)),
                                             ("a.jpg", jpeg(2))])
    message = refused(str(tar), tmp_path / "out")
    assert "again.tar" in message and "'a.jpg'" in message and "adjacent" in message


def test_the_command_with_label_columns_keeps_the_key_as_the_name(tmp_path: Path) -> None:
    tar = write_tar(tmp_path / "k.tar", [(f"key{i}.{t}", d) for i in range(3)
                                         for t, d in (("png", png(i)), ("cls", b"%d" % i),
                                                      ("txt", b"caption"))])
    assert main(["pack", str(tar), str(tmp_path / "out"), "--label-columns", "label",
                 "--no-progress"]) == 0
    records = read_back(tmp_path / "out")
    assert [r["image/filename"] for r in records] == [b"key0", b"key1", b"key2"]
    assert [int(r["label"][0]) for r in records] == [0, 1, 2]
    assert "txt" not in records[0]  # only the label columns named


# -- 7: data never chooses a local file; no message quotes a member ---------------------------


def test_a_json_value_naming_a_local_file_is_never_read_as_the_image(tmp_path: Path) -> None:
    secret = tmp_path / "secret.png"
    secret.write_bytes(png(9))
    tar = write_tar(tmp_path / "evil.tar", [("a.json", json.dumps({"png": str(secret)}).encode()),
                                            ("a.cls", b"1")])
    message = refused(str(tar), tmp_path / "out")
    assert "evil.tar" in message and "no image member" in message
    message = refused(str(tar), tmp_path / "out", fields=RowFields(image="json/png"))
    assert "no member of type 'json/png'" in message


def test_a_member_of_an_image_type_that_is_no_image_is_named_not_quoted(tmp_path: Path) -> None:
    tar = write_tar(tmp_path / "t.tar", [("a.png", b"token=hunter2-very-secret\n")])
    message = refused(str(tar), tmp_path / "out")
    assert "t.tar" in message and "'a.png'" in message and "not an image" in message
    assert "hunter" not in message and "token" not in message


# -- 8: sizes from the header before reading --------------------------------------------------


def sparse_member(name: str, real_size: int, data: bytes) -> bytes:
    """A GNU sparse member's header and data: ``data`` at offset 0, the rest a hole, the
    whole ``real_size`` bytes."""
    info = tarfile.TarInfo(name)
    info.type = tarfile.GNUTYPE_SPARSE
    info.size = len(data)
    header = bytearray(info.tobuf(format=tarfile.GNU_FORMAT))
    header[386:398] = b"%011o\0" % 0
    header[398:410] = b"%011o\0" % len(data)
    header[483:495] = b"%011o\0" % real_size
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)
    padded = data + bytes(-len(data) % tarfile.BLOCKSIZE)
    return bytes(header) + padded


def test_a_sparse_member_claiming_10_gib_is_refused_from_its_header(tmp_path: Path) -> None:
    body = (sparse_member("a.png", 10 << 30, png(0)[:512]) + bytes(2 * tarfile.BLOCKSIZE))
    path = tmp_path / "bomb.tar"
    path.write_bytes(body)
    assert path.stat().st_size < 10 << 10
    tracemalloc.start()
    try:
        message = refused(str(path), tmp_path / "out")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "bomb.tar" in message and "'a.png'" in message and str(10 << 30) in message
    assert "--max-pixels" in message
    assert peak < 64 << 20


def test_a_gzipped_member_over_the_limit_is_refused_before_it_is_inflated(
    tmp_path: Path,
) -> None:
    path = tmp_path / "zeros.tar.gz"
    with gzip.open(path, "wb") as raw, tarfile.open(fileobj=raw, mode="w") as tar:
        info = tarfile.TarInfo("a.ppm")
        info.size = 40 << 20
        tar.addfile(info, io.BytesIO(bytes(info.size)))
    message = refused(str(path), tmp_path / "out", max_pixels=1 << 20)
    assert "zeros.tar.gz" in message and "'a.ppm'" in message and str(40 << 20) in message


# -- 12: bad members named, with the fix --------------------------------------------------------


@pytest.mark.parametrize(("member", "expected"), [
    (("a.cls", b"three"), "whole number"),
    (("a.json", b"[1, 2]"), "JSON array, not an object"),
    (("a.json", b'{"w": 1,'), "not valid JSON"),
])
def test_a_bad_label_member_is_named_with_its_tar(
    tmp_path: Path, member: Member, expected: str,
) -> None:
    tar = write_tar(tmp_path / "bad.tar", [("a.png", png(0)), member])
    message = refused(str(tar), tmp_path / "out")
    assert "bad.tar" in message and f"'{member[0]}'" in message and expected in message


def test_members_of_a_sample_apart_in_the_tar_are_named(tmp_path: Path) -> None:
    tar = write_tar(tmp_path / "apart.tar", [("a.cls", b"0"), ("b.png", png(1)),
                                             ("a.png", png(0))])
    message = refused(str(tar), tmp_path / "out")
    assert "apart.tar" in message and "sample 'a'" in message and "adjacent" in message


# -- 13: .tar.gz shards, two-part types -----------------------------------------------------------


def test_gzipped_shards_and_two_part_types_from_the_library_and_the_command(
    tmp_path: Path,
) -> None:
    members = [[(f"x{i}.rgb.jpg", jpeg(i)), (f"x{i}.seg.png", png(i, (8, 8))),
                (f"x{i}.cls", b"%d" % i)] for i in range(4)]
    first = write_tar(tmp_path / "s0.tar.gz", [m for s in members[:2] for m in s], "w:gz")
    second = write_tar(tmp_path / "s1.tgz", [m for s in members[2:] for m in s], "w:gz")
    pack([str(first), str(second)], tmp_path / "lib")
    assert main(["pack", str(first), str(second), str(tmp_path / "cli"), "--no-progress"]) == 0
    for out in ("lib", "cli"):
        records = read_back(tmp_path / out)
        assert [r["image/filename"] for r in records] == [b"x0", b"x1", b"x2", b"x3"]
        assert [r["image/encoded"] for r in records] == [jpeg(i) for i in range(4)]
        assert [r["mask/encoded"] for r in records] == [png(i, (8, 8)) for i in range(4)]
        assert [int(r["label"][0]) for r in records] == [0, 1, 2, 3]


def test_the_mask_is_kept_when_the_labels_are_named(tmp_path: Path) -> None:
    tar = write_tar(tmp_path / "m.tar", [("x.jpg", jpeg(0)), ("x.seg.png", png(1, (8, 8))),
                                         ("x.cls", b"4")])
    pack(str(tar), tmp_path / "out", fields=RowFields(labels=["label"]))
    (record,) = read_back(tmp_path / "out")
    assert record["mask/encoded"] == png(1, (8, 8)) and int(record["label"][0]) == 4


def test_two_image_members_are_refused_until_one_is_named(tmp_path: Path) -> None:
    tar = write_tar(tmp_path / "two.tar", [("x.jpg", jpeg(0)), ("x.depth.png", png(1))])
    message = refused(str(tar), tmp_path / "out")
    assert "'x.jpg'" in message and "'x.depth.png'" in message and "--image-column" in message
    pack(str(tar), tmp_path / "out", fields=RowFields(image="jpg"))
    (record,) = read_back(tmp_path / "out")
    assert record["image/encoded"] == jpeg(0) and record["depth.png"] == png(1)


# -- hostile tars: links and devices, cut short, damaged ------------------------------------------


@pytest.mark.parametrize("kind", [tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.CHRTYPE])
def test_links_and_devices_are_refused_never_followed(tmp_path: Path, kind: bytes) -> None:
    link = tarfile.TarInfo("b.png")
    link.type = kind
    link.linkname = "a.png" if kind != tarfile.SYMTYPE else "/etc/hostname"
    tar = write_tar(tmp_path / "links.tar", [("a.png", png(0)), link])
    message = refused(str(tar), tmp_path / "out")
    assert "links.tar" in message and "'b.png'" in message and "not a file" in message


def test_a_tar_cut_short_or_damaged_is_refused_not_packed_in_part(tmp_path: Path) -> None:
    whole = write_tar(tmp_path / "whole.tar", [(f"s{i}.png", png(i)) for i in range(4)])
    data = whole.read_bytes()
    with tarfile.open(whole) as t:
        third = t.getmember("s2.png").offset
    cut = tmp_path / "cut.tar"
    cut.write_bytes(data[:third])  # at a member boundary: tarfile reads two samples, no error
    message = refused(str(cut), tmp_path / "out")
    assert "cut.tar" in message and "end-of-archive marker" in message
    damaged = tmp_path / "damaged.tar"
    damaged.write_bytes(data[:third] + b"\x01" * 512 + data[third + 512:])
    message = refused(str(damaged), tmp_path / "out")
    assert "damaged.tar" in message and "damaged member header" in message


def test_images_with_masks_and_no_label_have_no_label_key(tmp_path: Path) -> None:
    """A segmentation set (x.jpg + x.seg.png, no class): the mask is the mask, never the
    label a loader hands back; with a .cls the label is the class."""
    bare = write_tar(tmp_path / "seg.tar", [m for i in range(2) for m in (
        (f"x{i}.jpg", jpeg(i)), (f"x{i}.seg.png", png(i, (8, 8))))])
    pack(str(bare), tmp_path / "bare")
    with Dataset(str(tmp_path / "bare")) as ds:
        assert ds.schema is not None and ds.schema.label_key is None
        assert ds.schema.mask is not None and ds.schema.mask.key == "mask/encoded"
    classed = write_tar(tmp_path / "cls.tar", [m for i in range(2) for m in (
        (f"x{i}.seg.png", png(i, (8, 8))), (f"x{i}.jpg", jpeg(i)), (f"x{i}.cls", b"%d" % i))])
    pack(str(classed), tmp_path / "classed")
    with Dataset(str(tmp_path / "classed")) as ds:
        assert ds.schema is not None and ds.schema.label_key == "label"
