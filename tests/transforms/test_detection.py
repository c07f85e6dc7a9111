"""Detection records as a user has them (TF Object Detection ``bbox`` lists, normalised):
boxes read into pixels, moved with the pixels by the train preset, padded into batches with a
count, and handed to torch and JAX as arrays."""

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
from shardfeed.transforms import Compose, DecodeImage, PadBoxes, RandomHorizontalFlip, ReadBoxes
from shardfeed.transforms.detection import unpad

H, W = 96, 128
COLOURS = [(250, 20, 20), (20, 250, 20), (20, 20, 250)]


def scene(i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A grey image holding 1-3 flat rectangles of pure colours; their pixel boxes, classes."""
    rng = np.random.default_rng(i)
    image = np.full((H, W, 3), 128, dtype=np.uint8)
    boxes, labels = [], []
    for k in range(1 + i % 3):
        w, h = rng.integers(16, 40), rng.integers(16, 40)
        x, y = rng.integers(0, W - w), rng.integers(0, H - h)
        image[y:y + h, x:x + w] = COLOURS[k]
        boxes.append([x, y, x + w, y + h])
        labels.append(k)
    return image, np.array(boxes, dtype=np.float64), np.array(labels)


def write_detection(folder: Path, n: int) -> Path:
    folder.mkdir()
    with ShardWriter(str(folder / "od-00000.tfrecord")) as writer:
        for i in range(n):
            image, boxes, labels = scene(i)
            writer.write_example({
                "image/encoded": simplejpeg.encode_jpeg(image, quality=98),
                "image/height": [H], "image/width": [W],
                "image/object/bbox/xmin": (boxes[:, 0] / W).astype(np.float32),
                "image/object/bbox/ymin": (boxes[:, 1] / H).astype(np.float32),
                "image/object/bbox/xmax": (boxes[:, 2] / W).astype(np.float32),
                "image/object/bbox/ymax": (boxes[:, 3] / H).astype(np.float32),
                "image/object/class/label": labels.astype(np.int64),
                "index": [i],
            })
    index_files(str(folder))
    return folder


@pytest.fixture(scope="module")
def detection(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_detection(tmp_path_factory.mktemp("od") / "data", 24)


def batches(loader: Any) -> list[dict[str, Any]]:
    return [{k: np.asarray(v) for k, v in b.items()} for b in loader]


def test_boxes_read_to_pixels_and_padded_with_a_count(detection: Path) -> None:
    transform = Compose([ReadBoxes(), DecodeImage(), RandomHorizontalFlip(p=1.0), PadBoxes(4)])
    loader = shardfeed.Loader(shardfeed.Dataset(str(detection)), batch_size=8, shuffle=False,
                              transform=transform)
    got = batches(loader)
    assert got[0]["boxes"].shape == (8, 4, 4) and got[0]["boxes"].dtype == np.float32
    assert got[0]["box_labels"].shape == (8, 4) and got[0]["num_boxes"].dtype == np.int64
    for batch in got:
        for row, i in enumerate(batch["index"].tolist()):
            _, boxes, labels = scene(i)
            n = len(boxes)
            assert batch["num_boxes"][row] == n
            flipped = np.stack([W - boxes[:, 2], boxes[:, 1], W - boxes[:, 0], boxes[:, 3]], 1)
            np.testing.assert_allclose(batch["boxes"][row][:n], flipped, atol=1e-3)
            assert (batch["boxes"][row][n:] == 0).all()
            assert batch["box_labels"][row].tolist() == labels.tolist() + [-1] * (4 - n)
            assert unpad(batch, row)["box_labels"].tolist() == labels.tolist()
    assert not any(k.startswith("image/object") for k in got[0])  # the stored lists are gone


def test_train_preset_keeps_each_box_on_its_object(detection: Path) -> None:
    """A random resized crop and flip, fused into the decode: every box left in view bounds
    the pixels of its object's colour, and every object in view keeps its box."""
    transform = Compose([ReadBoxes(), shardfeed.presets.train(size=64), PadBoxes(4)])
    loader = shardfeed.Loader(shardfeed.Dataset(str(detection)), batch_size=6, seed=3,
                              transform=transform, num_threads=2)
    checked = 0
    for _ in range(3):
        for batch in batches(loader):
            for row in range(len(batch["image"])):
                image, mine = batch["image"][row].astype(int), unpad(batch, row)
                for box, label in zip(mine["boxes"], mine["box_labels"]):
                    colour = (np.abs(image - COLOURS[label]).sum(axis=-1) < 60)
                    ys, xs = np.nonzero(colour)
                    if len(ys) < 4:
                        continue  # a sliver; JPEG and resampling blur its few pixels
                    x0, y0, x1, y1 = box
                    inside = (xs >= x0 - 1.5) & (xs <= x1 + 0.5) & (ys >= y0 - 1.5) & (ys <= y1 + 0.5)
                    assert inside.mean() > 0.97
                    checked += 1
                for label in range(3):  # an object whose colour fills pixels has its box
                    seen = (np.abs(image - COLOURS[label]).sum(axis=-1) < 30).sum()
                    if seen > 20:
                        assert label in mine["box_labels"].tolist()
    assert checked > 50


def test_torch_and_jax_get_padded_arrays(detection: Path) -> None:
    torch = pytest.importorskip("torch")
    transform = Compose([ReadBoxes(), DecodeImage(), PadBoxes(5)])

    def loader() -> shardfeed.Loader:
        return shardfeed.Loader(shardfeed.Dataset(str(detection)), batch_size=4,
                                shuffle=False, transform=transform)

    batch = next(iter(shardfeed.torch.adapt(loader())))
    assert isinstance(batch["boxes"], torch.Tensor) and batch["boxes"].shape == (4, 5, 4)
    assert batch["num_boxes"].tolist() == [1, 2, 3, 1]
    assert batch["box_labels"].dtype == torch.int64
    jax = pytest.importorskip("jax")
    batch = next(iter(shardfeed.jax.adapt(loader())))
    assert isinstance(batch["boxes"], jax.Array) and batch["boxes"].shape == (4, 5, 4)
    assert np.asarray(batch["num_boxes"]).tolist() == [1, 2, 3, 1]


def test_unpadded_boxes_in_a_batch_say_how_to_pad(detection: Path) -> None:
    loader = shardfeed.Loader(shardfeed.Dataset(str(detection)), batch_size=4, shuffle=False,
                              transform=Compose([ReadBoxes(), DecodeImage()]))
    with pytest.raises(SchemaError, match=r"PadBoxes") as info:
        batches(loader)
    assert "od-00000.tfrecord" in str(info.value)


def test_too_many_boxes_is_named_or_truncated_when_asked(detection: Path) -> None:
    def run(pad: PadBoxes) -> list[dict[str, Any]]:
        return batches(shardfeed.Loader(shardfeed.Dataset(str(detection)), batch_size=4,
                                         shuffle=False,
                                         transform=Compose([ReadBoxes(), DecodeImage(), pad])))

    with pytest.raises(SchemaError, match=r"3 boxes, more than PadBoxes\(max_boxes=2\)") as info:
        run(PadBoxes(2))
    # the traceback names the record (a note: the error is the transform's own)
    assert "od-00000.tfrecord', record 2 at byte" in " ".join(info.value.__notes__)
    kept = run(PadBoxes(2, overflow="truncate"))
    assert kept[0]["num_boxes"].tolist() == [1, 2, 2, 1]


def read(sample: dict[str, Any], **options: Any) -> dict[str, Any]:
    return ReadBoxes(**options)(sample, np.random.default_rng(0))


def test_read_boxes_refuses_what_would_be_wrong() -> None:
    base = {"image": np.zeros((10, 20, 3), np.uint8),
            "image/object/bbox/xmin": np.array([0.1, 0.2], np.float32),
            "image/object/bbox/ymin": np.array([0.1, 0.2], np.float32),
            "image/object/bbox/xmax": np.array([0.5, 0.6], np.float32),
            "image/object/bbox/ymax": np.array([0.5, 0.6], np.float32),
            "image/object/class/label": np.array([1, 2])}
    got = read(dict(base))
    np.testing.assert_allclose(got["boxes"][0], [2, 1, 10, 5], atol=1e-5)
    with pytest.raises(SchemaError, match="one value an object"):
        read({**base, "image/object/bbox/ymax": np.array([0.5], np.float32)})
    with pytest.raises(SchemaError, match="normalized=False"):
        read({**base, "image/object/bbox/xmax": np.array([5.0, 9.0], np.float32)})
    with pytest.raises(SchemaError, match="max is before its min"):
        read({**base, "image/object/bbox/xmax": np.array([0.05, 0.6], np.float32)})
    with pytest.raises(SchemaError, match="finite"):
        read({**base, "image/object/bbox/xmin": np.array([np.nan, 0.2], np.float32)})
    with pytest.raises(SchemaError, match="one integer class"):
        read({**base, "image/object/class/label": np.array([1])})
    empty = read({"image": np.zeros((10, 20, 3), np.uint8)})  # an image without objects
    assert empty["boxes"].shape == (0, 4) and empty["box_labels"].shape == (0,)
    pixels = read({**base, "image/object/bbox/xmax": np.array([5.0, 9.0], np.float32),
                   "image/object/bbox/xmin": np.array([1.0, 2.0], np.float32)},
                  normalized=False)
    assert pixels["boxes"][:, 0].tolist() == [1.0, 2.0]
    # before the decode, the size is the encoded image's own, whatever the features claim
    png = cv2.imencode(".png", np.zeros((10, 20, 3), np.uint8))[1].tobytes()
    lying = {**base, "image/encoded": png, "image/height": [100], "image/width": [200]}
    del lying["image"]
    np.testing.assert_allclose(read(lying)["boxes"][0], [2, 1, 10, 5], atol=1e-5)
    raw = {**lying, "image/encoded": bytes(600)}  # raw pixels: no header, the features
    np.testing.assert_allclose(read(raw)["boxes"][0], [20, 10, 100, 50], atol=1e-4)
    padded = PadBoxes(3)(empty, np.random.default_rng(0))
    assert padded["num_boxes"] == 0 and padded["box_labels"].tolist() == [-1, -1, -1]
