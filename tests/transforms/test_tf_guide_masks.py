"""TensorFlow's "TFRecord and tf.train.Example" guide layout decodes, image with mask: features
``height``, ``width``, ``depth`` (int64), ``image_raw`` (the guide's encoded JPEG, or raw
pixel bytes) and ``mask_raw`` (raw uint8 class ids, height × width).

The user's road: records written in that layout, a Dataset over them, a Loader with the decode
options that name the features. The raw mask takes its height and width from the image's
``height_key``/``width_key`` (the same record's features) or from ``mask_height_key`` /
``mask_width_key``; the eval decode gives the source pixels, the train preset moves image and
mask together; a missing shape feature is an error naming the feature looked for, the
record, and an option the user has not passed already.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import simplejpeg
from transforms_helpers import jpeg_bytes, smooth_image

from shardfeed import Dataset, Loader
from shardfeed.errors import DecodeError, SchemaError
from shardfeed.format.writer import ShardWriter
from shardfeed.transforms import DecodeImage, presets

HEIGHT, WIDTH, RECORDS = 24, 32, 6
STEP = 32  # the image's red value of mask class k is k * STEP


def _mask(i: int) -> np.ndarray:
    """Class ids 0..7 in blocks, in another order in each record (a flip or a shift out of
    line shows)."""
    yy, xx = np.mgrid[0:HEIGHT, 0:WIDTH]
    return ((xx * 4 // WIDTH + i) % 4 + 4 * (yy * 2 // HEIGHT)).astype(np.uint8)


def _image(i: int) -> np.ndarray:
    """An RGB image whose red channel is its mask's class × STEP (constant over each block)."""
    image = smooth_image(HEIGHT, WIDTH, seed=i)
    image[..., 0] = _mask(i) * STEP
    return image


def _write_guide(folder: Path, *, image: str) -> list[dict[str, Any]]:
    """The guide's records: ``image`` is "raw" (pixel bytes) or "jpeg" (the guide's own)."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    with ShardWriter(str(folder / "guide-00000.tfrecord")) as writer:
        for i in range(RECORDS):
            pixels = _image(i)
            stored = pixels.tobytes() if image == "raw" else jpeg_bytes(pixels, quality=95)
            writer.write_example({
                "height": [HEIGHT], "width": [WIDTH], "depth": [3],
                "image_raw": stored, "mask_raw": _mask(i).tobytes(),
            })
            written.append({"image": pixels, "stored": stored, "mask": _mask(i)})
    return written


def _batches(loader: Loader) -> dict[str, np.ndarray]:
    parts = list(loader)
    return {name: np.concatenate([b[name] for b in parts]) for name in ("image", "mask")}


# image_raw of raw pixels: its shape features named; the mask takes the image's
GUIDE_RAW: dict[str, Any] = {
    "key": "image_raw", "encoding": "raw", "height_key": "height", "width_key": "width",
    "channels_key": "depth", "mask_key": "mask_raw", "mask_encoding": "raw",
}
# image_raw of JPEG bytes (the guide's): the mask's shape features named
GUIDE_JPEG: dict[str, Any] = {
    "key": "image_raw", "mask_key": "mask_raw", "mask_encoding": "raw",
    "mask_height_key": "height", "mask_width_key": "width",
}


def test_raw_image_and_raw_mask_decode_to_the_source_pixels(tmp_path: Path) -> None:
    written = _write_guide(tmp_path / "guide", image="raw")
    ds = Dataset(str(tmp_path / "guide"))
    # The mask names no shape features of its own: it takes the image's height_key/width_key.
    got = _batches(Loader(ds, batch_size=4, shuffle=False, transform=DecodeImage(**GUIDE_RAW)))
    np.testing.assert_array_equal(got["image"], np.stack([w["image"] for w in written]))
    np.testing.assert_array_equal(got["mask"], np.stack([w["mask"] for w in written]))


def test_guide_jpeg_image_with_raw_mask_names_the_mask_shape_features(tmp_path: Path) -> None:
    written = _write_guide(tmp_path / "guide", image="jpeg")
    ds = Dataset(str(tmp_path / "guide"))
    decode = DecodeImage(**GUIDE_JPEG)
    got = _batches(Loader(ds, batch_size=4, shuffle=False, transform=decode))
    decoded = np.stack([simplejpeg.decode_jpeg(w["stored"], fastdct=True) for w in written])
    np.testing.assert_array_equal(got["image"], decoded)  # the JPEG's own pixels
    np.testing.assert_array_equal(got["mask"], np.stack([w["mask"] for w in written]))
    # the image's height_key/width_key serve the mask too (a JPEG needs none itself)
    same = DecodeImage(key="image_raw", height_key="height", width_key="width",
                       mask_key="mask_raw", mask_encoding="raw")
    again = _batches(Loader(ds, batch_size=4, shuffle=False, transform=same))
    np.testing.assert_array_equal(again["mask"], got["mask"])


def test_eval_preset_gives_the_source_pixels(tmp_path: Path) -> None:
    square = tmp_path / "square"
    square.mkdir()
    rng = np.random.default_rng(3)
    images = rng.integers(0, 256, (RECORDS, 16, 16, 3), dtype=np.uint8)
    masks = rng.integers(0, 21, (RECORDS, 16, 16), dtype=np.uint8)
    with ShardWriter(str(square / "guide-00000.tfrecord")) as writer:
        for image, mask in zip(images, masks):
            writer.write_example({"height": [16], "width": [16], "depth": [3],
                                  "image_raw": image.tobytes(), "mask_raw": mask.tobytes()})
    evaluate = presets.eval(16, crop_fraction=1.0, **GUIDE_RAW)
    got = _batches(Loader(Dataset(str(square)), batch_size=4, shuffle=False,
                          transform=evaluate))
    np.testing.assert_array_equal(got["image"], images)
    np.testing.assert_array_equal(got["mask"], masks)


@pytest.mark.parametrize("image", ["raw", "jpeg"])
def test_train_preset_moves_image_and_mask_together(tmp_path: Path, image: str) -> None:
    _write_guide(tmp_path / "guide", image=image)
    ds = Dataset(str(tmp_path / "guide"))
    options = GUIDE_RAW if image == "raw" else GUIDE_JPEG
    train = presets.train(16, scale=(0.3, 1.0), **options)
    checked = 0
    for epoch in range(3):
        loader = Loader(ds, batch_size=3, seed=epoch, transform=train)
        for batch in loader:
            red, mask = batch["image"][..., 0].astype(int), batch["mask"].astype(int)
            assert batch["image"].shape[1:] == (16, 16, 3) and mask.shape[1:] == (16, 16)
            # where the mask is one class around a pixel (inside a block: the image's
            # interpolation reached no other block there), the red value is that class's
            inner = np.ones_like(mask, bool)
            for dy in (-1, 0, 1):
                for dx in (-1, 0, 1):
                    inner &= np.roll(mask, (dy, dx), axis=(1, 2)) == mask
            inner[:, [0, -1], :] = False
            inner[:, :, [0, -1]] = False
            tolerance = 0 if image == "raw" else STEP // 2  # JPEG moves red a few levels
            assert (np.abs(mask * STEP - red)[inner] <= tolerance).all()
            checked += int(inner.sum())
    assert checked > 500


def test_missing_mask_shape_names_the_feature_the_record_and_the_right_option(
        tmp_path: Path) -> None:
    _write_guide(tmp_path / "guide", image="jpeg")
    ds = Dataset(str(tmp_path / "guide"))
    decode = DecodeImage(key="image_raw", mask_key="mask_raw", mask_encoding="raw")
    with pytest.raises(SchemaError) as caught:
        next(iter(Loader(ds, batch_size=2, shuffle=False, transform=decode)))
    message = str(caught.value)
    assert "'mask_raw'" in message and "'mask/height'" in message
    assert "mask_height_key=" in message and "Pass height_key" not in message
    assert "'height'" in message  # the record's features are listed: the user sees the name
    notes = " ".join(getattr(caught.value, "__notes__", []))
    assert "guide-00000.tfrecord" in notes and "record 0" in notes

    # a height_key the user passed, absent from the record: the message never asks for it
    wrong = DecodeImage(key="image_raw", encoding="raw", height_key="Height", width_key="width",
                        mask_key="mask_raw", mask_encoding="raw")
    with pytest.raises(SchemaError) as caught:
        next(iter(Loader(ds, batch_size=2, shuffle=False, transform=wrong)))
    message = str(caught.value)
    assert "'Height'" in message and "named by height_key" in message
    assert "Pass height_key" not in message and "pass height_key" not in message


def test_a_standard_raw_mask_beside_a_turned_image_is_refused(tmp_path: Path) -> None:
    """The same with the standard names (image/encoded, mask/raw: no option says raw) and an
    image encoding given explicitly."""
    from exif_photos import with_orientation

    from shardfeed.errors import DecodeError

    folder = tmp_path / "standard"
    folder.mkdir()
    with ShardWriter(str(folder / "s-00000.tfrecord")) as writer:
        for i in range(2):
            writer.write_example({
                "image/encoded": with_orientation(jpeg_bytes(_image(i)), 3),
                "mask/raw": _mask(i).tobytes(), "mask/height": [HEIGHT],
                "mask/width": [WIDTH]})
    for options in ({}, {"encoding": "jpeg"}, {"mask": True}):
        with pytest.raises(DecodeError, match="raw mask has no tag"):
            next(iter(Loader(Dataset(str(folder)), batch_size=2, shuffle=False,
                             transform=DecodeImage(exif_orientation="apply", **options))))


@pytest.mark.parametrize("preset", ["train", "eval"])
def test_a_raw_mask_beside_a_turned_image_is_refused_not_misaligned(tmp_path: Path,
                                                                    preset: str) -> None:
    """A raw mask has no orientation tag: with exif_orientation="apply" and an image tagged
    to be turned (a half turn keeps the size), the record is named, not handed back with
    the image turned and the mask not; upright records and exif_orientation="ignore" go on."""
    from exif_photos import with_orientation

    folder = tmp_path / "tagged"
    folder.mkdir()
    with ShardWriter(str(folder / "guide-00000.tfrecord")) as writer:
        for i in range(RECORDS):
            jpeg = jpeg_bytes(_image(i), quality=95)
            writer.write_example({
                "height": [HEIGHT], "width": [WIDTH], "depth": [3],
                "image_raw": with_orientation(jpeg, 3) if i == 4 else jpeg,
                "mask_raw": _mask(i).tobytes()})
    ds = Dataset(str(folder))
    make = presets.train if preset == "train" else presets.eval

    def run(**options: Any) -> Any:
        return _batches(Loader(ds, batch_size=2, shuffle=False,
                               transform=make(16, **GUIDE_JPEG, **options)))

    with pytest.raises(Exception, match=r"record 4 .*|raw mask has no tag") as caught:
        run(exif_orientation="apply")
    text = str(caught.value) + " ".join(getattr(caught.value, "__notes__", []))
    assert "record 4" in text and "exif_orientation='ignore'" in text
    skipping = Loader(ds, batch_size=2, shuffle=False, on_error="skip",
                      transform=make(16, **GUIDE_JPEG, exif_orientation="apply"))
    assert len(_batches(skipping)["mask"]) == RECORDS  # record 4 skipped, replaced
    assert skipping.stats().skipped_total == 1
    assert len(run(exif_orientation="ignore")["mask"]) == RECORDS


def test_a_png_mask_read_as_raw_says_to_decode_it_as_png(tmp_path: Path) -> None:
    import cv2

    folder = tmp_path / "pngmask"
    folder.mkdir()
    with ShardWriter(str(folder / "guide-00000.tfrecord")) as writer:
        for i in range(2):
            writer.write_example({
                "height": [HEIGHT], "width": [WIDTH], "image_raw": jpeg_bytes(_image(i)),
                "mask_raw": cv2.imencode(".png", _mask(i))[1].tobytes()})
    with pytest.raises(DecodeError) as caught:
        next(iter(Loader(Dataset(str(folder)), batch_size=2, shuffle=False,
                         transform=presets.eval(16, **GUIDE_JPEG))))
    assert "uint8 values" in str(caught.value)
    assert "PNG file: decode this feature as an image file" in str(caught.value)
    png = presets.eval(16, key="image_raw", mask_key="mask_raw")  # as the hint says
    batch = next(iter(Loader(Dataset(str(folder)), batch_size=2, shuffle=False, transform=png)))
    assert batch["mask"].shape == (2, 16, 16)
