"""The crop-aware decode ops draw their parameters in one place (``draw``) and apply them in
another: the draws a user gets from ``draw`` are the ones the op applies."""

from __future__ import annotations

import cv2
import numpy as np

from shardfeed.transforms import DecodeRandomResizedCrop, arrays


def _png(image: np.ndarray) -> bytes:
    ok, buf = cv2.imencode(".png", cv2.cvtColor(image, cv2.COLOR_RGB2BGR))
    assert ok
    return buf.tobytes()


def test_draw_gives_the_box_and_flip_the_op_applies() -> None:
    y, x = np.mgrid[0:90, 0:120]
    image = np.stack([x * 2, y * 2, (x + y) % 256], axis=-1).astype(np.uint8)
    op = DecodeRandomResizedCrop(16, hflip=0.5)
    for seed in range(6):
        out = op({"image/encoded": _png(image)}, np.random.default_rng(seed))["image"]
        drawn = op.draw(90, 120, np.random.default_rng(seed))
        expected = arrays.resize(arrays.crop(image, drawn.box, is_mask=False), (16, 16),
                                 is_mask=False)
        if drawn.flip:
            expected = expected[:, ::-1]
        np.testing.assert_array_equal(out, expected)


def test_scale_denominators_are_scale_denominator_of_each_crop() -> None:
    from shardfeed.transforms.boxes import scale_denominator, scale_denominators

    rng = np.random.default_rng(9)
    h, w = rng.integers(1, 3000, 500), rng.integers(1, 3000, 500)
    for out, most in (((64, 48), 8), ((224, 224), 8), ((32, 40), 2), ((16, 16), 1)):
        got = scale_denominators(h, w, *out, max_denominator=most)
        assert got.tolist() == [scale_denominator(int(a), int(b), *out, max_denominator=most)
                                for a, b in zip(h, w)]
