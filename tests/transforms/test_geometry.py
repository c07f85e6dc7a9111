"""Geometric transforms on arrays: shapes, masks follow images, randomness from the rng only."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardfeed.errors import SchemaError
from shardfeed.transforms import (
    CenterCrop,
    Compose,
    CropOrPad,
    RandomHorizontalFlip,
    RandomResizedCrop,
    Resize,
)
from shardfeed.transforms.base import ArraySpec


def labelled_pair(h: int, w: int, block: int = 16, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A mask of blocky labels 0..5 and an image painted from it (colour = label × 40)."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 6, size=(-(-h // block), -(-w // block))).astype(np.uint8)
    mask = np.kron(labels, np.ones((block, block), np.uint8))[:h, :w]
    image = np.repeat((mask * 40)[:, :, None], 3, axis=2).astype(np.uint8)
    return image, np.ascontiguousarray(mask)


def agreement(image: np.ndarray, mask: np.ndarray) -> float:
    """Fraction of interior mask pixels (all 8 neighbours share the label) where the image's
    colour names the mask's label. Edges blend under linear/area interpolation."""
    m = mask.astype(int)
    p = np.pad(m, 1, mode="edge")
    interior = np.ones_like(m, bool)
    for dy in (0, 1, 2):
        for dx in (0, 1, 2):
            interior &= p[dy : dy + m.shape[0], dx : dx + m.shape[1]] == m
    hits = np.abs(image[..., 0].astype(int) - m * 40) <= 4
    return float(hits[interior].mean())


@settings(max_examples=150, deadline=None)
@given(h=st.integers(1, 90), w=st.integers(1, 90), oh=st.integers(1, 90), ow=st.integers(1, 90))
def test_crop_or_pad_any_size(h: int, w: int, oh: int, ow: int) -> None:
    image = np.arange(h * w * 3, dtype=np.int64).reshape(h, w, 3).astype(np.float32)
    mask = (np.arange(h * w).reshape(h, w) % 7).astype(np.uint8)
    out = CropOrPad(oh, ow, fill=-1, mask_fill=255)({"image": image, "mask": mask}, None)
    assert out["image"].shape == (oh, ow, 3)
    assert out["mask"].shape == (oh, ow)
    # Every kept pixel keeps its value; padding is the fill; image and mask line up.
    kept = out["image"][..., 0] >= 0
    assert kept.sum() == min(h, oh) * min(w, ow)
    assert (out["mask"][~kept] == 255).all()
    src = out["image"][kept][:, 0].astype(np.int64) // 3
    np.testing.assert_array_equal(out["mask"][kept], (src % 7).astype(np.uint8))


def test_random_resized_crop_and_flip_keep_mask_aligned() -> None:
    image, mask = labelled_pair(300, 400, block=32)
    pipeline = Compose([RandomResizedCrop(64, scale=(0.1, 1.0)), RandomHorizontalFlip(0.5)])
    flips = 0
    for seed in range(20):
        sample = {"image": image.copy(), "mask": mask.copy()}
        out = pipeline(sample, np.random.default_rng(seed))
        assert out["image"].shape == (64, 64, 3) and out["mask"].shape == (64, 64)
        assert set(np.unique(out["mask"])) <= set(range(6))  # nearest: no blended labels
        assert agreement(out["image"], out["mask"]) > 0.95
        # A mask that missed the flip would not line up.
        assert agreement(out["image"][:, ::-1], out["mask"]) < 0.9 or seed_symmetric(out)
        flips += int(np.random.default_rng(seed).random() < 2)  # keep the loop honest
    assert flips == 20


def seed_symmetric(out: dict[str, np.ndarray]) -> bool:
    return bool((out["mask"] == out["mask"][:, ::-1]).mean() > 0.8)


def test_flip_exact() -> None:
    image, mask = labelled_pair(20, 30)
    out = RandomHorizontalFlip(1.0)({"image": image, "mask": mask}, np.random.default_rng(0))
    np.testing.assert_array_equal(out["image"], image[:, ::-1])
    np.testing.assert_array_equal(out["mask"], mask[:, ::-1])
    same = RandomHorizontalFlip(0.0)({"image": image, "mask": mask}, np.random.default_rng(0))
    np.testing.assert_array_equal(same["image"], image)


def test_randomness_only_from_the_generator() -> None:
    image, mask = labelled_pair(120, 160)
    pipeline = Compose([RandomResizedCrop(32), RandomHorizontalFlip()])
    np.random.seed(123)
    before = np.random.get_state()[1].copy()
    a = pipeline({"image": image, "mask": mask}, np.random.default_rng(5))
    b = pipeline({"image": image, "mask": mask}, np.random.default_rng(5))
    np.testing.assert_array_equal(a["image"], b["image"])
    np.testing.assert_array_equal(a["mask"], b["mask"])
    np.testing.assert_array_equal(np.random.get_state()[1], before)  # global state untouched
    outputs = {
        pipeline({"image": image, "mask": mask}, np.random.default_rng(s))["image"].tobytes()
        for s in range(10)
    }
    assert len(outputs) > 5  # different keys give different crops


def test_resize_shorter_side_and_exact() -> None:
    image, mask = labelled_pair(100, 200)
    out = Resize(50)({"image": image, "mask": mask}, None)
    assert out["image"].shape == (50, 100, 3) and out["mask"].shape == (50, 100)
    out = Resize((30, 40))({"image": image, "mask": mask}, None)
    assert out["image"].shape == (30, 40, 3) and out["mask"].shape == (30, 40)
    tall = Resize(10)({"image": np.zeros((40, 20, 1), np.uint8)}, None)
    assert tall["image"].shape == (20, 10, 1)


def test_frames_share_one_geometry() -> None:
    image, mask = labelled_pair(80, 100)
    frames = np.stack([image, 255 - image, image // 2])
    masks = np.stack([mask, mask, mask])
    out = Compose([RandomResizedCrop(24), RandomHorizontalFlip(1.0)])(
        {"image": frames, "mask": masks}, np.random.default_rng(3)
    )
    assert out["image"].shape == (3, 24, 24, 3) and out["mask"].shape == (3, 24, 24)
    single = Compose([RandomResizedCrop(24), RandomHorizontalFlip(1.0)])(
        {"image": image, "mask": mask}, np.random.default_rng(3)
    )
    np.testing.assert_array_equal(out["image"][0], single["image"])
    np.testing.assert_array_equal(out["mask"][1], single["mask"])


def test_second_image_follows() -> None:
    image, mask = labelled_pair(60, 60)
    op = RandomResizedCrop(16, keys=("image", "depth"))
    out = op({"image": image, "depth": image.copy(), "mask": mask}, np.random.default_rng(1))
    np.testing.assert_array_equal(out["image"], out["depth"])


def test_out_is_written_in_place() -> None:
    image, _ = labelled_pair(50, 70)
    slot = np.zeros((8, 16, 16, 3), np.uint8)
    for op in (RandomResizedCrop(16), CenterCrop(16), CropOrPad(16, 16), Resize((16, 16))):
        want = op({"image": image}, np.random.default_rng(2))["image"]
        got = op({"image": image}, np.random.default_rng(2), out=slot[3])
        assert got["image"] is slot[3] or np.shares_memory(got["image"], slot)
        np.testing.assert_array_equal(slot[3], want)


def test_output_specs() -> None:
    specs = {"image": ArraySpec((None, None, 3), np.uint8), "mask": ArraySpec((None, None), np.uint8)}
    out = Compose([RandomResizedCrop((20, 30)), RandomHorizontalFlip()]).output_spec(specs)
    assert out == {"image": ArraySpec((20, 30, 3), np.uint8), "mask": ArraySpec((20, 30), np.uint8)}
    assert Compose([Resize(20)]).output_spec(specs)["image"].shape == (None, None, 3)


def test_errors() -> None:
    with pytest.raises(SchemaError, match="decode"):
        CenterCrop(4)({"image/encoded": b"..."}, None)
    with pytest.raises(ValueError, match="scale"):
        RandomResizedCrop(4, scale=(0.5, 0.1))
    with pytest.raises(ValueError, match="probability"):
        RandomHorizontalFlip(1.5)
    with pytest.raises(TypeError, match="sequences"):
        RandomHorizontalFlip(keys="image")
