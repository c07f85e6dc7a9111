"""A slice's JPEG crops made in one compiled call (``_jpeg_rows.c``) are the bytes of the
Python path (simplejpeg or nvImageCodec's region, ``cv2.resize``, ``cv2.flip``) for every kind
of JPEG a user stores, any box and both upsampling modes; every row it cannot make (cut
short, damaged, CMYK, another size than the table says, a box shrunk 2x both ways) is left to
the Python path, which names the record; and a loader gives the same batches with it and
without it, on 1 and 2 threads."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from PIL import Image
from transforms_helpers import jpeg_shard, train_batches

from shardfeed.dataset import Dataset
from shardfeed.errors import DecodeError
from shardfeed.pipeline import Loader
from shardfeed.transforms import presets
from shardfeed.transforms.boxes import Box, scale_denominator
from shardfeed.transforms.decode import native_rows

pytestmark = pytest.mark.skipif(native_rows.compiled is None,
                                reason="checked by test_native (built on every machine here)")
compiled: Any = native_rows.compiled
SAMPLINGS = (cv2.IMWRITE_JPEG_SAMPLING_FACTOR_444, cv2.IMWRITE_JPEG_SAMPLING_FACTOR_422,
             cv2.IMWRITE_JPEG_SAMPLING_FACTOR_420, cv2.IMWRITE_JPEG_SAMPLING_FACTOR_411,
             cv2.IMWRITE_JPEG_SAMPLING_FACTOR_440)


def _pixels(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 255 // max(w - 1, 1), y * 255 // max(h - 1, 1), (x + y) * 3 % 256],
                    axis=-1).astype(np.uint8)
    return cv2.add(base, rng.integers(0, 60, (h, w, 3), dtype=np.uint8))


def _jpeg(rng: np.random.Generator, h: int, w: int) -> bytes:
    """A JPEG of a kind drawn at random: subsampling, quality, progressive, restart markers,
    grey."""
    flags = [cv2.IMWRITE_JPEG_QUALITY, int(rng.integers(50, 100)),
             cv2.IMWRITE_JPEG_SAMPLING_FACTOR, int(rng.choice(SAMPLINGS))]
    if rng.random() < 0.3:
        flags += [cv2.IMWRITE_JPEG_PROGRESSIVE, 1]
    if rng.random() < 0.3:
        flags += [cv2.IMWRITE_JPEG_RST_INTERVAL, int(rng.integers(1, 8))]
    pixels = _pixels(rng, h, w)
    if rng.random() < 0.15:
        pixels = cv2.cvtColor(pixels, cv2.COLOR_RGB2GRAY)
    ok, data = cv2.imencode(".jpg", pixels, flags)
    assert ok
    return data.tobytes()


def _crop_op(size: tuple[int, int], fast_upsample: bool) -> Any:
    preset = presets.train(size=size, fast_upsample=fast_upsample)
    return next(part for part in preset.transforms if hasattr(part, "_jpeg_crop"))


def _reference(op: Any, data: bytes, row: tuple[int, ...]) -> np.ndarray:
    height, width, y, x, h, w, flip = row
    return np.array(op._jpeg_crop(data, Box(y, x, h, w), height, width, "test", bool(flip),
                                  None))


def _scale(op: Any, row: tuple[int, ...]) -> int:
    """The DCT scale the op decodes ``row``'s box at."""
    return scale_denominator(row[4], row[5], *op.size, max_denominator=op.max_denominator)


def _call(op: Any, values: list[bytes], rows: list[tuple[int, ...]]
          ) -> tuple[bytes, np.ndarray]:
    out_h, out_w = op.size
    out = np.zeros((len(values), out_h, out_w, 3), np.uint8)
    table = np.array([(k, *row, 1, _scale(op, row)) for k, row in enumerate(rows)],
                     dtype=np.int64).reshape(-1, 10)
    return compiled.crop_rows(values, table, out, out_h, out_w, op.fast_dct,
                              op.fast_upsample), out


def test_the_resize_is_opencvs_linear_resize() -> None:
    """Any sizes up and down (not 2x or more both ways: OpenCV resizes that by area), source
    rows of any stride, flipped or not."""
    rng = np.random.default_rng(7)
    for _ in range(600):
        oh, ow = (int(v) for v in rng.integers(1, 260, 2))
        h, w = int(rng.integers(1, 2 * oh + 3)), int(rng.integers(1, 2 * ow + 3))
        if h >= 2 * oh and w >= 2 * ow:
            continue
        big = rng.integers(0, 256, (h + 3, w + 5, 3), dtype=np.uint8)
        src = big[1:1 + h, 2:2 + w]
        flip = bool(rng.random() < 0.5)
        expected = cv2.resize(src, (ow, oh), interpolation=cv2.INTER_LINEAR)
        if flip:
            expected = cv2.flip(expected, 1)
        got = np.empty((oh, ow, 3), np.uint8)
        compiled.resize(src, got, oh, ow, flip)
        assert got.tobytes() == expected.tobytes(), ((h, w), (oh, ow), flip)


@pytest.mark.parametrize("fast_upsample", [True, False])
def test_crops_are_the_python_paths_bytes(fast_upsample: bool) -> None:
    rng = np.random.default_rng(11 + fast_upsample)
    for _ in range(12):
        size = (int(rng.integers(16, 120)), int(rng.integers(16, 120)))
        op = _crop_op(size, fast_upsample)
        values, rows = [], []
        for _ in range(8):
            height, width = (int(v) for v in rng.integers(8, 260, 2))
            y, x = int(rng.integers(0, height)), int(rng.integers(0, width))
            h, w = int(rng.integers(1, height - y + 1)), int(rng.integers(1, width - x + 1))
            values.append(_jpeg(rng, height, width))
            rows.append((height, width, y, x, h, w, int(rng.integers(0, 2))))
        flags, out = _call(op, values, rows)
        for k, row in enumerate(rows):
            d = _scale(op, row)  # 1, or a scaled decode sampled by the scaled warp
            shrunk = row[4] >= 2 * d * size[0] and row[5] >= 2 * d * size[1]
            assert flags[k] == (0 if shrunk else 1), row  # the rest: every row it takes
            if flags[k]:
                assert out[k].tobytes() == _reference(op, values[k], row).tobytes(), row


@pytest.mark.parametrize("fast_upsample", [True, False])
def test_crops_at_a_dct_scale_are_the_python_paths_bytes(fast_upsample: bool) -> None:
    """Boxes 2x the output or more, decoded at 1/2, 1/4 and 1/8 (the rows and columns the
    scaled warp reads) and sampled, for every kind of JPEG: the Python path's bytes."""
    rng = np.random.default_rng(21 + fast_upsample)
    scales: set[int] = set()
    for _ in range(10):
        size = (int(rng.integers(8, 40)), int(rng.integers(8, 40)))
        op = _crop_op(size, fast_upsample)
        values, rows = [], []
        for _ in range(8):
            height, width = int(rng.integers(2 * size[0], 340)), int(rng.integers(2 * size[1], 340))
            h = int(rng.integers(2 * size[0], height + 1))
            w = int(rng.integers(2 * size[1], width + 1))
            y, x = int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1))
            values.append(_jpeg(rng, height, width))
            rows.append((height, width, y, x, h, w, int(rng.integers(0, 2))))
        flags, out = _call(op, values, rows)
        for k, row in enumerate(rows):
            d = _scale(op, row)
            if row[4] >= 2 * d * size[0] and row[5] >= 2 * d * size[1]:
                assert flags[k] == 0, row  # resized by area: the Python path's
                continue
            scales.add(d)
            assert flags[k] == 1, row
            assert out[k].tobytes() == _reference(op, values[k], row).tobytes(), (row, d)
    assert scales == {2, 4, 8}


def _cmyk_jpeg() -> bytes:
    buffer = io.BytesIO()
    Image.new("CMYK", (40, 30), (10, 200, 30, 5)).save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def test_rows_it_cannot_make_are_left_to_the_python_path() -> None:
    rng = np.random.default_rng(3)
    op = _crop_op((32, 32), True)
    good = _jpeg(rng, 60, 80)
    png = cv2.imencode(".png", _pixels(rng, 60, 80))[1].tobytes()
    middle = bytearray(good)
    middle[len(good) // 2: len(good) // 2 + 40] = b"\xff\xd0" * 20  # restart markers amid data
    cases = {
        "cut short": (good[: len(good) // 2], (60, 80, 0, 0, 30, 40, 0)),
        "no end marker": (good[:-2], (60, 80, 0, 0, 30, 40, 0)),
        "damaged data": (bytes(middle), (60, 80, 0, 0, 60, 80, 0)),
        "another size": (good, (61, 80, 0, 0, 30, 40, 0)),
        "box outside": (good, (60, 80, 40, 0, 30, 40, 0)),
        "shrunk 2x both ways": (good, (60, 80, 0, 0, 64, 70, 0)),
        "2x both ways at 1/8": (_jpeg(rng, 520, 530), (520, 530, 0, 0, 520, 530, 0)),
        "CMYK": (_cmyk_jpeg(), (30, 40, 0, 0, 30, 40, 0)),
        "PNG": (png, (60, 80, 0, 0, 30, 40, 0)),
        "empty": (b"", (60, 80, 0, 0, 30, 40, 0)),
    }
    flags, out = _call(op, [v for v, _ in cases.values()], [r for _, r in cases.values()])
    assert list(flags) == [0] * len(cases), dict(zip(cases, flags))
    assert not out.any()  # nothing written into a row it left
    flags, _ = _call(op, [good], [(60, 80, 0, 0, 30, 40, 0)])
    assert list(flags) == [1]


def test_a_damaged_byte_never_gives_other_bytes() -> None:
    """Where the call makes a row of a damaged JPEG, the Python path makes the very same
    pixels (it never hands back what simplejpeg refuses, nor other garbage)."""
    rng = np.random.default_rng(8)
    op = _crop_op((40, 40), True)
    clean = _jpeg(rng, 90, 120)
    values, rows = [], []
    for _ in range(48):
        data = bytearray(clean)
        at = int(rng.integers(2, len(data) - 2))
        data[at] = int(rng.integers(0, 256))
        values.append(bytes(data))
        rows.append((90, 120, 10, 5, 70, 100, 0))
    flags, out = _call(op, values, rows)
    made = 0
    for k, (data, row) in enumerate(zip(values, rows)):
        if flags[k]:
            made += 1
            assert out[k].tobytes() == _reference(op, data, row).tobytes()
    assert made > 0


def _dataset(folder: Path, count: int, damaged: int | None = None) -> Dataset:
    rng = np.random.default_rng(5)
    dataset: Dataset = jpeg_shard(
        folder, count, lambda i: _jpeg(rng, 180 + 13 * (i % 5), 240 - 11 * (i % 4)),
        damaged=damaged)
    return dataset


def test_a_loader_gives_the_same_batches_with_it_and_without(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ds = _dataset(tmp_path / "d", 32)
    made: list[int] = []
    original = compiled.crop_rows

    class Counting:
        @staticmethod
        def crop_rows(*args: Any) -> bytes:
            flags = original(*args)
            made.append(sum(flags))
            return flags

    monkeypatch.setattr(native_rows, "compiled", Counting)
    with_it = {t: train_batches(ds, num_threads=t) for t in (1, 2)}
    assert sum(made) > 32, "the compiled call made no rows"
    monkeypatch.setattr(native_rows, "compiled", None)
    without = train_batches(ds, num_threads=2)
    for images in with_it.values():
        assert len(images) == len(without) == 8
        for a, b in zip(images, without):
            assert a.tobytes() == b.tobytes()


def test_a_jpeg_it_leaves_is_still_named(tmp_path: Path) -> None:
    ds = _dataset(tmp_path / "d", 16, damaged=5)
    with pytest.raises(DecodeError, match=r"record 5 at byte \d+"):
        train_batches(ds, num_threads=2)
    with Loader(ds, batch_size=8, seed=4, transform=presets.train(size=96), num_threads=2,
                on_error="skip") as ld:
        assert sum(len(b["image"]) for b in ld) == 16  # replaced, as the Python path does


def test_a_call_that_gives_other_pixels_is_not_used(monkeypatch: pytest.MonkeyPatch,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    """Built against another libjpeg, the call would give other bytes: the once-a-process
    check finds it, says so, and every crop goes the Python path."""

    class OtherLibjpeg:
        @staticmethod
        def crop_rows(values: Any, table: Any, out: Any, *args: Any) -> bytes:
            out[...] = 7
            return bytes([1] * len(table))

    monkeypatch.setattr(native_rows, "compiled", OtherLibjpeg)
    monkeypatch.setattr(native_rows, "_checked", [])
    with caplog.at_level("WARNING"):
        assert not native_rows.agrees()
    assert "crops are made by the Python path" in caplog.text
    op = _crop_op((32, 32), True)
    image_out = np.zeros((1, 32, 32, 3), np.uint8)
    data = _jpeg(np.random.default_rng(1), 60, 80)
    drawn = native_rows.drawn_rows([(60, 80, 0, 0, 40, 50, 0)], op.size, max_denominator=8)
    assert drawn is not None
    assert native_rows.native_rows_into([data], drawn, image_out, None, size=op.size,
                                        fast_dct=True, fast_upsample=True) == 0
    assert not image_out.any()


def test_a_scaled_decode_that_differs_leaves_only_the_scaled_rows(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Where only the DCT-scaled decode gives other pixels here, the rows decoded at full
    scale are still made by the call, the scaled ones by the Python path."""
    monkeypatch.setattr(native_rows, "_checked", [True, False])
    op = _crop_op((32, 32), True)
    data = _jpeg(np.random.default_rng(1), 150, 160)
    rows = [(150, 160, 0, 0, 40, 50, 0), (150, 160, 3, 4, 90, 100, 1)]  # d 1, d 2
    image_out = np.zeros((2, 32, 32, 3), np.uint8)
    drawn = native_rows.drawn_rows(list(rows), op.size, max_denominator=8)
    assert drawn is not None
    made = native_rows.native_rows_into([data, data], drawn, image_out, None, size=op.size,
                                        fast_dct=True, fast_upsample=True)
    assert made == 0b01
    assert image_out[0].tobytes() == _reference(op, data, rows[0]).tobytes()
    assert not image_out[1].any()
    monkeypatch.setattr(native_rows, "_checked", [True, True])
    assert native_rows.native_rows_into([data, data], drawn, image_out, None, size=op.size,
                                        fast_dct=True, fast_upsample=True) == 0b11
    assert image_out[1].tobytes() == _reference(op, data, rows[1]).tobytes()
