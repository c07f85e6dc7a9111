"""What TensorFlow users meet first, walked as they meet it: the presets name the image with
``key=`` (and the mask with ``mask_key=``), as their error message says; a feature of file
paths decoded as images says it holds paths and what to pass; raw images whose records
store no shape (MNIST-like bytes) decode with a fixed ``shape=``, checked against each
record's byte count.
"""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

from shardfeed import Dataset, Loader
from shardfeed.errors import DecodeError, SchemaError
from shardfeed.format.writer import ShardWriter
from shardfeed.transforms import DecodeImage, presets


def _png(image: np.ndarray) -> bytes:
    ok, data = cv2.imencode(".png", np.ascontiguousarray(image[..., ::-1]))
    assert ok
    return data.tobytes()


def _all(loader: Loader, name: str = "image") -> np.ndarray:
    return np.concatenate([batch[name] for batch in loader])


# --- presets take key= and mask_key= -------------------------------------------------------


def test_presets_take_the_image_and_mask_keys(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (6, 16, 16, 3), dtype=np.uint8)
    masks = rng.integers(0, 5, (6, 16, 16), dtype=np.uint8)
    with ShardWriter(str(tmp_path / "part-0.tfrecord")) as writer:
        for image, mask in zip(images, masks):
            writer.write_example({"png_bytes": _png(image), "labels_png": _png(mask[..., None]
                                                                               .repeat(3, -1)),
                                  "label": [1]})
    ds = Dataset(str(tmp_path))
    with pytest.raises(SchemaError, match="key="):  # what the user tries first: no key
        next(iter(Loader(ds, batch_size=2, shuffle=False, transform=presets.eval(16))))
    evaluate = presets.eval(16, crop_fraction=1.0, key="png_bytes", mask_key="labels_png")
    loader = Loader(ds, batch_size=4, shuffle=False, transform=evaluate)
    got = list(loader)
    np.testing.assert_array_equal(np.concatenate([b["image"] for b in got]), images)
    np.testing.assert_array_equal(np.concatenate([b["mask"] for b in got]), masks)
    train = presets.train(8, key="png_bytes", mask=False)
    batch = next(iter(Loader(ds, batch_size=3, seed=1, transform=train)))
    assert batch["image"].shape == (3, 8, 8, 3) and "mask" not in batch


# --- a feature of file paths -----------------------------------------------------------------


def _paths_dataset(tmp_path: Path) -> tuple[Dataset, np.ndarray]:
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, (4, 12, 12, 3), dtype=np.uint8)
    (tmp_path / "photos").mkdir()
    with ShardWriter(str(tmp_path / "part-0.tfrecord")) as writer:
        for i, image in enumerate(images):
            (tmp_path / "photos" / f"{i:03d}.png").write_bytes(_png(image))
            writer.write_example({"image/encoded": f"photos/{i:03d}.png".encode(),
                                  "image/format": b"png", "label": [i]})
    return Dataset(str(tmp_path), root=str(tmp_path)), images


@pytest.mark.parametrize("make", ["DecodeImage", "eval", "train"])
def test_a_path_feature_says_it_holds_paths(tmp_path: Path, make: str) -> None:
    ds, images = _paths_dataset(tmp_path)
    transform = {"DecodeImage": DecodeImage, "eval": lambda **o: presets.eval(8, **o),
                 "train": lambda **o: presets.train(8, **o)}[make]
    with pytest.raises(SchemaError) as caught:
        next(iter(Loader(ds, batch_size=2, shuffle=False, transform=transform())))
    message = str(caught.value)
    assert "holds a file path ('photos/000.png')" in message
    assert 'encoding="path"' in message and "root=" in message
    assert "damaged" not in message and "JPEG" not in message
    assert "part-0.tfrecord" in " ".join(getattr(caught.value, "__notes__", []))
    # what it says to do works
    loader = Loader(ds, batch_size=2, shuffle=False, transform=transform(encoding="path"))
    got = _all(loader)
    if make == "DecodeImage":
        np.testing.assert_array_equal(got, images)
    else:
        assert got.shape == (4, 8, 8, 3)


def test_what_reads_as_a_path(tmp_path: Path) -> None:
    from shardfeed.transforms.decode.fields import stored_path

    for text in ("cat.jpg", "photos/000.png", "s3://bucket/a b/x.JPEG", "C:\\data\\img.tif"):
        assert stored_path(text.encode()) == text
    for data in (b"", b"N/A", b"1.5", b"P1 2 2 0 1 1 0", b"line\n/x.jpg", b"\xff\xd8\xff/x.jpg",
                 b"\x89PNG\r\n\x1a\n.png", b"caf\xe9/x.jpg", b" x.jpg", b"a" * 5000 + b".jpg"):
        assert stored_path(data) is None, data
    # a referenced file whose content is text is the file's damage, not a stored path
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "0.jpg").write_bytes(b"elsewhere/0.jpg")
    with ShardWriter(str(tmp_path / "part-0.tfrecord")) as writer:
        writer.write_example({"image/path": b"photos/0.jpg"})
    ds = Dataset(str(tmp_path), root=str(tmp_path))
    with pytest.raises(DecodeError) as caught:
        next(iter(Loader(ds, batch_size=1, transform=DecodeImage())))
    assert "file path" not in str(caught.value) and "elsewhere" not in str(caught.value)


# --- raw images without shape features: a fixed shape ------------------------------------------


def _mnist_like(folder: Path, count: int = 40) -> np.ndarray:
    """Digits as raw 28×28 uint8 bytes beside a label, and no shape feature at all."""
    digits = np.random.default_rng(2).integers(0, 256, (count, 28, 28, 1), dtype=np.uint8)
    folder.mkdir(parents=True, exist_ok=True)
    with ShardWriter(str(folder / "mnist-0.tfrecord")) as writer:
        for i, digit in enumerate(digits):
            writer.write_example({"image_raw": digit.tobytes(), "label": [i % 10]})
    return digits


@pytest.mark.parametrize("shape", [(28, 28, 1), (28, 28)])
@pytest.mark.parametrize("num_threads", [1, 2])
def test_fixed_shape_decodes_raw_bytes_without_shape_features(tmp_path: Path,
                                                              shape: tuple[int, ...],
                                                              num_threads: int) -> None:
    digits = _mnist_like(tmp_path / "mnist")
    ds = Dataset(str(tmp_path / "mnist"))
    gray = DecodeImage(key="image_raw", shape=shape, channels="gray")
    loader = Loader(ds, batch_size=8, shuffle=False, transform=gray, num_threads=num_threads)
    np.testing.assert_array_equal(_all(loader), digits)  # every batch, every path it took
    rgb = DecodeImage(key="image_raw", shape=shape)
    loader = Loader(ds, batch_size=8, shuffle=False, transform=rgb, num_threads=num_threads)
    np.testing.assert_array_equal(_all(loader), digits.repeat(3, axis=-1))
    evaluate = presets.eval(28, crop_fraction=1.0, key="image_raw", shape=shape)
    loader = Loader(ds, batch_size=8, shuffle=False, transform=evaluate)
    np.testing.assert_array_equal(_all(loader), digits.repeat(3, axis=-1))


def test_fixed_shape_is_checked_against_each_record(tmp_path: Path) -> None:
    _mnist_like(tmp_path / "mnist", count=4)
    ds = Dataset(str(tmp_path / "mnist"))
    # without a shape: the error names the option, not only shape features
    with pytest.raises(SchemaError, match=r"shape=\(height, width, channels\)"):
        next(iter(Loader(ds, batch_size=2, transform=DecodeImage(key="image_raw",
                                                                 encoding="raw"))))
    wrong = DecodeImage(key="image_raw", shape=(32, 32, 1))
    with pytest.raises(DecodeError) as caught:
        next(iter(Loader(ds, batch_size=2, shuffle=False, transform=wrong)))
    message = str(caught.value)
    assert "784 uint8 values" in message and "32×32×1 = 1024" in message
    assert "shape=(32, 32, 1)" in message and "mnist-0.tfrecord" in message
    with pytest.raises(ValueError, match="shape"):
        DecodeImage(key="image_raw", shape=(28,))
    with pytest.raises(ValueError, match="height_key"):
        DecodeImage(key="image_raw", shape=(28, 28, 1), height_key="height")
    with pytest.raises(ValueError, match="encoding"):
        DecodeImage(key="image_raw", shape=(28, 28, 1), encoding="jpeg")
