"""The cheaper per-sample paths give the same results as the plain ones: crop boxes, PNG
decoding straight to RGB, generators skipped for transforms that never draw, and error
messages built only on error but still naming the image."""

from __future__ import annotations

import io
import math
import pickle
from collections.abc import Iterator
from typing import Any

import cv2
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from shardfeed.errors import DecodeError
from shardfeed.transforms import (
    CenterCrop,
    ColorJitter,
    Compose,
    DecodeCenterCrop,
    DecodeImage,
    DecodeRandomResizedCrop,
    Normalize,
    RandomHorizontalFlip,
    ToCHW,
    as_transform,
    decode_image,
    presets,
)
from shardfeed.transforms import boxes as boxes_module
from shardfeed.transforms.base import NO_RANDOMNESS, draws_random
from shardfeed.transforms.boxes import Box, random_resized_box


def _reference_box(height: int, width: int, rng: np.random.Generator, *,
                   scale: tuple[float, float], ratio: tuple[float, float]) -> Box | None:
    """Inception-style draws through ``uniform`` and ``integers(0, n)`` (None: fallback)."""
    area = height * width
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    for _ in range(10):
        target = area * float(rng.uniform(scale[0], scale[1]))
        aspect = math.exp(float(rng.uniform(log_lo, log_hi)))
        w = round(math.sqrt(target * aspect))
        h = round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            return Box(int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)),
                       h, w)
    return None


@pytest.fixture(params=[True, False], ids=["random-draws", "uniform-draws"])
def affine(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[bool]:
    """Run a test with both ways of drawing the box's uniforms."""
    if request.param and not boxes_module.uniform_is_affine():
        pytest.skip("NumPy's uniform() is not the affine map of random() on this build")
    monkeypatch.setattr(boxes_module, "uniform_is_affine", lambda: request.param)
    yield request.param


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # the patch is constant
@given(
    height=st.integers(1, 600), width=st.integers(1, 600), seed=st.integers(0, 2**32),
    scale=st.sampled_from([(0.08, 1.0), (0.5, 0.9), (0.99, 1.0), (0.01, 0.02)]),
    ratio=st.sampled_from([(3 / 4, 4 / 3), (1.0, 1.0), (0.2, 5.0), (2.0, 3.0)]),
)
def test_boxes_equal_those_of_uniform_and_integers(
    affine: bool, height: int, width: int, seed: int, scale: tuple[float, float],
    ratio: tuple[float, float],
) -> None:
    a = np.random.Generator(np.random.Philox(seed))
    b = np.random.Generator(np.random.Philox(seed))
    got = random_resized_box(height, width, a, scale=scale, ratio=ratio)
    want = _reference_box(height, width, b, scale=scale, ratio=ratio)
    if want is not None:
        assert got == want
    assert 0 <= got.y and got.y + got.h <= height and 0 <= got.x and got.x + got.w <= width
    # the generator is left where the plain draws leave it: later draws agree too
    assert a.random() == b.random()


def test_the_affine_check_agrees_with_numpy() -> None:
    same = all(
        np.array_equal(
            np.random.Generator(np.random.Philox(9)).uniform(lo, hi, 2000),
            lo + (hi - lo) * np.random.Generator(np.random.Philox(9)).random(2000),
        )
        for lo, hi in ((0.08, 1.0), (math.log(3 / 4), math.log(4 / 3)))
    )
    assert boxes_module.uniform_is_affine() is same


# --- PNG straight to RGB ---------------------------------------------------------------------


def _png_cases() -> dict[str, bytes]:
    rng = np.random.default_rng(0)
    cases = {
        "gray8": cv2.imencode(".png", rng.integers(0, 256, (9, 13), dtype=np.uint8))[1],
        "bgr8": cv2.imencode(".png", rng.integers(0, 256, (9, 13, 3), dtype=np.uint8))[1],
        "bgra8": cv2.imencode(".png", rng.integers(0, 256, (9, 13, 4), dtype=np.uint8))[1],
        "gray16": cv2.imencode(".png", rng.integers(0, 65536, (9, 13), dtype=np.uint16))[1],
        "bgr16": cv2.imencode(".png", rng.integers(0, 65536, (9, 13, 3), dtype=np.uint16))[1],
    }
    out = {name: buf.tobytes() for name, buf in cases.items()}
    palette = Image.fromarray(rng.integers(0, 256, (9, 13, 3), dtype=np.uint8)).convert(
        "P", palette=Image.Palette.ADAPTIVE, colors=8
    )
    for name, image, extra in (
        ("palette", palette, {}),
        ("palette-transparent", palette, {"transparency": 2}),
        ("gray-alpha", Image.fromarray(rng.integers(0, 256, (9, 13, 2), dtype=np.uint8), "LA"),
         {}),
    ):
        buf = io.BytesIO()
        image.save(buf, format="PNG", **extra)
        out[name] = buf.getvalue()
    return out


@pytest.mark.parametrize("name", sorted(_png_cases()))
def test_png_decodes_to_the_pixels_of_bgr_and_a_channel_swap(name: str) -> None:
    data = _png_cases()[name]
    reference = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    reference = cv2.cvtColor(reference, cv2.COLOR_BGR2RGB)
    image = decode_image(data, mode="rgb")
    assert image.dtype == np.uint8 and image.shape == reference.shape
    assert image.flags.c_contiguous
    np.testing.assert_array_equal(image, reference)
    gray = decode_image(data, mode="gray")
    np.testing.assert_array_equal(
        gray, cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_GRAYSCALE)
    )


# --- transforms that never draw get no generator ----------------------------------------------


def test_presets_and_ops_declare_whether_they_draw() -> None:
    assert draws_random(presets.train(size=8)) is True
    assert draws_random(presets.train(size=8, flip=False)) is True  # the box is random
    assert draws_random(presets.eval(size=8)) is False
    assert draws_random(presets.eval(size=8, normalize="imagenet", dtype="float32",
                                     layout="CHW")) is False
    assert draws_random(DecodeCenterCrop(8, hflip=0.5)) is True
    assert draws_random(Compose([DecodeImage(), CenterCrop(4), Normalize(), ToCHW()])) is False
    assert draws_random(Compose([DecodeImage(), RandomHorizontalFlip()])) is True
    assert draws_random(Compose([DecodeImage(), ColorJitter(0.1)])) is True
    assert draws_random(DecodeRandomResizedCrop(8)) is True
    assert draws_random(as_transform(lambda s: s)) is False

    class Plain:
        def __call__(self, sample: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
            return sample

    assert draws_random(Plain()) is True  # unknown transforms are assumed to draw
    assert draws_random(Compose([DecodeImage(), Plain()])) is True


def test_drawing_from_no_randomness_fails_loudly() -> None:
    with pytest.raises(RuntimeError, match="draws_random = False"):
        NO_RANDOMNESS.random()
    with pytest.raises(RuntimeError, match=r"rng\.integers"):
        NO_RANDOMNESS.integers(3)
    assert pickle.loads(pickle.dumps(NO_RANDOMNESS)) is NO_RANDOMNESS


# --- error places are built only on error, and still name the image ---------------------------


def test_a_damaged_png_is_named_through_the_crop_decode() -> None:
    good = cv2.imencode(".png", np.zeros((8, 8, 3), np.uint8))[1].tobytes()
    damaged = good[:40] + b"\x00" * 16 + good[56:]
    sample = {"image/encoded": damaged, "image/filename": b"cat-17.png"}
    transform = presets.train(size=4)
    with pytest.raises(DecodeError, match=r"feature 'image/encoded' of 'cat-17\.png'"):
        transform(dict(sample), np.random.Generator(np.random.Philox(0)))
    with pytest.raises(DecodeError, match=r"cat-17\.png"):
        DecodeImage()(dict(sample), NO_RANDOMNESS)
