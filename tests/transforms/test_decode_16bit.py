"""16-bit images: kept as uint16 through decode, geometry, colour ops and the presets when
``image_dtype="uint16"``; cut to their high byte (``v >> 8``) by the default ``"uint8"``.

The 16-bit PNGs are written by OpenCV (BGR order) from uint16 arrays whose samples are above
255 and whose low byte differs from their high byte, so a decode that drops, rounds or
repeats a byte shows in the values.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import simplejpeg

import shardfeed
from shardfeed.errors import SchemaError
from shardfeed.format.writer import ShardWriter
from shardfeed.tools.index import index_files
from shardfeed.transforms import (
    CenterCrop,
    ColorJitter,
    Compose,
    CropOrPad,
    DecodeCenterCrop,
    DecodeImage,
    DecodeRandomResizedCrop,
    Normalize,
    RandomHorizontalFlip,
    RandomResizedCrop,
    Resize,
    ToFloat,
    presets,
)
from shardfeed.transforms.base import ArraySpec
from shardfeed.transforms.decode.fields import ImageField
from shardfeed.transforms.decode.image import decode_image
from shardfeed.transforms.decode.patches import decode_for_patches

# An RGB 16-bit picture: every sample > 255, low byte != high byte; 0x56FF checks that the
# 8-bit cut truncates (0x56) rather than rounds (0x57).
PIXELS = np.array(
    [[[0x1234, 0x56FF, 0xABCD], [0x0180, 0x7F01, 0xFF7F], [0x3C5A, 0x0A0B, 0xEE11]],
     [[0x4321, 0x9876, 0x0FF0], [0xFE01, 0x0302, 0x6A5B], [0x2B1A, 0xC0DE, 0x1357]]],
    dtype=np.uint16,
)


def png16(rgb: np.ndarray) -> bytes:
    """A 16-bit PNG of ``rgb`` (H×W×3 uint16, RGB order; OpenCV writes BGR)."""
    assert rgb.dtype == np.uint16
    return cv2.imencode(".png", np.ascontiguousarray(rgb[..., ::-1]))[1].tobytes()


def png16_gray(gray: np.ndarray) -> bytes:
    assert gray.dtype == np.uint16 and gray.ndim == 2
    return cv2.imencode(".png", gray)[1].tobytes()


def png8(rgb: np.ndarray) -> bytes:
    return cv2.imencode(".png", np.ascontiguousarray(rgb[..., ::-1]))[1].tobytes()


def flat16(height: int, width: int, colour: tuple[int, int, int]) -> np.ndarray:
    return np.broadcast_to(np.array(colour, np.uint16), (height, width, 3)).copy()


def colour16(i: int) -> tuple[int, int, int]:
    """A distinct 16-bit colour a record, each sample above 255 with low byte != high."""
    colour = (0x1234 + 0x0F0B * i, 0x56FF - 0x0111 * i, 0xABCD + 0x0203 * i)
    assert all(v > 255 and v >> 8 != v & 255 for v in colour)
    return colour


def decode(op: Any, data: bytes, seed: int = 0) -> np.ndarray:
    image: np.ndarray = op({"image/encoded": data}, np.random.default_rng(seed))["image"]
    return image


# --- decode -------------------------------------------------------------------------------


def test_uint16_keeps_every_sample_of_a_16bit_png() -> None:
    data = png16(PIXELS)
    image = decode(DecodeImage(image_dtype="uint16"), data)
    assert image.dtype == np.uint16 and image.shape == (2, 3, 3)
    np.testing.assert_array_equal(image, PIXELS)
    np.testing.assert_array_equal(decode_image(data, dtype="uint16"), PIXELS)


def test_uint16_keeps_a_16bit_grey_png_as_one_channel() -> None:
    grey = PIXELS[..., 0].copy()
    image = decode(DecodeImage(image_dtype="uint16", channels="gray"), png16_gray(grey))
    assert image.dtype == np.uint16 and image.shape == (2, 3, 1)
    np.testing.assert_array_equal(image[..., 0], grey)
    np.testing.assert_array_equal(decode_image(png16_gray(grey), mode="gray", dtype="uint16"),
                                  grey)
    rgb = decode(DecodeImage(image_dtype="uint16"), png16_gray(grey))
    np.testing.assert_array_equal(rgb, np.repeat(grey[..., None], 3, axis=-1))


def test_uint16_gray_of_a_16bit_colour_png_is_converted_in_16_bits() -> None:
    image = decode(DecodeImage(image_dtype="uint16", channels="gray"), png16(PIXELS))
    expected = cv2.cvtColor(PIXELS, cv2.COLOR_RGB2GRAY)
    assert image.dtype == np.uint16
    np.testing.assert_array_equal(image[..., 0], expected)


def test_uint16_widens_8bit_images_by_257() -> None:
    rgb8 = (PIXELS >> 8).astype(np.uint8)
    image = decode(DecodeImage(image_dtype="uint16"), png8(rgb8))
    assert image.dtype == np.uint16
    np.testing.assert_array_equal(image, rgb8.astype(np.uint16) * 257)
    assert decode(DecodeImage(image_dtype="uint16"),
                  png8(np.full((2, 2, 3), 255, np.uint8))).max() == 65535
    grey8 = cv2.imencode(".png", rgb8[..., 0])[1].tobytes()
    np.testing.assert_array_equal(
        decode(DecodeImage(image_dtype="uint16", channels="gray"), grey8)[..., 0],
        rgb8[..., 0].astype(np.uint16) * 257)
    jpeg = simplejpeg.encode_jpeg(np.ascontiguousarray(np.tile(rgb8, (8, 8, 1))), quality=90)
    as8 = decode(DecodeImage(), jpeg)
    as16 = decode(DecodeImage(image_dtype="uint16"), jpeg)
    assert as16.dtype == np.uint16
    np.testing.assert_array_equal(as16, as8.astype(np.uint16) * 257)


def test_uint8_default_cuts_a_16bit_png_to_its_high_byte() -> None:
    data = png16(PIXELS)
    high = (PIXELS >> 8).astype(np.uint8)
    image = decode(DecodeImage(), data)
    assert image.dtype == np.uint8
    np.testing.assert_array_equal(image, high)
    assert image[0, 0, 1] == 0x56  # 0x56FF: truncated, not rounded to 0x57
    np.testing.assert_array_equal(decode_image(data, mode="unchanged", dtype="uint8"), high)
    assert decode_image(data, mode="unchanged").dtype == np.uint16  # as before: stored depth


def test_uint8_default_rounds_a_16bit_tiff_as_opencv_does() -> None:
    tiff = cv2.imencode(".tiff", np.ascontiguousarray(PIXELS[..., ::-1]))[1].tobytes()
    image = decode(DecodeImage(), tiff)
    np.testing.assert_array_equal(image, np.rint(PIXELS / 257).astype(np.uint8))
    assert image[0, 1, 0] == 1  # 0x0180 / 257 = 1.49 (its high byte, too)
    assert image[0, 0, 1] == 0x57  # 0x56FF / 257 = 86.7: rounded, unlike a PNG's 0x56
    np.testing.assert_array_equal(decode(DecodeImage(image_dtype="uint16"), tiff), PIXELS)


def test_image_dtype_is_checked_at_construction() -> None:
    for make in (lambda: DecodeImage(image_dtype="float32"),  # type: ignore[arg-type]
                 lambda: DecodeRandomResizedCrop(8, image_dtype="int16"),  # type: ignore[arg-type]
                 lambda: presets.train(size=8, image_dtype="uint32"),  # type: ignore[arg-type]
                 lambda: decode_image(png16(PIXELS), dtype="float16")):  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=r"image_dtype must be one of \('uint8', 'uint16'\)"):
            make()
    assert DecodeImage(image_dtype="uint16").image_dtype == "uint16"
    assert DecodeImage().image_dtype == "uint8"


def test_output_spec_and_decode_bytes_follow_image_dtype() -> None:
    for op in (DecodeImage(image_dtype="uint16"), DecodeRandomResizedCrop(8, image_dtype="uint16"),
               DecodeCenterCrop(8, image_dtype="uint16")):
        assert op.output_spec({})["image"].dtype == np.uint16
        bound = op.bind(None, root=None)
        assert bound.image_dtype == "uint16"
        assert bound.output_spec({})["image"].dtype == np.uint16
    assert DecodeCenterCrop(8).output_spec({})["image"].dtype == np.uint8
    plain, wide = DecodeImage(max_pixels=1000), DecodeImage(max_pixels=1000, image_dtype="uint16")
    assert wide.decode_bytes == 2 * plain.decode_bytes


def test_max_pixels_is_still_checked_before_a_uint16_decode() -> None:
    big = png16(flat16(40, 50, colour16(0)))
    with pytest.raises(shardfeed.DecodeError, match="more than max_pixels=1,000"):
        decode(DecodeImage(image_dtype="uint16", max_pixels=1000), big)
    with pytest.raises(shardfeed.DecodeError, match="more than max_pixels=1,000"):
        decode(DecodeRandomResizedCrop(8, image_dtype="uint16", max_pixels=1000), big)


def test_raw_images_widen_or_are_refused_in_uint16() -> None:
    rgb8 = (PIXELS >> 8).astype(np.uint8)
    sample = {"image/raw": rgb8.tobytes(), "image/height": [2], "image/width": [3]}
    op = DecodeImage(image_dtype="uint16")
    np.testing.assert_array_equal(op(dict(sample), None)["image"], rgb8.astype(np.uint16) * 257)
    floats = DecodeImage(image_dtype="uint16", key="image/raw", encoding="raw")
    floats.image_field = ImageField(key="image/raw", encoding="raw", dtype="float32",
                                    image_dtype="uint16")
    raw = {"image/raw": PIXELS.astype(np.float32).tobytes(), "image/height": [2],
           "image/width": [3]}
    with pytest.raises(SchemaError, match="image_dtype='uint16' takes raw uint8 or uint16"):
        floats(raw, None)


def test_patches_decode_widens_a_reduced_jpeg() -> None:
    jpeg = simplejpeg.encode_jpeg(np.full((64, 64, 3), 200, np.uint8), quality=100)
    field = ImageField(image_dtype="uint16")
    decoded = decode_for_patches({"image/encoded": jpeg}, image_field=field, mask_field=None,
                                 denominator=2, max_pixels=1 << 20, require_mask=None)
    assert decoded.image.dtype == np.uint16 and decoded.image.shape == (32, 32, 3)
    assert set(np.unique(decoded.image).tolist()) == {200 * 257}


# --- batch forms of the decode ops -----------------------------------------------------------


def test_decode_image_batch_rows_in_uint16() -> None:
    rows = [png8(np.full((6, 5, 3), 17 * i, np.uint8)) for i in range(4)]
    rows.append(png16(flat16(6, 5, colour16(1))))
    op = DecodeImage(image_dtype="uint16")
    out = {"image": np.zeros((5, 6, 5, 3), np.uint16)}
    result = op.apply_batch({"image/encoded": list(rows)}, None, out)
    assert result is not None
    for i in range(4):
        assert set(np.unique(result["image"][i]).tolist()) == {17 * i * 257}
    np.testing.assert_array_equal(result["image"][4], flat16(6, 5, colour16(1)))
    # the default: 16-bit rows cut to their high byte, 8-bit ones as they are
    out8 = {"image": np.zeros((5, 6, 5, 3), np.uint8)}
    got8 = DecodeImage().apply_batch({"image/encoded": list(rows)}, None, out8)
    assert got8 is not None
    np.testing.assert_array_equal(got8["image"][4], flat16(6, 5, colour16(1)) >> 8)
    assert set(np.unique(got8["image"][3]).tolist()) == {51}


def test_crop_decode_batch_rows_in_uint16() -> None:
    op = DecodeCenterCrop(8, image_dtype="uint16")
    rows = [png16(flat16(20, 30, colour16(i))) for i in range(3)]
    rows.append(simplejpeg.encode_jpeg(np.full((96, 120, 3), 90, np.uint8), quality=100))
    out = {"image": np.zeros((4, 8, 8, 3), np.uint16)}
    result = op.apply_batch({"image/encoded": list(rows)}, None, out)
    assert result is not None and result["image"].dtype == np.uint16
    for i in range(3):
        np.testing.assert_array_equal(result["image"][i], flat16(8, 8, colour16(i)))
    assert set(np.unique(result["image"][3]).tolist()) == {90 * 257}
    # a uint8 batch is not this op's: the rows go sample by sample (which would refuse it)
    assert op.apply_batch({"image/encoded": list(rows)}, None,
                          {"image": np.zeros((4, 8, 8, 3), np.uint8)}) is None


def test_crop_decode_refuses_an_out_of_another_dtype() -> None:
    op = DecodeCenterCrop(8, image_dtype="uint16")
    with pytest.raises(ValueError, match="out is uint8 but the op makes uint16 images"):
        op({"image/encoded": png16(flat16(20, 30, colour16(0)))}, None,
           out=np.zeros((8, 8, 3), np.uint8))


# --- geometry and the fused crop ---------------------------------------------------------


def test_geometry_keeps_uint16_values() -> None:
    colour = colour16(2)
    flat = flat16(30, 40, colour)
    rng = np.random.default_rng(0)
    for op in (Resize(12), Resize((7, 9)), RandomResizedCrop(10), CenterCrop(16)):
        image = op({"image": flat.copy()}, rng)["image"]
        assert image.dtype == np.uint16
        np.testing.assert_array_equal(image, flat16(*image.shape[:2], colour))
    picture = np.arange(30 * 40 * 3, dtype=np.uint16).reshape(30, 40, 3) * 17 + 300
    flipped = RandomHorizontalFlip(p=1.0)({"image": picture.copy()}, rng)["image"]
    np.testing.assert_array_equal(flipped, picture[:, ::-1])
    padded = CropOrPad(34, 20, fill=0xBEEF)({"image": picture.copy()}, rng)["image"]
    assert padded.dtype == np.uint16
    np.testing.assert_array_equal(padded[2:32], picture[:, 10:30])
    assert set(np.unique(padded[:2]).tolist()) == {0xBEEF}
    slot = np.zeros((1, 12, 12, 3), np.uint16)
    Resize((12, 12))({"image": flat.copy()}, rng, out=slot[0])
    np.testing.assert_array_equal(slot[0], flat16(12, 12, colour))


@pytest.mark.parametrize("size", [(24, 24), (200, 180)])  # shrunk (area) and enlarged (linear)
def test_fused_crop_on_a_16bit_png_is_decode_then_crop(size: tuple[int, int]) -> None:
    yy, xx = np.mgrid[0:120, 0:150]
    picture = np.stack([300 + 400 * yy, 0x1357 + 97 * xx, 0xF0F0 - 61 * (xx + yy)], axis=-1)
    data = png16(picture.astype(np.uint16))
    fused = DecodeRandomResizedCrop(size, image_dtype="uint16")
    steps = Compose([DecodeImage(image_dtype="uint16"), RandomResizedCrop(size)])
    for seed in range(5):
        got = decode(fused, data, seed)
        assert got.dtype == np.uint16
        np.testing.assert_array_equal(got, decode(steps, data, seed))
        assert (got & 255).any() and (got % 257).any()  # 16 bits of detail, not 8 widened


@pytest.mark.parametrize("size", [8, 24, 60])  # 1/8 scale, a warp from 1/2 or 1/4, full
def test_fused_crop_widens_a_jpeg_at_every_scale(size: int) -> None:
    jpeg = simplejpeg.encode_jpeg(np.full((320, 256, 3), 200, np.uint8), quality=100)
    for op in (DecodeRandomResizedCrop(size, image_dtype="uint16", hflip=0.5),
               DecodeCenterCrop(size, image_dtype="uint16"),
               DecodeCenterCrop(size, image_dtype="uint16", channels="gray")):
        for seed in range(4):
            image = decode(op, jpeg, seed)
            assert image.dtype == np.uint16
            assert image.shape == (size, size, op._channel_count())
            assert set(np.unique(image).tolist()) == {200 * 257}


def test_fused_crop_keeps_a_flat_16bit_colour_exactly() -> None:
    colour = colour16(3)
    data = png16(flat16(70, 90, colour))
    for op in (DecodeRandomResizedCrop(16, image_dtype="uint16", hflip=0.5),
               DecodeCenterCrop(16, image_dtype="uint16")):
        for seed in range(4):
            np.testing.assert_array_equal(decode(op, data, seed), flat16(16, 16, colour))


# --- colour and value ops ----------------------------------------------------------------


def test_to_float_default_scale_follows_the_image_type() -> None:
    wide = {"image": np.array([[[0, 0x8000, 65535]]], np.uint16)}
    got = ToFloat()(dict(wide), None)["image"]
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, [[[0.0, 0x8000 / 65535, 1.0]]], rtol=1e-6)
    assert got.max() == 1.0  # not 257, as a fixed 1/255 would give
    narrow = ToFloat()({"image": np.array([[[0, 51, 255]]], np.uint8)}, None)["image"]
    np.testing.assert_allclose(narrow, [[[0.0, 0.2, 1.0]]], rtol=1e-6)
    assert ToFloat(scale=1 / 255)(dict(wide), None)["image"].max() == pytest.approx(257.0)
    with pytest.raises(TypeError, match="int16"):
        ToFloat()({"image": np.zeros((1, 1, 3), np.int16)}, None)


def test_normalize_reads_uint16_on_its_own_scale() -> None:
    rgb8 = np.array([[[0, 128, 255], [10, 200, 37]]], np.uint8)
    rgb16 = rgb8.astype(np.uint16) * 257
    for op in (Normalize(), Normalize.symmetric()):
        np.testing.assert_allclose(op({"image": rgb16}, None)["image"],
                                   op({"image": rgb8}, None)["image"], rtol=1e-5, atol=1e-6)
    ends = Normalize.symmetric()({"image": np.array([[[0, 65535, 0]]], np.uint16)}, None)
    np.testing.assert_array_equal(ends["image"], [[[-1.0, 1.0, -1.0]]])


def test_color_jitter_refuses_uint16_clearly() -> None:
    with pytest.raises(TypeError, match="image_dtype='uint16'"):
        ColorJitter(0.4)({"image": flat16(4, 4, colour16(0))}, np.random.default_rng(0))
    with pytest.raises(TypeError, match="got uint16"):
        ColorJitter(0.4).output_spec({"image": ArraySpec((4, 4, 3), np.dtype(np.uint16))})


# --- presets -----------------------------------------------------------------------------


def test_preset_options_that_contradict_uint16_are_refused() -> None:
    with pytest.raises(ValueError, match="colour jitter works on uint8 images"):
        presets.train(size=8, color=1.0, image_dtype="uint16")
    with pytest.raises(ValueError, match="dtype='uint8' contradicts image_dtype='uint16'"):
        presets.eval(size=8, dtype="uint8", image_dtype="uint16")
    with pytest.raises(ValueError, match="dtype='uint16' contradicts image_dtype='uint8'"):
        presets.train(size=8, dtype="uint16")
    with pytest.raises(ValueError, match="decoding on the device gives uint8 images"):
        presets.train(size=8, decode_on="cuda", image_dtype="uint16")
    with pytest.raises(ValueError, match="normalize='symmetric' produces floats"):
        presets.eval(size=8, normalize="symmetric", image_dtype="uint16")
    spec = presets.eval(size=8, image_dtype="uint16").output_spec()["image"]
    assert spec == ArraySpec((8, 8, 3), np.dtype(np.uint16))
    spec = presets.train(size=8, dtype="uint16", image_dtype="uint16").output_spec()["image"]
    assert spec.dtype == np.uint16
    assert presets.train(size=8).output_spec()["image"].dtype == np.uint8


def _dataset(folder: Path, images: list[bytes]) -> Any:
    folder.mkdir(parents=True)
    with ShardWriter(str(folder / "part-0.tfrecord")) as writer:
        for i, data in enumerate(images):
            writer.write_example({"image/encoded": data, "index": [i]})
    index_files(str(folder))
    return shardfeed.Dataset(str(folder))


@pytest.fixture(scope="module")
def png16_data(tmp_path_factory: pytest.TempPathFactory) -> Any:
    sizes = [(40, 56), (33, 47), (64, 30), (20, 20), (48, 48), (37, 61)]
    images = [png16(flat16(*sizes[i % len(sizes)], colour16(i))) for i in range(12)]
    return _dataset(tmp_path_factory.mktemp("png16") / "d", images)


@pytest.fixture(scope="module")
def jpeg_data(tmp_path_factory: pytest.TempPathFactory) -> Any:
    images = [simplejpeg.encode_jpeg(np.full((160 + 8 * i, 200 - 8 * i, 3), 20 * i, np.uint8),
                                     quality=100) for i in range(12)]
    return _dataset(tmp_path_factory.mktemp("jpeg") / "d", images)


def _batches(ds: Any, transform: Any, *, train: bool = True) -> list[dict[str, np.ndarray]]:
    make = shardfeed.Loader.for_train if train else shardfeed.Loader.for_eval
    with make(ds, batch_size=4, transform=transform, seed=3, num_threads=2) as loader:
        return [{k: np.array(v) for k, v in batch.items() if k in ("image", "index")}
                for batch in loader]


def _expected16(batch: dict[str, np.ndarray], size: int) -> np.ndarray:
    return np.stack([flat16(size, size, colour16(int(i))) for i in batch["index"].reshape(-1)])


def test_presets_give_exact_uint16_batches_in_a_loader(png16_data: Any) -> None:
    for pipeline, train in ((presets.train(size=16, image_dtype="uint16"), True),
                            (presets.eval(size=16, image_dtype="uint16"), False)):
        batches = _batches(png16_data, pipeline, train=train)
        assert sum(len(b["image"]) for b in batches) >= 8
        for batch in batches:
            assert batch["image"].dtype == np.uint16
            np.testing.assert_array_equal(batch["image"], _expected16(batch, 16))


def test_presets_default_cuts_16bit_images_in_a_loader(png16_data: Any) -> None:
    for batch in _batches(png16_data, presets.eval(size=16), train=False):
        assert batch["image"].dtype == np.uint8
        np.testing.assert_array_equal(batch["image"], _expected16(batch, 16) >> 8)


def test_presets_float_output_of_uint16_is_scaled_by_65535(png16_data: Any) -> None:
    for batch in _batches(png16_data, presets.eval(size=16, dtype="float32", layout="CHW",
                                                   image_dtype="uint16"), train=False):
        image = batch["image"]
        assert image.dtype == np.float32 and image.shape[1:] == (3, 16, 16)
        expected = np.moveaxis(_expected16(batch, 16), -1, 1) / 65535
        np.testing.assert_allclose(image, expected, rtol=1e-6)
        assert 0.0 <= image.min() and image.max() <= 1.0
    for batch in _batches(png16_data, presets.train(size=16, normalize="symmetric",
                                                    dtype="float32", image_dtype="uint16")):
        expected = _expected16(batch, 16) / 65535 * 2 - 1
        np.testing.assert_allclose(batch["image"], expected, rtol=1e-5, atol=1e-6)


def test_train_preset_widens_jpegs_in_a_loader(jpeg_data: Any) -> None:
    for size in (16, 60):  # reduced DCT scales and a warp; the full-scale rows loop
        wide = _batches(jpeg_data, presets.train(size=size, image_dtype="uint16"))
        narrow = _batches(jpeg_data, presets.train(size=size))
        assert len(wide) == len(narrow) > 0
        for a, b in zip(wide, narrow):
            assert a["image"].dtype == np.uint16
            np.testing.assert_array_equal(a["index"], b["index"])
            np.testing.assert_array_equal(a["image"], b["image"].astype(np.uint16) * 257)


def test_memory_budget_counts_2_bytes_a_sample(jpeg_data: Any) -> None:
    budgets = []
    for image_dtype in ("uint8", "uint16"):
        pipeline = presets.eval(size=16, max_pixels=1 << 20, image_dtype=image_dtype)
        with shardfeed.Loader.for_eval(jpeg_data, batch_size=4, transform=pipeline) as loader:
            budgets.append(loader.memory_budget().decode_bytes_per_thread)
    assert budgets[1] == 2 * budgets[0] > 0
