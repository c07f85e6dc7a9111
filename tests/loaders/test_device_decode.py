"""Decoding on the device (``presets.train(..., decode_on="cuda")`` + ``shardfeed.torch.adapt``):
the loader's threads draw each crop and flip and hand the JPEG on; the adapter decodes,
resizes, flips and normalises a batch at a time. A user sees the crops and flips of the CPU
path for the same seed, pixels within a grey level of it, and the CPU path's very pixels for
images the device decoder does not take (PNG, CMYK, a box it refuses).

Without a GPU the same device half runs on nvImageCodec's CPU backend (``device="cpu"``);
the tests marked ``cuda`` run it on the GPU where there is one."""

from __future__ import annotations

import io
import struct
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import simplejpeg
import torch
from PIL import Image

import shardfeed
from shardfeed.dataset import Dataset
from shardfeed.errors import DecodeError
from shardfeed.format.writer import ShardWriter
from shardfeed.pipeline import Loader
from shardfeed.transforms import presets
from shardfeed.transforms.decode import region
from shardfeed.transforms.decode.device_plan import DevicePlan, decode_planned

pytestmark = pytest.mark.skipif(region.backend() is None,
                                reason="nvImageCodec (shardfeed[nvimgcodec]) is not installed")

N = 36
SIZES = [(96, 128), (150, 200), (61, 83), (300, 260)]


def _pixels(i: int, hw: tuple[int, int]) -> np.ndarray:
    noise = np.random.default_rng(i).integers(0, 256, (*hw, 3), dtype=np.uint8)
    return cv2.GaussianBlur(noise, (7, 7), 2.0)


def _cmyk(i: int) -> bytes:
    out = io.BytesIO()
    Image.fromarray(_pixels(i, (40, 50))).convert("CMYK").save(out, "JPEG", quality=90)
    return out.getvalue()


def _write(folder: Path, others: dict[int, bytes] | None = None) -> Dataset:
    folder.mkdir(parents=True, exist_ok=True)
    with ShardWriter(str(folder / "part-0.tfrecord")) as writer:
        for i in range(N):
            data = bytes(simplejpeg.encode_jpeg(_pixels(i, SIZES[i % len(SIZES)]), quality=92))
            writer.write_example({"image/encoded": (others or {}).get(i, data),
                                  "image/filename": f"img{i:03d}.jpg".encode(),
                                  "image/class/label": i})
    return Dataset(str(folder))


def _cpu_batches(ds: Dataset, **preset: Any) -> list[dict[str, Any]]:
    with Loader(ds, batch_size=8, shuffle=True, seed=4, num_threads=2,
                transform=presets.train(**preset)) as loader:
        return [{k: np.array(v) for k, v in b.items() if isinstance(v, np.ndarray)}
                for b in loader]


def _device_loader(ds: Dataset, device: str, threads: int = 2, **preset: Any) -> Any:
    loader = Loader(ds, batch_size=8, shuffle=True, seed=4, num_threads=threads,
                    transform=presets.train(decode_on="cuda", **preset))
    return shardfeed.torch.adapt(loader, device=device)


def _device_images(ds: Dataset, device: str, **preset: Any) -> list[np.ndarray]:
    with _device_loader(ds, device, **preset) as loader:
        return [b["image"].cpu().numpy() for b in loader]


def _check_same_crops_and_flips(cpu: list[dict[str, Any]], device: list[np.ndarray]) -> None:
    for want, got in zip(cpu, device, strict=True):
        a, b = want["image"].astype(np.int32), got.astype(np.int32)
        assert a.shape == b.shape
        for row in range(len(a)):
            same = np.abs(a[row] - b[row]).mean()
            mirrored = np.abs(a[row] - b[row][:, ::-1]).mean()
            # the same box, resized on another device (a few levels where the CPU path decoded
            # at a DCT scale), and the same flip: another box or flip is tens of levels off
            assert same < 3.5, (row, same)
            assert mirrored > 2 * same + 3, (row, same, mirrored)


def test_device_batches_have_the_cpu_paths_crops_and_flips(tmp_path: Path) -> None:
    ds = _write(tmp_path / "d")
    _check_same_crops_and_flips(_cpu_batches(ds, size=48), _device_images(ds, "cpu", size=48))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU here")
def test_on_the_gpu_the_crops_and_flips_are_the_cpu_paths(tmp_path: Path) -> None:
    ds = _write(tmp_path / "d", {5: _cmyk(5)})
    with _device_loader(ds, "cuda", size=48) as loader:
        batches = list(loader)
    assert all(b["image"].device.type == "cuda" for b in batches)
    _check_same_crops_and_flips(_cpu_batches(ds, size=48),
                                [b["image"].cpu().numpy() for b in batches])


def test_the_plans_draws_are_the_cpu_paths_exactly(tmp_path: Path) -> None:
    # The CPU's own pixel work on the plan's boxes and flips gives the CPU path's bytes: the
    # boxes and flips are the same, not merely close.
    ds = _write(tmp_path / "d", {5: _cmyk(5), 11: _cmyk(11)})
    cpu = _cpu_batches(ds, size=40)
    for threads in (1, 2, 4):
        with Loader(ds, batch_size=8, shuffle=True, seed=4, num_threads=threads,
                    transform=presets.train(size=40, decode_on="cuda")) as loader:
            plan = loader.transform.__iter__().__next__()
            assert isinstance(plan, DevicePlan)
            for want, got in zip(cpu, loader, strict=True):
                made = np.array(got["image"])
                for row in np.flatnonzero(got["plan/on_cpu"] == 0):
                    decode_planned(plan, got["plan/encoded"][row], got["plan/box"][row],
                                   got["plan/image_hw"][row], bool(got["plan/flip"][row]),
                                   made[row])
                np.testing.assert_array_equal(made, want["image"])


def test_images_the_device_does_not_take_are_the_cpu_paths_pixels(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, png = cv2.imencode(".png", _pixels(9, (50, 40)))
    ds = _write(tmp_path / "d", {5: _cmyk(5), 9: png.tobytes()})
    cpu = _cpu_batches(ds, size=40)
    refused_every_third = {"n": 0}
    real_decode = shardfeed.loaders.torch_decode.DeviceDecode._decode

    def refusing(self: Any, streams: list[Any]) -> list[Any]:
        out = real_decode(self, streams)
        refused_every_third["n"] += len(out)
        return [None if i % 3 == 0 else t for i, t in enumerate(out)]

    monkeypatch.setattr(shardfeed.loaders.torch_decode.DeviceDecode, "_decode", refusing)
    with _device_loader(ds, "cpu", size=40) as loader:
        for want, got in zip(cpu, loader, strict=True):
            image = got["image"].numpy()
            exact = [row for row in range(len(image))
                     if np.array_equal(image[row], want["image"][row])]
            assert len(exact) >= len(image) // 3  # refused rows and PNG/CMYK: bit-exact
        assert loader.decode.fallbacks >= refused_every_third["n"] // 3


def test_a_jpeg_damaged_past_its_header_is_named(tmp_path: Path) -> None:
    good = bytes(simplejpeg.encode_jpeg(_pixels(3, (96, 128)), quality=92))
    damaged = good[:200] + bytes(len(good) - 202) + good[-2:]  # header intact, scan zeroed
    ds = _write(tmp_path / "d", {3: damaged})
    with _device_loader(ds, "cpu", size=40) as loader, pytest.raises(DecodeError) as caught:
        for _ in loader:
            pass
    assert "img003.jpg" in str(caught.value) or "record 3" in str(caught.value)


@pytest.mark.parametrize("threads", [1, 2])
def test_a_jpeg_cut_short_is_named_by_its_record(tmp_path: Path, threads: int) -> None:
    good = bytes(simplejpeg.encode_jpeg(_pixels(7, (96, 128)), quality=92))
    ds = _write(tmp_path / "d", {7: good[: len(good) * 2 // 3]})
    with _device_loader(ds, "cpu", threads=threads, size=40) as loader, \
            pytest.raises(DecodeError, match=r"record 7 at byte \d+"):
        for _ in loader:
            pass


def test_normalised_channels_first_floats(tmp_path: Path) -> None:
    ds = _write(tmp_path / "d")
    options = {"size": 32, "normalize": "imagenet", "dtype": "float32", "layout": "CHW"}
    cpu = _cpu_batches(ds, **options)
    with _device_loader(ds, "cpu", **options) as loader:
        for want, got in zip(cpu, loader, strict=True):
            assert got["image"].dtype == torch.float32
            assert tuple(got["image"].shape) == want["image"].shape
            assert want["image"].shape[1:] == (3, 32, 32)
            assert np.abs(got["image"].numpy() - want["image"]).mean() < 0.06  # ~3.5 levels
            assert "plan/encoded" not in got
            assert torch.equal(got["image/class/label"], torch.from_numpy(want["image/class/label"]))


def test_the_one_argument_and_its_errors(tmp_path: Path) -> None:
    ds = _write(tmp_path / "d")
    with pytest.raises(ValueError, match="decode_on must be"):
        presets.train(size=32, decode_on="gpu")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="colour jitter is not applied on the GPU"):
        presets.train(size=32, color=1.0, decode_on="cuda")
    loader = Loader(ds, batch_size=8, transform=presets.eval(size=32, decode_on="cuda"))
    with pytest.raises(ValueError, match="pass device='cuda'"):
        shardfeed.torch.adapt(loader)
    adapted = shardfeed.torch.adapt(loader, device="cpu")
    assert adapted.memory_budget().device_bytes >= 2 * 8 * 32 * 32 * 3
    batches = [b["image"].numpy() for b in adapted]
    assert sum(len(b) for b in batches) == N
    adapted.close()


def test_resume_through_the_device_adapter(tmp_path: Path) -> None:
    ds = _write(tmp_path / "d")
    with _device_loader(ds, "cpu", size=32) as loader:
        whole = [b["image"].numpy() for b in loader]
    with _device_loader(ds, "cpu", size=32) as loader:
        iterator = iter(loader)
        first = [next(iterator)["image"].numpy() for _ in range(2)]
        state = loader.state()
    with _device_loader(ds, "cpu", threads=1, size=32) as loader:
        loader.restore(state)
        rest = [b["image"].numpy() for b in loader]
    for a, b in zip(whole, first + rest, strict=True):
        np.testing.assert_array_equal(a, b)


# --- EXIF orientation: one policy on the device too -----------------------------------------

TURNS = (2, 3, 6, 8)


def _plain(i: int) -> bytes:
    return bytes(simplejpeg.encode_jpeg(_pixels(i, SIZES[i % len(SIZES)]), quality=92))


def _with_orientation(jpeg: bytes, orientation: int) -> bytes:
    """``jpeg`` with a camera's APP1 Exif segment (big-endian TIFF, IFD0 Orientation)."""
    entry = struct.pack(">HHIHH", 0x0112, 3, 1, orientation, 0)
    body = b"Exif\x00\x00MM" + struct.pack(">HIH", 42, 8, 1) + entry + struct.pack(">I", 0)
    return jpeg[:2] + b"\xff\xe1" + struct.pack(">H", len(body) + 2) + body + jpeg[2:]


def _tagged(folder: Path) -> Dataset:
    return _write(folder, {i: _with_orientation(_plain(i), TURNS[i % 4]) for i in range(N)})


def test_the_device_decoder_is_told_to_keep_the_stored_pixels(tmp_path: Path) -> None:
    """nvImageCodec turns a tagged JPEG unless told not to: the adapter's decode parameters
    say not to, whatever the plan."""
    ds = _write(tmp_path / "d")
    for option in ("ignore", "apply"):
        loader = Loader(ds, batch_size=8, transform=presets.train(
            size=32, decode_on="cuda", exif_orientation=option))  # type: ignore[arg-type]
        with shardfeed.torch.adapt(loader, device="cpu") as adapted:
            assert adapted.decode.params.apply_exif_orientation is False
    assert region.backend().DecodeParams().apply_exif_orientation is True  # its default


@pytest.mark.parametrize("size", [48, 120])
def test_a_tagged_photo_gives_the_stripped_photos_batches_on_the_device(
        tmp_path: Path, size: int) -> None:
    stripped, tagged = _write(tmp_path / "s"), _tagged(tmp_path / "t")
    with _device_loader(tagged, "cpu", size=size) as loader:
        got = [b["image"].numpy() for b in loader]
        assert loader.decode.fallbacks == 0  # 6 and 8 were refused by the turning decoder
    for a, b in zip(got, _device_images(stripped, "cpu", size=size), strict=True):
        np.testing.assert_array_equal(a, b)


def test_with_the_tag_applied_tagged_rows_are_the_cpu_paths(tmp_path: Path) -> None:
    """``exif_orientation="apply"``: a tagged JPEG is turned by the CPU half (its box drawn in
    the turned image), so its row holds the CPU path's very pixels."""
    ds = _tagged(tmp_path / "t")
    cpu = _cpu_batches(ds, size=40, exif_orientation="apply")
    with _device_loader(ds, "cpu", size=40, exif_orientation="apply") as loader:
        for want, got in zip(cpu, loader, strict=True):
            np.testing.assert_array_equal(got["image"].numpy(), want["image"])
    stored = _cpu_batches(ds, size=40)
    assert any(np.abs(a["image"].astype(int) - b["image"]).mean() > 10
               for a, b in zip(cpu, stored, strict=True))  # the tag did turn them


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU here")
def test_on_the_gpu_a_tagged_photo_gives_the_stripped_photos_batches(tmp_path: Path) -> None:
    stripped, tagged = _write(tmp_path / "s"), _tagged(tmp_path / "t")
    with _device_loader(tagged, "cuda", size=48) as loader:
        got = [b["image"].cpu().numpy() for b in loader]
    want = [b["image"].cpu().numpy() for b in _iterate(_device_loader(stripped, "cuda",
                                                                       size=48))]
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)
    cpu = _cpu_batches(tagged, size=48, exif_orientation="apply")
    with _device_loader(tagged, "cuda", size=48, exif_orientation="apply") as loader:
        for rows, made in zip(cpu, loader, strict=True):
            np.testing.assert_array_equal(made["image"].cpu().numpy(), rows["image"])


def _iterate(loader: Any) -> list[dict[str, Any]]:
    with loader:
        return list(loader)
