"""Geometry for segmentation and detection, checked on drawn scenes: for random sizes and
draws, every image pixel keeps the colour of its mask class through every op (so the two
stay aligned), masks keep only class ids, and boxes stay on their objects."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardfeed.errors import SchemaError
from shardfeed.transforms.geometry import (
    CenterCrop,
    CropOrPad,
    RandomHorizontalFlip,
    RandomResizedCrop,
    Resize,
)
from shardfeed.transforms.placement import BoxFields
from shardfeed.transforms.spatial import (
    RandomAffine,
    RandomCrop,
    RandomRotate90,
    RandomScale,
    RandomVerticalFlip,
)

IGNORE = 255
LUT = np.random.default_rng(5).integers(20, 236, (12, 3))  # a colour a class


def scene(h: int, w: int, seed: int, *, dtype: Any = np.uint8) -> dict[str, Any]:
    """Rectangles of classes 1..8 on class 0; the image is each pixel's class colour (×257 for
    uint16); boxes are the rectangles' exact bounds."""
    rng = np.random.default_rng(seed)
    mask = np.zeros((h, w), np.uint8)
    boxes, labels = [], []
    for c in range(1, 9):
        bh, bw = int(rng.integers(4, max(5, h // 2))), int(rng.integers(4, max(5, w // 2)))
        y, x = int(rng.integers(0, h - bh + 1)), int(rng.integers(0, w - bw + 1))
        if (mask[y:y + bh, x:x + bw] != 0).any():
            continue  # objects do not overlap: each one's pixels are all its own
        mask[y:y + bh, x:x + bw] = c
        boxes.append((x, y, x + bw, y + bh))
        labels.append(c)
    scale = 257 if dtype == np.uint16 else 1
    image = (LUT[mask] * scale).astype(dtype)
    return {"image": image, "mask": mask, "boxes": np.array(boxes, np.float32).reshape(-1, 4),
            "box_labels": np.array(labels, np.int64)}


def ops() -> list[Any]:
    return [
        RandomCrop((40, 56), fill=0, mask_fill=IGNORE),
        RandomVerticalFlip(p=0.5),
        RandomRotate90(),
        RandomAffine(30, scale=(0.7, 1.4), translate=(0.1, 0.1), mask_fill=IGNORE),
        RandomScale((0.6, 1.8)),
        RandomHorizontalFlip(),
        RandomResizedCrop((48, 48), scale=(0.3, 1.0)),
        Resize((50, 70)),
        CropOrPad(60, 30, mask_fill=IGNORE),
        CenterCrop(32, mask_fill=IGNORE),
    ]


OPS = {repr(op): op for op in ops()}


def interior(mask: np.ndarray, radius: int) -> np.ndarray:
    """Pixels whose whole (2r+1)² neighbourhood holds their own class."""
    h, w = mask.shape
    padded = np.pad(mask.astype(np.int32), radius, constant_values=-1)
    same = np.ones((h, w), bool)
    for dy in range(2 * radius + 1):
        for dx in range(2 * radius + 1):
            same &= padded[dy:dy + h, dx:dx + w] == mask
    return same


@settings(max_examples=25, deadline=None)
@given(h=st.integers(24, 90), w=st.integers(24, 90), seed=st.integers(0, 2**31),
       sixteen=st.booleans())
@pytest.mark.parametrize("name", list(OPS))
def test_every_image_pixel_keeps_the_colour_of_its_mask_class(
    name: str, h: int, w: int, seed: int, sixteen: bool,
) -> None:
    dtype = np.uint16 if sixteen else np.uint8
    sample = scene(h, w, seed, dtype=dtype)
    out = OPS[name](dict(sample), np.random.default_rng(seed))
    image, mask = out["image"], out["mask"]
    assert image.dtype == dtype and mask.dtype == np.uint8
    assert image.shape[:2] == mask.shape
    assert set(np.unique(mask)) <= set(range(9)) | {IGNORE}  # class ids only, never blended
    inner = interior(mask, 2) & (mask != IGNORE)
    scale = 257 if sixteen else 1
    expected = (LUT[np.where(mask == IGNORE, 0, mask)] * scale).astype(np.int64)
    got = image.astype(np.int64)
    wrong = np.abs(got - expected).max(axis=2)[inner]
    assert inner.sum() > 0 and wrong.max() <= scale, (name, int(wrong.max()))


@settings(max_examples=25, deadline=None)
@given(h=st.integers(24, 90), w=st.integers(24, 90), seed=st.integers(0, 2**31))
@pytest.mark.parametrize("name", list(OPS))
def test_boxes_stay_on_their_objects(name: str, h: int, w: int, seed: int) -> None:
    sample = scene(h, w, seed)
    out = OPS[name](dict(sample), np.random.default_rng(seed))
    mask, boxes, labels = out["mask"], out["boxes"], out["box_labels"]
    assert boxes.dtype == np.float32 and boxes.shape == (len(labels), 4)
    oh, ow = mask.shape
    assert (boxes[:, [0, 2]] >= 0).all() and (boxes[:, [0, 2]] <= ow).all()
    assert (boxes[:, [1, 3]] >= 0).all() and (boxes[:, [1, 3]] <= oh).all()
    rotates = isinstance(OPS[name], RandomAffine)
    for (x0, y0, x1, y1), c in zip(boxes, labels):
        ys, xs = np.nonzero(mask == c)
        if ys.size == 0:  # a sliver the nearest-neighbour mask did not sample
            assert min(x1 - x0, y1 - y0) < 3
            continue
        # every pixel of the object lies in its box (one pixel of resampling slack)
        assert xs.min() >= x0 - 1 and xs.max() + 1 <= x1 + 1
        assert ys.min() >= y0 - 1 and ys.max() + 1 <= y1 + 1
        if not rotates:  # upright maps: the box is the object's bounds
            assert abs(xs.min() - x0) <= 1 and abs(xs.max() + 1 - x1) <= 1
            assert abs(ys.min() - y0) <= 1 and abs(ys.max() + 1 - y1) <= 1
    kept = set(labels.tolist())
    for c in set(np.unique(mask).tolist()) - {0, IGNORE}:
        ys, xs = np.nonzero(mask == c)
        if xs.max() - xs.min() >= 2 and ys.max() - ys.min() >= 2:
            assert c in kept, f"class {c} is in view but its box was dropped"


def test_boxes_out_of_view_are_dropped_with_their_fields() -> None:
    sample = {"image": np.zeros((100, 100, 3), np.uint8),
              "boxes": np.array([[0, 0, 10, 10], [80, 80, 100, 100], [40, 40, 60, 60]],
                                np.float32),
              "box_labels": np.array([1, 2, 3]), "area": np.array([100.0, 400.0, 400.0])}
    crop = CenterCrop(30, boxes=BoxFields(fields=("box_labels", "area")))
    out = crop(sample, np.random.default_rng(0))
    assert out["box_labels"].tolist() == [3] and out["area"].tolist() == [400.0]
    assert out["boxes"].tolist() == [[5.0, 5.0, 25.0, 25.0]]
    turned = RandomRotate90()({"image": np.zeros((10, 20, 3), np.uint8),
                               "boxes": np.array([[0, 0, 4, 2]], np.float32)},
                              np.random.default_rng(1))
    k = int(np.random.default_rng(1).integers(0, 4))
    expected = {0: [0, 0, 4, 2], 1: [0, 16, 2, 20], 2: [16, 8, 20, 10], 3: [8, 0, 10, 4]}[k]
    assert turned["boxes"].tolist() == [expected]


def test_bad_boxes_and_fields_of_another_length_are_named() -> None:
    image = np.zeros((20, 20, 3), np.uint8)
    with pytest.raises(SchemaError, match="'boxes' holds .* N×4"):
        RandomCrop(10)({"image": image, "boxes": np.zeros((3, 5))}, np.random.default_rng(0))
    with pytest.raises(SchemaError, match="'box_labels' has 2 rows and 'boxes' 3 boxes"):
        RandomCrop(10)({"image": image, "boxes": np.zeros((3, 4)),
                        "box_labels": np.zeros(2)}, np.random.default_rng(0))


def test_pads_are_the_fill_values_and_draws_do_not_depend_on_the_sample() -> None:
    small = {"image": np.full((10, 12, 3), 7, np.uint8), "mask": np.ones((10, 12), np.uint8)}
    out = RandomCrop(32, fill=3, mask_fill=IGNORE)(dict(small), np.random.default_rng(4))
    assert out["image"].shape == (32, 32, 3) and out["mask"].shape == (32, 32)
    assert (out["mask"] == 1).sum() == 120 and (out["image"] == 7).all(axis=2).sum() == 120
    assert set(np.unique(out["mask"])) == {1, IGNORE} and set(np.unique(out["image"])) == {3, 7}
    spatial = [op for op in ops() if type(op).__module__.endswith(".spatial")]
    assert len(spatial) == 5
    for op in spatial:  # the same key draws as many values whatever the image's size
        a, b = np.random.default_rng(9), np.random.default_rng(9)
        op(scene(30, 40, 1), a)
        op(scene(80, 50, 2), b)
        assert a.random() == b.random(), repr(op)


def test_int32_masks_and_windows_of_frames_warp_together() -> None:
    frames = np.stack([scene(40, 40, 3)["image"]] * 2)
    mask = scene(40, 40, 3)["mask"].astype(np.int32) * 1000
    out = RandomAffine(25, mask_fill=-1)({"image": frames, "mask": mask},
                                         np.random.default_rng(2))
    assert out["image"].shape == (2, 40, 40, 3) and out["mask"].dtype == np.int32
    assert np.array_equal(out["image"][0], out["image"][1])
    assert set(np.unique(out["mask"])) <= {-1} | {1000 * c for c in range(9)}


def test_the_crop_aware_decode_moves_boxes_with_its_crop_and_flip() -> None:
    import cv2

    from shardfeed.transforms import DecodeRandomResizedCrop

    op = DecodeRandomResizedCrop(40, scale=(0.3, 1.0), hflip=0.5)
    flipped = 0
    for seed in range(12):
        drawn = scene(64, 80, seed)
        encoded = bytes(cv2.imencode(".png", drawn["image"][..., ::-1])[1])  # BGR for cv2
        sample = {"image/encoded": encoded, "boxes": drawn["boxes"],
                  "box_labels": drawn["box_labels"]}
        out = op(sample, np.random.default_rng(seed))
        image = out["image"].astype(np.int64)
        for (x0, y0, x1, y1), c in zip(out["boxes"], out["box_labels"]):
            ys, xs = np.nonzero((np.abs(image - LUT[c]) <= 1).all(axis=2))  # its colour
            if ys.size:  # edges blend (linear resize): the colour's bounds sit within 2 px
                assert x0 - 1 <= xs.min() <= x0 + 2 and x1 - 2 <= xs.max() + 1 <= x1 + 1, seed
                assert y0 - 1 <= ys.min() <= y0 + 2 and y1 - 2 <= ys.max() + 1 <= y1 + 1, seed
        flipped += out["boxes"].shape[0] > 0
    assert flipped > 6


def test_the_crop_aware_decode_moves_boxes_of_other_names() -> None:
    import cv2

    from shardfeed.transforms import BoxFields, DecodeRandomResizedCrop

    named = BoxFields(keys=("gt",), fields=("cls",))
    drawn = scene(64, 80, 3)
    encoded = bytes(cv2.imencode(".png", drawn["image"][..., ::-1])[1])
    for seed in range(6):
        sample = {"image/encoded": encoded, "gt": drawn["boxes"], "cls": drawn["box_labels"]}
        default = DecodeRandomResizedCrop(40, scale=(0.2, 0.5), hflip=0.5)
        same = default(dict(sample), np.random.default_rng(seed))
        assert np.array_equal(same["gt"], drawn["boxes"])  # not its keys: left as they were
        out = DecodeRandomResizedCrop(40, scale=(0.2, 0.5), hflip=0.5, boxes=named)(
            dict(sample), np.random.default_rng(seed))
        reference = DecodeRandomResizedCrop(40, scale=(0.2, 0.5), hflip=0.5)(
            {"image/encoded": encoded, "boxes": drawn["boxes"],
             "box_labels": drawn["box_labels"]}, np.random.default_rng(seed))
        np.testing.assert_array_equal(out["gt"], reference["boxes"])
        np.testing.assert_array_equal(out["cls"], reference["box_labels"])
