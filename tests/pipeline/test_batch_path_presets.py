"""The ready-made pipelines (``presets.train`` / ``presets.eval``) take the batch path: each
image drawn, decoded, cropped and flipped straight into its batch row. A user sees the very
batches the sample-by-sample path gives for the same seed, on any thread count, and bad
records are named or skipped exactly as before; a pipeline with a plain function in it keeps
going sample by sample."""

from __future__ import annotations

import io
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import simplejpeg
from PIL import Image
from pipeline_helpers import BAD_JPEG, assert_same_batches, record_ids

from shardfeed.dataset import Dataset
from shardfeed.errors import DecodeError
from shardfeed.format.writer import ShardWriter
from shardfeed.pipeline import Loader
from shardfeed.pipeline.produce import SliceBuilder
from shardfeed.sampling import crop_draws
from shardfeed.transforms import Compose, DecodeImage, boxes, presets
from shardfeed.transforms.base import Sample, Specs, TransformBase
from shardfeed.transforms.decode import crop_rows, native_rows
from shardfeed.transforms.decode.crop import DecodeCenterCrop, DecodeRandomResizedCrop

N = 40
SIZES = [(96, 128), (48, 64), (30, 20), (200, 150)]  # (height, width); the last > 2× crops


def _pixels(i: int, hw: tuple[int, int], channels: int) -> np.ndarray:
    rng = np.random.default_rng(i)
    noise = rng.integers(0, 256, (*hw, channels), dtype=np.uint8)
    # smooth enough that a JPEG keeps detail at every decode scale
    return cv2.GaussianBlur(noise, (5, 5), 1.5).reshape(*hw, channels)


def _encode(i: int, kind: str, hw: tuple[int, int]) -> bytes:
    if kind == "jpeg":
        return bytes(simplejpeg.encode_jpeg(_pixels(i, hw, 3), quality=90))
    if kind == "gray-jpeg":
        return bytes(simplejpeg.encode_jpeg(_pixels(i, hw, 1), quality=90, colorspace="GRAY"))
    if kind == "png":
        ok, buf = cv2.imencode(".png", _pixels(i, hw, 3))
    else:  # "rgba-png"
        ok, buf = cv2.imencode(".png", _pixels(i, hw, 4))
    assert ok
    return buf.tobytes()


def _write(folder: Path, kind: str, sizes: Sequence[tuple[int, int]], *,
           bad: Mapping[int, bytes] | None = None) -> Dataset:
    """``N`` records of ``kind`` images, record ``i`` of size ``sizes[i % len(sizes)]``."""
    folder.mkdir(parents=True, exist_ok=True)
    with ShardWriter(str(folder / "part-0.tfrecord")) as writer:
        for i in range(N):
            encoded = _encode(i, kind, sizes[i % len(sizes)])
            if bad and i in bad:
                encoded = bad[i]
            writer.write_example({"image/encoded": encoded, "label": [i % 7], "index": [i],
                                  "image/filename": f"{i}.jpg".encode()})
    return Dataset(str(folder))


def _batches(ds: Dataset, transform: Any, *, threads: int = 2, **options: Any) -> list[Any]:
    options.setdefault("batch_size", 8)
    with Loader(ds, shuffle=True, seed=5, transform=transform, num_threads=threads,
                **options) as loader:
        return [{k: np.array(v) if isinstance(v, np.ndarray) else list(v)
                 for k, v in batch.items()} for batch in loader]



def _sample_by_sample(transform: Any) -> Callable[[Sample, np.random.Generator], Sample]:
    """``transform`` behind a plain function: the Loader makes the batch sample by sample."""
    return lambda sample, rng: transform(sample, rng)


def _identity(sample: Sample, rng: np.random.Generator) -> Sample:
    return sample


PRESETS: dict[str, Callable[[], Any]] = {
    "train": lambda: presets.train(size=32),
    "eval": lambda: presets.eval(size=32),
    "train-jitter-chw": lambda: presets.train(size=24, color=1.0, normalize="imagenet",
                                              dtype="float32", layout="CHW"),
    "eval-float": lambda: presets.eval(size=24, dtype="float32"),
    # the decode ops on their own, with the options the presets leave out
    "gray-crop": lambda: Compose([DecodeRandomResizedCrop(20, hflip=0.5, channels="gray",
                                                          fast_upsample=False)]),
    "center-flip-full-decode": lambda: DecodeCenterCrop(20, hflip=0.5, reduced_decode=False),
}


@pytest.fixture()
def batch_path_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any slice made sample by sample fails the test."""

    def refuse(*args: Any, **kwargs: Any) -> int:
        raise AssertionError("a slice went sample by sample")

    monkeypatch.setattr(SliceBuilder, "build_samples", refuse)


def _count_sample_path(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    original = SliceBuilder.build_samples

    def counting(self: SliceBuilder, *args: Any, **kwargs: Any) -> int:
        calls.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(SliceBuilder, "build_samples", counting)
    return calls


@pytest.mark.parametrize("kind", ["jpeg", "gray-jpeg", "png", "rgba-png"])
@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_presets_give_the_sample_paths_batches(tmp_path: Path, kind: str, preset: str) -> None:
    ds = _write(tmp_path / kind, kind, SIZES)
    fast = _batches(ds, PRESETS[preset]())
    slow = _batches(ds, _sample_by_sample(PRESETS[preset]()))
    assert_same_batches(fast, slow)
    also_slow = _batches(ds, Compose([PRESETS[preset](), _identity]))
    assert_same_batches(fast, also_slow)
    assert sorted(record_ids(fast)) == list(range(N))
    assert fast[0]["image"].shape[0] == 8
    if preset.startswith("gray"):
        assert fast[0]["image"].shape == (8, 20, 20, 1)


@pytest.mark.parametrize("hw", SIZES)
def test_train_preset_on_images_of_one_size(tmp_path: Path, hw: tuple[int, int]) -> None:
    ds = _write(tmp_path / "one", "jpeg", [hw])
    fast = _batches(ds, presets.train(size=64), batch_size=16)
    slow = _batches(ds, _sample_by_sample(presets.train(size=64)), batch_size=16)
    assert_same_batches(fast, slow)
    assert fast[0]["image"].shape == (16, 64, 64, 3)


@pytest.mark.parametrize("preset", ["train", "train-jitter-chw"])
def test_same_bytes_on_1_2_4_threads(tmp_path: Path, preset: str) -> None:
    ds = _write(tmp_path / "t", "jpeg", SIZES)
    runs = [_batches(ds, PRESETS[preset](), threads=t) for t in (1, 2, 4)]
    assert_same_batches(runs[0], runs[1])
    assert_same_batches(runs[0], runs[2])
    assert_same_batches(runs[0], _batches(ds, _sample_by_sample(PRESETS[preset]()), threads=1))


def test_the_next_epoch_draws_new_crops_as_the_sample_path_does(tmp_path: Path) -> None:
    ds = _write(tmp_path / "e", "jpeg", SIZES)

    def two_epochs(transform: Any) -> list[Any]:
        with Loader(ds, batch_size=8, shuffle=True, seed=9, transform=transform,
                    num_threads=2) as loader:
            return [{k: np.array(v) for k, v in b.items()} for _ in range(2) for b in loader]

    fast = two_epochs(presets.train(size=32))
    assert_same_batches(fast, two_epochs(_sample_by_sample(presets.train(size=32))))
    first = {int(i): img for b in fast[:5] for i, img in zip(b["index"], b["image"])}
    second = {int(i): img for b in fast[5:] for i, img in zip(b["index"], b["image"])}
    assert any(not np.array_equal(first[i], second[i]) for i in first)


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_presets_take_the_batch_path(tmp_path: Path, preset: str,
                                     batch_path_only: None) -> None:
    ds = _write(tmp_path / "p", "jpeg", SIZES)
    batches = _batches(ds, PRESETS[preset]())
    assert sorted(record_ids(batches)) == list(range(N))


def test_a_plain_function_in_the_pipeline_goes_sample_by_sample(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ds = _write(tmp_path / "f", "png", SIZES[:1])
    calls = _count_sample_path(monkeypatch)
    seen: list[int] = []

    def count(sample: Sample, rng: np.random.Generator) -> Sample:
        seen.append(int(sample["index"][0]))
        return sample

    batches = _batches(ds, Compose([DecodeImage(), count]))
    assert calls  # slices went sample by sample, the function seeing every record
    assert set(seen) == set(range(N)) and sorted(record_ids(batches)) == list(range(N))
    calls.clear()
    _batches(ds, Compose([DecodeCenterCrop(16), count]))
    assert calls


class _Invert(TransformBase):
    """A user op that declares its batch form."""

    draws_random = False

    def __call__(self, sample: Sample, rng: np.random.Generator, /) -> Sample:
        sample["image"] = 255 - sample["image"]
        return sample

    def output_spec(self, specs: Specs) -> Specs:
        return dict(specs)

    def apply_batch(self, columns: dict[str, Any], rngs: Sequence[np.random.Generator] | None,
                    out: Mapping[str, np.ndarray]) -> dict[str, Any] | None:
        np.subtract(255, columns["image"], out=out["image"])
        return {**columns, "image": out["image"]}


def test_a_declared_user_op_keeps_the_batch_path(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    ds = _write(tmp_path / "d", "jpeg", SIZES)
    slow = _batches(ds, _sample_by_sample(Compose([presets.train(size=32), _Invert()])))
    calls = _count_sample_path(monkeypatch)
    fast = _batches(ds, Compose([presets.train(size=32), _Invert()]))
    assert not calls
    assert_same_batches(fast, slow)


@pytest.mark.parametrize("preset", ["train", "eval"])
def test_a_damaged_jpeg_is_named_or_skipped_exactly(tmp_path: Path, preset: str) -> None:
    good = _encode(0, "jpeg", (96, 128))
    bad = {13: BAD_JPEG, 27: good[: len(good) // 3]}  # no readable header; cut short
    ds = _write(tmp_path / "bad", "jpeg", SIZES, bad=bad)
    with pytest.raises(DecodeError, match=r"record (13|27) at byte \d+"):
        _batches(ds, PRESETS[preset]())
    fast = _batches(ds, PRESETS[preset](), on_error="skip", max_skipped=4)
    slow = _batches(ds, _sample_by_sample(PRESETS[preset]()), on_error="skip", max_skipped=4)
    assert_same_batches(fast, slow)
    assert 13 not in record_ids(fast) and 27 not in record_ids(fast)
    assert len(record_ids(fast)) == N


@pytest.mark.skipif(not crop_draws.compiled(), reason="the compiled draws are not built here")
@pytest.mark.parametrize(("preset", "generators"), [("train", 0), ("train-jitter-chw", N)])
def test_the_train_crops_of_a_slice_are_drawn_at_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, preset: str, generators: int) -> None:
    # No generator a row for the crop; one only where a later op (jitter) draws on from it.
    ds = _write(tmp_path / "d", "jpeg", SIZES)
    assert boxes.compiled_draws_agree()  # its once-a-process check is not counted below
    made: list[int] = []
    real = crop_draws.sample_rng

    def counting(*args: Any) -> np.random.Generator:
        made.append(1)
        return real(*args)

    monkeypatch.setattr(crop_draws, "sample_rng", counting)
    fast = _batches(ds, PRESETS[preset]())
    assert len(made) == generators
    monkeypatch.setattr(crop_draws, "_draws", None)  # a build without the compiled draws
    boxes.compiled_draws_agree.cache_clear()
    try:
        assert_same_batches(fast, _batches(ds, PRESETS[preset]()))
        assert len(made) == generators + N
    finally:
        boxes.compiled_draws_agree.cache_clear()


def _cmyk_jpeg() -> bytes:
    out = io.BytesIO()
    Image.fromarray(_pixels(3, (40, 50), 3)).convert("CMYK").save(out, "JPEG", quality=90)
    return out.getvalue()


@pytest.mark.parametrize("compiled", [True, False])
def test_mixed_rows_of_a_slice_give_the_sample_paths_batches(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, compiled: bool) -> None:
    # JPEGs of every size (read by the compiled frame reader, or without it), a CMYK JPEG, a
    # PNG and a grey JPEG among them: each row as the sample path makes it.
    others = {5: _cmyk_jpeg(), 9: _encode(9, "png", (30, 40)), 14: _encode(14, "gray-jpeg",
                                                                          (60, 40))}
    ds = _write(tmp_path / "mixed", "jpeg", SIZES, bad=others)
    if not compiled:
        monkeypatch.setattr(crop_rows, "_frames", None)
    for preset in ("train", "train-jitter-chw", "gray-crop"):
        fast = _batches(ds, PRESETS[preset]())
        slow = _batches(ds, _sample_by_sample(PRESETS[preset]()))
        assert_same_batches(fast, slow)


def test_small_images_do_not_load_the_region_decoder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[int] = []
    monkeypatch.setattr(crop_rows, "backend", lambda: asked.append(1))
    monkeypatch.setattr(native_rows, "compiled", None)  # the Python path asks for it
    ds = _write(tmp_path / "small", "jpeg", SIZES)  # all under REGION_MIN_PIXELS
    _batches(ds, PRESETS["train"]())
    assert not asked
    large = _write(tmp_path / "large", "jpeg", [(300, 260)])
    _batches(large, presets.train(size=160))  # no DCT scale: the region decode may pay
    assert asked


def _write_with_masks(folder: Path, mask: str) -> Dataset:
    """``N`` JPEG records of several sizes with a class-id mask each: ``"raw"`` (TensorFlow's
    guide layout: the mask's bytes and the image's ``height``/``width`` features) or
    ``"png"`` (an encoded mask)."""
    folder.mkdir(parents=True, exist_ok=True)
    with ShardWriter(str(folder / "part-0.tfrecord")) as writer:
        for i in range(N):
            h, w = SIZES[i % len(SIZES)]
            ids = ((np.arange(h)[:, None] // 3 + np.arange(w)[None, :] // 5 + i) % 6
                   ).astype(np.uint8)
            stored = ids.tobytes() if mask == "raw" else cv2.imencode(".png", ids)[1].tobytes()
            writer.write_example({"image_raw": _encode(i, "jpeg", (h, w)), "mask_raw": stored,
                                  "height": [h], "width": [w], "index": [i]})
    return Dataset(str(folder))


MASKS: dict[str, dict[str, Any]] = {
    "raw": {"key": "image_raw", "mask_key": "mask_raw", "mask_encoding": "raw",
            "mask_height_key": "height", "mask_width_key": "width"},
    "png": {"key": "image_raw", "mask_key": "mask_raw"},
}


@pytest.mark.parametrize(("mask", "extra"), [
    ("raw", {}), ("png", {}), ("png", {"keep_encoded": True}),
    ("raw", {"exif_orientation": "apply"})])
@pytest.mark.parametrize("preset", ["train", "eval"])
def test_images_with_masks_take_the_batch_path(tmp_path: Path, mask: str, extra: dict[str, Any],
                                               preset: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Each mask cropped, resized and flipped with its image's draws: the sample path's
    batches, with no slice made sample by sample."""
    ds = _write_with_masks(tmp_path / mask, mask)
    make = presets.train if preset == "train" else presets.eval
    slow = _batches(ds, _sample_by_sample(make(size=24, **MASKS[mask], **extra)))
    calls = _count_sample_path(monkeypatch)
    fast = _batches(ds, make(size=24, **MASKS[mask], **extra))
    assert not calls
    assert_same_batches(fast, slow)
    assert fast[0]["mask"].shape == (8, 24, 24)
    assert ("mask_raw" in fast[0]) == bool(extra.get("keep_encoded"))
    assert sorted(record_ids(fast)) == list(range(N))


def test_a_mask_of_the_wrong_size_is_named_as_before(tmp_path: Path) -> None:
    folder = tmp_path / "wrong"
    folder.mkdir()
    with ShardWriter(str(folder / "part-0.tfrecord")) as writer:
        for i in range(12):
            h, w = (40, 50) if i != 7 else (40, 51)  # record 7: its mask is one column wider
            ids = np.zeros((h, w), np.uint8)
            writer.write_example({"image_raw": _encode(i, "jpeg", (40, 50)),
                                  "mask_raw": cv2.imencode(".png", ids)[1].tobytes(),
                                  "index": [i]})
    with pytest.raises(Exception, match=r"record 7") as caught:
        _batches(Dataset(str(folder)), presets.train(size=16, **MASKS["png"]))
    assert "mask" in str(caught.value)
