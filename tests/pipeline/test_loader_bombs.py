"""Decompression bombs in a dataset, through the Loader: embedded, raw, referenced, patches.

With ``on_error="raise"`` the Loader stops with a DecodeError naming the shard, record, byte
offset and the size the header claims; with ``"skip"`` the sample is replaced and counted;
either way memory stays small (measured in a fresh process)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import simplejpeg
from image_bombs import jpeg_bomb, peak_rss_mb, png_bomb

from shardfeed.dataset import Dataset
from shardfeed.errors import DecodeError
from shardfeed.format.writer import ShardWriter
from shardfeed.pipeline import Loader, Patches
from shardfeed.transforms import DecodeImage, presets

N = 24
BAD = 13


def _image(i: int) -> np.ndarray:
    return np.full((24, 32, 3), (i * 9) % 250, np.uint8)


def write_bombed(folder: Path, bomb: bytes, *, bad: int = BAD) -> Path:
    """``N`` records of small JPEGs over two shards; record ``bad`` holds ``bomb``."""
    folder.mkdir(parents=True)
    for s, ids in enumerate((range(N // 2), range(N // 2, N))):
        with ShardWriter(str(folder / f"part-{s}.tfrecord")) as writer:
            for i in ids:
                writer.write_example({
                    "image/encoded": bomb if i == bad else bytes(simplejpeg.encode_jpeg(_image(i))),
                    "image/height": [24], "image/width": [32], "index": [i],
                })
    return folder


def write_raw(folder: Path, *, bad: int = BAD) -> Path:
    """Raw records; record ``bad`` claims 40000×40000 over 12 bytes of pixels."""
    folder.mkdir(parents=True)
    with ShardWriter(str(folder / "part-0.tfrecord")) as writer:
        for i in range(N):
            h, w = (40000, 40000) if i == bad else (24, 32)
            pixels = bytes(12) if i == bad else _image(i).tobytes()
            writer.write_example({"image/raw": pixels, "image/height": [h], "image/width": [w],
                                  "image/channels": [3], "index": [i]})
    return folder


def ids_of(loader: Loader) -> list[int]:
    return [int(i) for batch in loader for i in np.asarray(batch["index"]).reshape(-1)]


@pytest.mark.parametrize(("bomb", "claim"), [
    (jpeg_bomb(30000, 30000), "JPEG image claims 30000×30000"),
    (png_bomb(60000, 60000), "PNG image claims 60000×60000"),
], ids=["jpeg", "png"])
@pytest.mark.parametrize("transform", ["train", "eval", "decode"])
def test_raise_names_shard_record_offset_and_claimed_size(
    tmp_path: Path, bomb: bytes, claim: str, transform: str
) -> None:
    op: Any = {"train": presets.train(size=16), "eval": presets.eval(size=16),
               "decode": DecodeImage()}[transform]
    ds = Dataset(str(write_bombed(tmp_path / "ds", bomb)))
    path, record, offset = ds.locate(BAD)
    loader = Loader(ds, batch_size=4, shuffle=False, transform=op, num_threads=2)
    with pytest.raises(DecodeError) as caught:
        list(loader)
    error = caught.value
    assert (error.path, error.record, error.offset) == (path, record, offset)
    text = str(error)
    assert claim in text and "more than max_pixels=134,217,728" in text
    assert "part-1.tfrecord" in text and f"record {record} at byte {offset}" in text
    loader.close()


@pytest.mark.parametrize("bomb", [jpeg_bomb(60000, 60000), png_bomb(60000, 60000)],
                         ids=["jpeg", "png"])
def test_skip_replaces_and_counts_a_bomb(tmp_path: Path, bomb: bytes) -> None:
    ds = Dataset(str(write_bombed(tmp_path / "ds", bomb)))
    loader = Loader(ds, batch_size=5, seed=3, on_error="skip", transform=presets.train(size=16),
                    num_threads=2)
    ids = ids_of(loader)
    assert len(ids) == N and BAD not in ids and len(set(ids)) == N - 1
    assert loader.stats().skipped_total == 1
    loader.close()


def test_a_raw_record_claiming_a_huge_size_is_refused(tmp_path: Path) -> None:
    ds = Dataset(str(write_raw(tmp_path / "raw")))
    _, record, offset = ds.locate(BAD)
    with pytest.raises(DecodeError, match=r"raw image claims 40000×40000 .* more than max_pixels"
                       ) as caught:
        list(Loader(ds, batch_size=4, shuffle=False, transform=presets.eval(size=16)))
    assert (caught.value.record, caught.value.offset) == (record, offset)
    skipping = Loader(ds, batch_size=4, on_error="skip", transform=presets.eval(size=16))
    assert BAD not in ids_of(skipping) and skipping.stats().skipped_total == 1


def test_a_referenced_bomb_is_refused(tmp_path: Path) -> None:
    images = tmp_path / "images"
    images.mkdir()
    folder = tmp_path / "ref"
    folder.mkdir()
    with ShardWriter(str(folder / "part-0.tfrecord")) as writer:
        for i in range(N):
            name = f"{i}.jpg"
            data = jpeg_bomb(40000, 50000) if i == BAD else bytes(simplejpeg.encode_jpeg(_image(i)))
            (images / name).write_bytes(data)
            writer.write_example({"image/path": name.encode(), "index": [i]})
    ds = Dataset(str(folder), root=str(images))
    with pytest.raises(DecodeError, match="JPEG image claims 40000×50000"):
        list(Loader(ds, batch_size=4, shuffle=False, transform=presets.train(size=16)))
    skipping = Loader(ds, batch_size=4, on_error="skip", transform=presets.train(size=16))
    assert BAD not in ids_of(skipping) and skipping.stats().skipped_total == 1


def test_patches_refuse_a_bomb_and_skip_it(tmp_path: Path) -> None:
    ds = Dataset(str(write_bombed(tmp_path / "ds", jpeg_bomb(30000, 30000))))
    patches = Patches(ds, size=8, cache_images=4, refresh_every=2)
    with pytest.raises(DecodeError, match="claims 30000×30000"):
        list(Loader(patches, batch_size=4, shuffle=False))
    # every patch the schedule cuts from the bad image is a bad sample, replaced
    skipping = Loader(Patches(ds, size=8, cache_images=4, refresh_every=2, scale=(2, 3)),
                      batch_size=4, on_error="skip", seed=1, max_skipped=40)
    records = [int(r) for b in skipping for r in b["patch/record"]]
    assert BAD not in records and skipping.stats().skipped_total >= 1
    with pytest.raises(ValueError, match="max_pixels must be >= 1"):
        Patches(ds, size=8, cache_images=4, refresh_every=2, max_pixels=0)


def test_a_loader_over_bombs_stays_small(tmp_path: Path) -> None:
    """Before the limit, one 30000×30000 JPEG bomb took 2.7 GB in DecodeImage."""
    write_bombed(tmp_path / "a", jpeg_bomb(30000, 30000))
    write_bombed(tmp_path / "b", png_bomb(60000, 60000), bad=2)
    peak, result = peak_rss_mb("""
        from shardfeed.dataset import Dataset
        from shardfeed.pipeline import Loader
        from shardfeed.transforms import DecodeImage, CenterCrop, Compose, presets
        seen = []
        for folder in ARGS["folders"]:
            for op in (Compose([DecodeImage(), CenterCrop(16)]), presets.train(size=16)):
                loader = Loader(Dataset(folder), batch_size=4, on_error="skip", transform=op,
                                num_threads=2)
                seen.append(sum(len(b["index"]) for b in loader))
                seen.append(loader.stats().skipped_total)
                loader.close()
        RESULT["seen"] = seen
    """, folders=[str(tmp_path / "a"), str(tmp_path / "b")])
    assert result["seen"] == [N, 1] * 4
    assert peak < 300
