"""``exif_orientation="apply"`` turns a tagged JPEG as its EXIF tag says, the same on every
decode path: a tagged photo gives the batches of the same photo turned in an editor and saved
without a tag, through the whole decode, the DCT-scaled decode, the region decode (with the
nvImageCodec extra and without it), with masks drawn on the turned photo, and the patch
decode.

The photos are made of flat 16×16 cells, 4:4:4 at quality 100, with sides that are multiples
of 16: such a JPEG holds only DC coefficients, so the turned copy decodes to exactly the
turned pixels at every DCT scale and in every region, and any difference is the code's."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from exif_photos import assert_same, batches, encode, pack_csv, photo, png, with_orientation
from PIL import Image, ImageOps
from transforms_helpers import count_region_decodes

from shardfeed.dataset import Dataset
from shardfeed.pipeline import Loader
from shardfeed.transforms import presets
from shardfeed.transforms.decode import crop, region
from shardfeed.transforms.decode.fields import ImageField
from shardfeed.transforms.decode.image import decode_image
from shardfeed.transforms.decode.ops import DecodeImage
from shardfeed.transforms.decode.orientation import (
    jpeg_orientation,
    orient,
    oriented_size,
)
from shardfeed.transforms.decode.patches import decode_for_patches

HEIGHT, WIDTH = 704, 896
TURNS = (2, 3, 4, 5, 6, 7, 8, 6)  # the last one CMYK (decoded by OpenCV)


def _cells(seed: int) -> np.ndarray:
    cells = np.random.default_rng(seed).integers(0, 256, (HEIGHT // 16, WIDTH // 16, 3),
                                                 dtype=np.uint8)
    return np.repeat(np.repeat(cells, 16, axis=0), 16, axis=1)


def _jpeg(pixels: np.ndarray, *, cmyk: bool) -> bytes:
    return encode(pixels, cmyk=cmyk, quality=100, subsampling=0)


def _mask(seed: int, turn: int) -> bytes:
    """A mask drawn on the turned photo (a PNG has no tag): the stored mask turned."""
    mask = np.zeros((HEIGHT, WIDTH), np.uint8)
    mask[: HEIGHT // 3, : WIDTH // 4] = 1 + seed % 3
    mask[HEIGHT // 2:, WIDTH // 2:] = 4
    return png(orient(mask, turn))


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Dataset]:
    base = tmp_path_factory.mktemp("exif-apply")
    tagged, turned, masks = [], [], []
    for i, turn in enumerate(TURNS):
        cmyk = i == len(TURNS) - 1
        tagged.append(with_orientation(_jpeg(_cells(i), cmyk=cmyk), turn,
                                       order="II" if i % 2 else "MM"))
        turned.append(_jpeg(orient(_cells(i), turn), cmyk=cmyk))
        masks.append(_mask(i, turn))
    return {
        "tagged": pack_csv(base / "tagged", tagged, None),
        "turned": pack_csv(base / "turned", turned, None),
        # pack checks a mask against the photo's size as shown: 896×704 for a 704×896 one
        # tagged 5-8, as the loader that applies the tag decodes it
        "tagged+masks": pack_csv(base / "tagged-masks", tagged, masks),
        "turned+masks": pack_csv(base / "turned-masks", turned, masks),
    }


def _batches(source: Any, transform: Any, batch_size: int = 4) -> list[dict[str, np.ndarray]]:
    return batches(source, transform, batch_size=batch_size, seed=3)


_assert_same = assert_same


PRESETS = {
    "train-384": lambda: presets.train(size=384, exif_orientation="apply"),  # region
    "eval-384": lambda: presets.eval(size=384, exif_orientation="apply"),
    "train-96": lambda: presets.train(size=96, exif_orientation="apply"),  # DCT-scaled
    "eval-128": lambda: presets.eval(size=128, exif_orientation="apply"),
    "center-300-warp": lambda: crop.DecodeCenterCrop(300, crop_fraction=0.9,
                                                     exif_orientation="apply"),
    "gray-384": lambda: crop.DecodeRandomResizedCrop(384, channels="gray", hflip=0.5,
                                                     exif_orientation="apply"),
}


@pytest.mark.parametrize("masks", [False, True])
@pytest.mark.parametrize("name", sorted(PRESETS))
@pytest.mark.parametrize("extra", ["installed", "absent"])
def test_a_tagged_photo_gives_the_turned_photos_batches(
        packed: dict[str, Dataset], name: str, masks: bool, extra: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    if extra == "absent":
        monkeypatch.setattr(region, "_loaded", [None])  # as without the extra
    suffix = "+masks" if masks else ""
    tagged = _batches(packed["tagged" + suffix], PRESETS[name]())
    turned = _batches(packed["turned" + suffix], PRESETS[name]())
    _assert_same(tagged, turned)


def test_the_region_decoder_takes_the_turned_images_boxes(
        packed: dict[str, Dataset], monkeypatch: pytest.MonkeyPatch) -> None:
    """The region path is taken for tagged photos too (not a silent whole decode)."""
    used = count_region_decodes(monkeypatch)
    _batches(packed["tagged"], presets.train(size=384, exif_orientation="apply"))
    assert sum(used) >= len(TURNS)


def test_the_whole_decode_gives_the_turned_photo(packed: dict[str, Dataset]) -> None:
    tagged, turned = packed["tagged+masks"], packed["turned+masks"]
    ops = [DecodeImage(exif_orientation="apply").bind(ds.schema, root=ds.root)
           for ds in (tagged, turned)]
    rng = np.random.default_rng(0)
    for i, turn in enumerate(TURNS):
        a, b = (op(dict(ds[i]), rng) for op, ds in zip(ops, (tagged, turned)))
        assert a["image"].shape == (*oriented_size(HEIGHT, WIDTH, turn), 3)
        np.testing.assert_array_equal(a["image"], b["image"])
        np.testing.assert_array_equal(a["mask"], b["mask"])


def test_the_patch_decode_gives_the_turned_photo(packed: dict[str, Dataset]) -> None:
    tagged, turned = packed["tagged+masks"], packed["turned+masks"]
    fields = [ImageField(exif_orientation="apply").bound(ds.schema.image, root=ds.root)
              for ds in (tagged, turned)]
    masks = [ImageField(is_mask=True, exif_orientation="apply").bound(ds.schema.mask,
                                                                       root=ds.root)
             for ds in (tagged, turned)]
    for i in range(len(TURNS)):
        for d in (1, 2, 4):
            a, b = (decode_for_patches(ds[i], image_field=f, mask_field=m, denominator=d,
                                       max_pixels=1 << 27, require_mask=True)
                    for ds, f, m in zip((tagged, turned), fields, masks))
            assert a.full_hw == b.full_hw == oriented_size(HEIGHT, WIDTH, TURNS[i])
            np.testing.assert_array_equal(a.image, b.image)
            assert a.mask is not None and b.mask is not None
            np.testing.assert_array_equal(a.mask, b.mask)


@pytest.mark.parametrize("turn", range(1, 9))
def test_the_turn_is_the_one_pillow_shows(turn: int) -> None:
    """A natural photo: the decode with the tag applied is Pillow's exif_transpose of it."""
    data = with_orientation(encode(photo(turn, 700, 900)), turn)
    assert jpeg_orientation(data) == turn
    shown = np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB"))
    ours = decode_image(data, exif_orientation="apply", fast_dct=False)
    assert ours.shape == shown.shape == (*oriented_size(700, 900, turn), 3)
    assert np.abs(ours.astype(np.int32) - shown.astype(np.int32)).mean() < 0.5
    stored = decode_image(data)
    assert stored.shape == (700, 900, 3)
    np.testing.assert_array_equal(decode_image(data, exif_orientation="apply"),
                                  orient(stored, turn))


def test_a_tag_that_does_not_parse_is_no_turn() -> None:
    data = encode(photo(1, 64, 80))
    tagged = with_orientation(data, 6)
    assert jpeg_orientation(tagged) == 6
    for bad in (with_orientation(data, 9), with_orientation(data, 0),
                tagged[:30] + b"\x00" * 8 + tagged[38:],  # TIFF header damaged
                tagged[:6] + b"Exix" + tagged[10:]):  # not an Exif segment
        assert jpeg_orientation(bad) == 1
    assert jpeg_orientation(b"\xff\xd8\xff") == 1
    assert jpeg_orientation(b"") == 1


def test_the_option_is_checked() -> None:
    with pytest.raises(ValueError, match="exif_orientation must be 'ignore'.*got 'yes'"):
        DecodeImage(exif_orientation="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="exif_orientation must be"):
        presets.train(size=32, exif_orientation=True)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="exif_orientation must be"):
        decode_image(b"\xff\xd8", exif_orientation="auto")  # type: ignore[arg-type]
    assert "exif_orientation='apply'" in repr(DecodeImage(exif_orientation="apply"))


def test_a_mask_drawn_for_the_turned_photo_names_the_option(tmp_path: Path,
                                                            packed: dict[str, Dataset]) -> None:
    """Decoded with the tag ignored, a mask drawn on the turned photo does not fit: the error
    says which option fits it."""
    from shardfeed.errors import DecodeError

    with pytest.raises(DecodeError, match="exif_orientation='apply'"):
        _batches(packed["tagged+masks"], presets.eval(size=64))


def test_pack_refuses_a_mask_of_neither_size(tmp_path: Path) -> None:
    from shardfeed.tools.pack.check import check_item
    from shardfeed.tools.pack.items import PackItem

    image, mask = tmp_path / "a.jpg", tmp_path / "a.png"
    image.write_bytes(with_orientation(_jpeg(_cells(0), cmyk=False), 6))
    for size, fits in (((HEIGHT, WIDTH), True), ((WIDTH, HEIGHT), True), ((HEIGHT, 64), False)):
        mask.write_bytes(png(np.zeros(size, np.uint8)))
        problems = check_item(PackItem(str(image), "x", 0, mask_source=str(mask)),
                              decode=False, line=None)
        assert (problems == []) == fits, problems
    assert "896x704 as shown (its EXIF orientation is 6" in problems[0].problem


def _with_boxes(folder: Path, images: list[bytes]) -> Dataset:
    from shardfeed.format.writer import ShardWriter

    folder.mkdir(parents=True)
    with ShardWriter(str(folder / "part-0.tfrecord")) as writer:
        for data in images:  # the same normalised boxes, in the photo as shown
            writer.write_example({
                "image/encoded": data, "image/class/label": [0],
                "image/object/bbox/xmin": [0.1, 0.55], "image/object/bbox/ymin": [0.2, 0.05],
                "image/object/bbox/xmax": [0.45, 0.95], "image/object/bbox/ymax": [0.7, 0.4],
                "image/object/class/label": [1, 2]})
    return Dataset(str(folder))


def test_boxes_are_read_and_moved_in_the_turned_photo(tmp_path: Path) -> None:
    """ReadBoxes sizes normalised boxes by the header's size as shown, so boxes and pixels of
    a tagged photo are those of the turned copy, through the train preset's crop."""
    from shardfeed.transforms.base import Compose
    from shardfeed.transforms.detection import PadBoxes, ReadBoxes

    tagged = _with_boxes(tmp_path / "tagged", [
        with_orientation(_jpeg(_cells(i), cmyk=False), turn) for i, turn in enumerate(TURNS)])
    turned = _with_boxes(tmp_path / "turned", [
        _jpeg(orient(_cells(i), turn), cmyk=False) for i, turn in enumerate(TURNS)])

    def batches(ds: Dataset, reader: ReadBoxes) -> list[dict[str, np.ndarray]]:
        transform = Compose([reader, presets.train(size=96, exif_orientation="apply"),
                             PadBoxes(max_boxes=4)])
        with Loader(ds, batch_size=4, shuffle=True, seed=5, transform=transform) as loader:
            return [{k: np.array(b[k]) for k in ("image", "boxes")} for b in loader]

    want = batches(turned, ReadBoxes(exif_orientation="apply"))
    got = batches(tagged, ReadBoxes(exif_orientation="apply"))
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a["image"], b["image"])
        np.testing.assert_allclose(a["boxes"], b["boxes"], atol=1e-3)
    unsized = batches(tagged, ReadBoxes())  # sized as stored: 5-8 scaled by the wrong sides
    assert any(not np.allclose(a["boxes"], b["boxes"], atol=1e-3)
               for a, b in zip(unsized, want, strict=True))


@pytest.mark.parametrize("scale", [None, (2.0, 3.0)])
def test_patches_cut_the_turned_photo_when_asked(packed: dict[str, Dataset],
                                                 scale: tuple[float, float] | None) -> None:
    """``Patches(exif_orientation="apply")``: the patches of the photo turned and saved
    without a tag (its masks drawn on the turned photo), scaled patches included."""
    from shardfeed.pipeline import Patches

    def cut(ds: Dataset, setting: str) -> list[dict[str, np.ndarray]]:
        patches = Patches(ds, size=48, scale=scale, cache_images=2, refresh_every=3,
                          exif_orientation=setting)  # type: ignore[arg-type]
        return _batches(patches, None, batch_size=4)  # type: ignore[arg-type]

    _assert_same(cut(packed["tagged+masks"], "apply"), cut(packed["turned+masks"], "apply"))
    # under the default the same inputs differ: the tag is what changed the patches
    ignored = cut(packed["tagged"], "ignore")
    turned = cut(packed["turned"], "ignore")
    assert any(not np.array_equal(a["image"], b["image"]) for a, b in zip(ignored, turned))
    with pytest.raises(ValueError, match="exif_orientation"):
        Patches(packed["tagged"], size=48, cache_images=2, refresh_every=3,
                exif_orientation="rotate")  # type: ignore[arg-type]
