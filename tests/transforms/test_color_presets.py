"""Colour/value ops, Compose/as_transform, and the train/eval presets."""

from __future__ import annotations

from typing import Any

import cv2
import numpy as np
import pytest
from transforms_helpers import jpeg_bytes, smooth_image

from shardfeed.format.schema import infer_schema
from shardfeed.transforms import (
    ColorJitter,
    Compose,
    Normalize,
    ToCHW,
    ToFloat,
    as_transform,
    call_into,
    presets,
)


def test_normalize_values() -> None:
    image = np.array([[[0, 128, 255]]], np.uint8)
    out = Normalize()({"image": image}, None)["image"]
    assert out.dtype == np.float32
    expected = (np.array([0, 128, 255]) / 255 - np.array([0.485, 0.456, 0.406])) / np.array(
        [0.229, 0.224, 0.225]
    )
    np.testing.assert_allclose(out[0, 0], expected, rtol=1e-5)
    sym = Normalize.symmetric()({"image": np.array([[[0, 255, 0]]], np.uint8)}, None)["image"]
    np.testing.assert_allclose(sym[0, 0], [-1, 1, -1], atol=1e-6)
    with pytest.raises(ValueError, match="std"):
        Normalize((0.5,), (0.0,))


def test_float_and_layout() -> None:
    image = smooth_image(4, 6)
    out = Compose([ToFloat(), ToCHW()])({"image": image, "mask": image[..., 0]}, None)
    assert out["image"].shape == (3, 4, 6) and out["image"].dtype == np.float32
    np.testing.assert_allclose(out["image"][1], image[..., 1] / 255, rtol=1e-6)
    assert out["mask"].shape == (4, 6)  # masks are left alone


def test_color_jitter() -> None:
    image = smooth_image(32, 32)
    mask = image[..., 0].copy()
    same = ColorJitter()({"image": image.copy()}, np.random.default_rng(0))["image"]
    np.testing.assert_array_equal(same, image)
    op = ColorJitter(0.4, 0.4, 0.4, 0.1)
    a = op({"image": image.copy(), "mask": mask}, np.random.default_rng(3))
    b = op({"image": image.copy(), "mask": mask}, np.random.default_rng(3))
    np.testing.assert_array_equal(a["image"], b["image"])
    np.testing.assert_array_equal(a["mask"], mask)
    assert not np.array_equal(a["image"], image)
    bright = ColorJitter(brightness=(2.0, 2.0))({"image": np.full((2, 2, 3), 60, np.uint8)}, np.random.default_rng(0))
    assert (bright["image"] == 120).all()
    red = np.zeros((2, 2, 3), np.uint8)
    red[..., 0] = 200
    shifted = ColorJitter(hue=0.5)({"image": red}, np.random.default_rng(1))["image"]
    hue = cv2.cvtColor(shifted, cv2.COLOR_RGB2HSV)[0, 0, 0]
    assert hue != 0  # red moved round the colour circle
    gray = ColorJitter(0.3, 0.3, 0.3, 0.1)({"image": image[..., :1].copy()}, np.random.default_rng(0))
    assert gray["image"].shape == (32, 32, 1)
    with pytest.raises(TypeError, match="uint8"):
        ColorJitter(0.1)({"image": image.astype(np.float32)}, np.random.default_rng(0))


def test_compose_and_as_transform() -> None:
    calls: list[str] = []

    def tag(sample: dict[str, Any]) -> dict[str, Any]:
        calls.append("tag")
        sample["tagged"] = True
        return sample

    pipe = Compose([as_transform(tag), ToFloat()])
    out = pipe({"image": np.ones((2, 2, 3), np.uint8)}, np.random.default_rng(0))
    assert out["tagged"] and calls == ["tag"]
    assert pipe.bind(None, root=None)  # children without bind pass through
    assert Compose([as_transform(tag)]).output_spec({}) is None  # opaque to the spec
    slot = np.zeros((2, 2, 3), np.float32)
    out = call_into(Compose([as_transform(tag)]), {"image": np.ones((2, 2, 3), np.uint8)}, None, slot)
    assert (slot == 1).all()
    with pytest.raises(ValueError, match="shape"):
        call_into(as_transform(tag), {"image": np.ones((3, 2, 3), np.uint8)}, None, slot)
    with pytest.raises(TypeError, match="as_transform"):
        Compose([42])  # type: ignore[list-item]


SETTINGS = [
    ({}, (32, 32, 3), np.uint8),
    ({"dtype": "float32"}, (32, 32, 3), np.float32),
    ({"normalize": "imagenet", "dtype": "float32", "layout": "CHW"}, (3, 32, 32), np.float32),
    ({"normalize": "symmetric", "dtype": "float32"}, (32, 32, 3), np.float32),
    ({"layout": "CHW"}, (3, 32, 32), np.uint8),
]


@pytest.mark.parametrize(("options", "shape", "dtype"), SETTINGS)
def test_presets_output_shape_and_spec(
    tf_records: list[dict[str, Any]], options: dict[str, Any], shape: tuple[int, ...], dtype: Any
) -> None:
    schema = infer_schema(tf_records)
    for build in (presets.train, presets.eval):
        extra = {"color": 1.0} if build is presets.train else {}
        pipe = build(32, **options, **extra).bind(schema, root=None)
        spec = pipe.output_spec()
        assert spec is not None
        assert spec["image"].shape == shape and spec["image"].dtype == dtype
        assert spec["mask"].shape == (32, 32)
        batch = np.zeros((len(tf_records),) + shape, dtype)
        for i, record in enumerate(tf_records):  # JPEG and PNG records, raw masks
            out = pipe(dict(record), np.random.default_rng(i), out=batch[i])
            assert out["image"].shape == shape and out["image"].dtype == dtype
            assert out["mask"].shape == (32, 32)
        if options.get("normalize") == "symmetric":
            assert batch.min() >= -1 and batch.max() <= 1


def test_eval_preset_is_deterministic_train_is_keyed() -> None:
    data = jpeg_bytes(smooth_image(375, 500))
    ev = presets.eval(64)
    a = ev({"image/encoded": data}, np.random.default_rng(0))["image"]
    b = ev({"image/encoded": data}, np.random.default_rng(99))["image"]
    np.testing.assert_array_equal(a, b)
    tr = presets.train(64, color=0.5)
    c = tr({"image/encoded": data}, np.random.default_rng(5))["image"]
    d = tr({"image/encoded": data}, np.random.default_rng(5))["image"]
    e = tr({"image/encoded": data}, np.random.default_rng(6))["image"]
    np.testing.assert_array_equal(c, d)
    assert not np.array_equal(c, e)


def test_preset_arguments_checked() -> None:
    with pytest.raises(ValueError, match="float32"):
        presets.train(normalize="imagenet")
    with pytest.raises(ValueError, match="layout"):
        presets.eval(layout="NHWC")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="crop_fraction"):
        presets.eval(crop_fraction=1.5)
    with pytest.raises(ValueError, match="color"):
        presets.train(color=-1.0)
