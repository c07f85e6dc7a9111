"""A slice's patches cut in one compiled call give the bytes the Python cut gives, row by row:
padded crops of any item type and channel count, linear resizes, and every row the call
leaves (a resize by area, an image of another layout, a box it refuses) cut by Python; the
records' other features, taken once a record, are the row-by-row stack; a dataset without
images is refused when the sampler is made."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from shardfeed import Dataset, Patches
from shardfeed.errors import SchemaError
from shardfeed.format.writer import ShardWriter
from shardfeed.pipeline import patch_crops
from shardfeed.pipeline.patch_crops import PatchOptions, cut_rows
from shardfeed.transforms.decode import native_rows

pytestmark = pytest.mark.skipif(native_rows.compiled is None,
                                reason="built without the compiled crop call")


def _python_cut(monkeypatch: pytest.MonkeyPatch, images: list[np.ndarray], boxes: np.ndarray,
                shape: tuple[int, ...], dtype: type, options: PatchOptions) -> np.ndarray:
    with monkeypatch.context() as patched:
        patched.setattr(native_rows, "compiled", None)
        out = np.full(shape, 7, dtype)
        assert cut_rows(images, boxes, out, options)
    return out


def _images(rng: np.random.Generator, dtype: type, channels: int) -> list[np.ndarray]:
    top = 256 if dtype is np.uint8 else 65536
    shapes = [(40, 60), (33, 17), (9, 5), (64, 64), (31, 90)]
    return [rng.integers(0, top, (h, w, channels)).astype(dtype) for h, w in shapes]


@pytest.mark.parametrize(("dtype", "channels"), [(np.uint8, 3), (np.uint8, 1), (np.uint16, 3),
                                                 (np.uint8, 4)])
def test_padded_crops_are_the_python_cuts(monkeypatch: pytest.MonkeyPatch, dtype: type,
                                          channels: int) -> None:
    rng = np.random.default_rng(1)
    images = _images(rng, dtype, channels)
    options = PatchOptions(size=(12, 16))
    picks, boxes = [], []
    for _ in range(64):
        k = int(rng.integers(len(images)))
        h, w = images[k].shape[:2]
        ch, cw = min(12, h), min(16, w)  # a smaller image: the crop padded with zeros
        boxes.append((int(rng.integers(h - ch + 1)), int(rng.integers(w - cw + 1)), ch, cw))
        picks.append(images[k])
    table = np.array(boxes, dtype=np.int64)
    shape = (len(picks), 12, 16, channels)
    out = np.full(shape, 7, dtype)
    flags = native_rows.compiled.cut_rows(picks, table, out, False)
    assert all(flags)  # every row by the compiled call
    out = np.full(shape, 7, dtype)
    assert cut_rows(picks, table, out, options)
    assert out.tobytes() == _python_cut(monkeypatch, picks, table, shape, dtype,
                                        options).tobytes()
    assert (out[[i for i, b in enumerate(boxes) if b[2] < 12], 11] == 0).all()


def test_resized_crops_are_the_python_cuts(monkeypatch: pytest.MonkeyPatch) -> None:
    if not native_rows.agrees():
        pytest.skip("the compiled resize is not OpenCV's here")
    rng = np.random.default_rng(2)
    big = rng.integers(0, 256, (120, 150, 3), dtype=np.uint8)
    views = [big, big[10:100, 5:140], np.ascontiguousarray(big[:, ::-1]), big[:, ::-1],
             big[::2, ::2]]
    options = PatchOptions(size=(16, 20), scale=(0.5, 3.0))
    picks, boxes = [], []
    for size in [(16, 20), (8, 9), (20, 25), (31, 39), (32, 40), (40, 30), (33, 80),
                 (60, 90), (16, 41)] * 3:
        image = views[int(rng.integers(len(views)))]
        h, w = min(size[0], image.shape[0]), min(size[1], image.shape[1])
        boxes.append((int(rng.integers(image.shape[0] - h + 1)),
                      int(rng.integers(image.shape[1] - w + 1)), h, w))
        picks.append(image)
    table = np.array(boxes, dtype=np.int64)
    shape = (len(picks), 16, 20, 3)
    flags = native_rows.compiled.cut_rows(picks, table, np.zeros(shape, np.uint8), True)
    for flag, (_, _, h, w), image in zip(flags, boxes, picks):
        by_area = h >= 32 and w >= 40
        pixels_in_a_row = image.strides[1] == 3  # not reversed, not every other column
        assert flag == (not by_area and pixels_in_a_row)
    out = np.full(shape, 7, np.uint8)
    assert cut_rows(picks, table, out, options)
    assert out.tobytes() == _python_cut(monkeypatch, picks, table, shape, np.uint8,
                                        options).tobytes()


def test_rows_the_call_refuses_are_left_to_python(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(3)
    image = rng.integers(0, 256, (30, 30, 3), dtype=np.uint8)
    options = PatchOptions(size=(8, 8))
    gray = image[:, :, :1].copy()
    boxes = np.array([(0, 0, 8, 8), (25, 25, 8, 8), (0, 0, 9, 8), (-1, 0, 8, 8),
                      (2, 3, 8, 8)], dtype=np.int64)
    flags = native_rows.compiled.cut_rows([image] * 5, boxes, np.zeros((5, 8, 8, 3), np.uint8),
                                          False)
    assert list(flags) == [1, 0, 0, 0, 1]  # outside, larger than the row, negative
    # a row of another channel count: the slice goes to the one-by-one path, as before
    assert not cut_rows([image, gray], boxes[[0, 4]], np.zeros((2, 8, 8, 3), np.uint8),
                        options)
    # a box past the image's edge fails as the Python cut fails, compiled or not
    with pytest.raises(ValueError):
        cut_rows([image], boxes[1:2], np.zeros((1, 8, 8, 3), np.uint8), options)
    monkeypatch.setattr(native_rows, "compiled", None)
    with pytest.raises(ValueError):
        cut_rows([image], boxes[1:2], np.zeros((1, 8, 8, 3), np.uint8), options)
    assert patch_crops.native_rows.compiled is None


def test_features_of_shared_records_are_stacked_as_row_by_row() -> None:
    records = [{"label": np.array([i, -i]), "name": f"photo-{i}.jpg".encode(),
                "box": np.array([0.5 * i], np.float32)} for i in range(5)]
    picks = [3, 0, 3, 4, 1, 1, 0, 2, 3]  # a slice: few images, shared
    rows = [records[k] for k in picks]
    columns = patch_crops.stacked_features(records, np.array(picks))
    assert columns is not None
    for name, column in patch_crops.stacked_features(rows).items():  # one row each: alike
        np.testing.assert_array_equal(np.asarray(column), np.asarray(columns[name]))
    np.testing.assert_array_equal(columns["label"], np.stack([r["label"] for r in rows]))
    assert columns["label"].dtype == np.int64 and columns["label"].flags.c_contiguous
    assert columns["box"].dtype == np.float32 and columns["box"].shape == (9, 1)
    assert columns["name"] == [r["name"] for r in rows]
    # records that are not alike: None, shared or not
    odd = {**records[2], "label": np.array([1, 2, 3])}
    assert patch_crops.stacked_features([*rows, odd, odd]) is None
    assert patch_crops.stacked_features([*records, odd], np.array([0, 5, 5])) is None
    assert patch_crops.stacked_features([*rows, {"label": records[0]["label"]}]) is None


def test_object_items_and_views_of_the_batch_are_cut_by_python(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows the compiled call must not copy byte for byte: Python objects (a copy would need
    their references), and images that are views of the batch being written."""
    options = PatchOptions(size=(4, 4))
    things = np.empty((6, 6, 3), object)
    things[...] = [[[object() for _ in range(3)] for _ in range(6)] for _ in range(6)]
    boxes = np.array([(1, 1, 4, 4), (0, 2, 4, 4)], dtype=np.int64)
    flags = native_rows.compiled.cut_rows([things] * 2, boxes, np.empty((2, 4, 4, 3), object),
                                          False)
    assert list(flags) == [0, 0]
    out = np.empty((2, 4, 4, 3), object)
    assert cut_rows([things] * 2, boxes, out, options)
    assert out[0, 0, 0, 0] is things[1, 1, 0] and out[1, 3, 3, 2] is things[3, 5, 2]
    batch = np.arange(2 * 6 * 6 * 3, dtype=np.uint8).reshape(2, 6, 6, 3)
    views = [batch[1], batch[0]]  # each row cut from the other row of the same array
    flags = native_rows.compiled.cut_rows(views, boxes, batch[:, :4, :4].copy(), False)
    assert list(flags) == [1, 1]  # apart from the out they are written to: taken
    into = np.ascontiguousarray(batch[:, :4, :4])  # images that are rows of the out itself
    whole = np.array([(0, 0, 4, 4)] * 2, np.int64)
    assert list(native_rows.compiled.cut_rows([into[1], into[0]], whole, into, False)) == [0, 0]
    expected = into[::-1].copy()  # NumPy's row-by-row copy: row 1 into 0, then the new 0 into 1
    expected[1] = expected[0]
    assert cut_rows([into[1], into[0]], whole, into, options)
    np.testing.assert_array_equal(into, expected)


def test_a_dataset_without_images_is_refused_when_patches_are_made(tmp_path: Path) -> None:
    with ShardWriter(tmp_path / "a.tfrecord") as writer:
        for i in range(10):
            writer.write_example({"x": np.arange(3) + i, "id": i})
    with pytest.raises(SchemaError, match=r"no image feature.*\['id', 'x'\]"):
        Patches(Dataset(str(tmp_path)), size=8, cache_images=2, refresh_every=4)


def test_rows_of_one_image_share_its_buffer_and_its_verdict() -> None:
    """Rows that share one image object (the compiled call takes its buffer once for
    them): each cut as a copy of the image would be, every buffer released after, and an
    object of several rows that is no image leaves each of them to the caller."""
    rng = np.random.default_rng(4)
    image = rng.integers(0, 256, (20, 24, 3), np.uint8)
    other = rng.integers(0, 256, (18, 30, 3), np.uint8)
    boxes = np.array([[0, 0, 8, 8], [3, 4, 8, 8], [9, 1, 8, 8], [2, 2, 8, 8], [5, 9, 8, 8]],
                     dtype=np.int64)
    shared = np.zeros((5, 8, 8, 3), np.uint8)
    flags = native_rows.compiled.cut_rows([image, other, image, "pixels", "pixels"], boxes,
                                          shared, False)
    assert list(flags) == [1, 1, 1, 0, 0]
    copies = np.zeros((5, 8, 8, 3), np.uint8)
    native_rows.compiled.cut_rows([image.copy(), other.copy(), image.copy(), image, image],
                                  boxes, copies, False)
    assert shared[:3].tobytes() == copies[:3].tobytes()
    np.testing.assert_array_equal(shared[2], image[9:17, 1:9])
    assert sys.getrefcount(image) == 2 and not shared[3:].any()  # every view released


def test_records_of_one_kind_share_it_and_are_stacked_as_when_compared() -> None:
    from shardfeed.transforms.decode.patches import meta_kinds

    records = [{"label": np.array([i, -i]), "name": f"photo-{i}.jpg".encode(),
                "box": np.array([0.5 * i], np.float32)} for i in range(5)]
    kinds = [meta_kinds(r) for r in records]
    assert all(k is kinds[0] for k in kinds)  # one object: `is` tells them alike
    picks = np.array([3, 0, 3, 4, 1, 1, 0, 2, 3])
    compared = patch_crops.stacked_features(records, picks)
    trusted = patch_crops.stacked_features(records, picks, alike=True)
    assert compared is not None and trusted is not None
    assert list(compared) == list(trusted)
    for name in compared:
        np.testing.assert_array_equal(np.asarray(compared[name]), np.asarray(trusted[name]))
        assert type(compared[name]) is type(trusted[name])
    # another length, dtype, or order of names: another kind
    for other in ({**records[0], "label": np.array([1, 2, 3])},
                  {**records[0], "box": np.array([0.5])},
                  {"name": b"x", "label": np.array([1, 2]), "box": np.array([0.5], np.float32)}):
        assert meta_kinds(other) != kinds[0]
