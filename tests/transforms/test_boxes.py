"""Crop-box arithmetic: properties over all image and output sizes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardfeed.transforms.boxes import (
    Box,
    center_box,
    parse_size,
    random_resized_box,
    scale_denominator,
    scaled_box,
)

dims = st.integers(min_value=1, max_value=5000)


@settings(max_examples=200, deadline=None)
@given(
    h=dims,
    w=dims,
    seed=st.integers(0, 2**32 - 1),
    lo=st.floats(0.01, 1.0),
    r0=st.floats(0.2, 1.0),
    r1=st.floats(1.0, 5.0),
)
def test_random_box_inside_image(h: int, w: int, seed: int, lo: float, r0: float, r1: float) -> None:
    box = random_resized_box(h, w, np.random.default_rng(seed), scale=(lo, 1.0), ratio=(r0, r1))
    assert box.h >= 1 and box.w >= 1
    assert 0 <= box.y and box.y + box.h <= h
    assert 0 <= box.x and box.x + box.w <= w


def test_random_box_distribution_follows_scale() -> None:
    rng = np.random.default_rng(7)
    areas = []
    for _ in range(2000):
        box = random_resized_box(400, 500, rng, scale=(0.25, 0.5), ratio=(3 / 4, 4 / 3))
        areas.append(box.h * box.w / (400 * 500))
    a = np.array(areas)
    # Rounding to whole pixels moves the area fraction by well under 2 %.
    assert a.min() >= 0.24 and a.max() <= 0.51
    assert abs(a.mean() - 0.375) < 0.01


@settings(max_examples=200, deadline=None)
@given(h=dims, w=dims, oh=st.integers(1, 600), ow=st.integers(1, 600), f=st.floats(0.05, 1.0))
def test_center_box_inside_and_centered(h: int, w: int, oh: int, ow: int, f: float) -> None:
    box = center_box(h, w, oh, ow, crop_fraction=f)
    assert 1 <= box.h <= h and 1 <= box.w <= w
    assert box.y == (h - box.h) // 2 and box.x == (w - box.w) // 2


def test_center_box_is_resize_then_center_crop() -> None:
    # 500×375 → shorter side 256 (scale 256/375) → center 224×224 ↔ 328×328 of the original.
    assert center_box(375, 500, 224, 224, crop_fraction=224 / 256) == Box(23, 86, 328, 328)


@settings(max_examples=300, deadline=None)
@given(ch=dims, cw=dims, oh=st.integers(1, 600), ow=st.integers(1, 600))
def test_scale_denominator_is_largest_that_only_shrinks(ch: int, cw: int, oh: int, ow: int) -> None:
    d = scale_denominator(ch, cw, oh, ow)
    assert d in (1, 2, 4, 8)
    if d > 1:
        assert ch / d >= oh and cw / d >= ow
    if d < 8:
        assert ch / (2 * d) < oh or cw / (2 * d) < ow
    assert scale_denominator(ch, cw, oh, ow, max_denominator=1) == 1


@settings(max_examples=200, deadline=None)
@given(h=dims, w=dims, seed=st.integers(0, 1000), d=st.sampled_from([1, 2, 4, 8]))
def test_scaled_box_inside_scaled_image(h: int, w: int, seed: int, d: int) -> None:
    box = random_resized_box(h, w, np.random.default_rng(seed), scale=(0.08, 1), ratio=(0.75, 4 / 3))
    sh, sw = -(-h // d), -(-w // d)
    sb = scaled_box(box, d, sh, sw)
    assert sb.h >= 1 and sb.w >= 1 and sb.y >= 0 and sb.x >= 0
    assert sb.y + sb.h <= sh and sb.x + sb.w <= sw
    assert abs(sb.y * d - box.y) <= d and abs((sb.y + sb.h) * d - (box.y + box.h)) <= d or sb.h == 1


def test_parse_size() -> None:
    assert parse_size(224) == (224, 224)
    assert parse_size((10, 20)) == (10, 20)
    for bad in (0, (1, 0), (1, 2, 3), -5):
        with pytest.raises(ValueError, match="size"):
            parse_size(bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        parse_size("224")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        parse_size(True)
