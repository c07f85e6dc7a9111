"""The GPU decode as a batch stage that runs ahead: what a user sees is the stream of the CPU
path's boxes and flips, made on the device before the loop asks, with a state that counts
only the batches handed out, a close that stops the thread, and errors that name the batch.

On this machine the stage runs on nvImageCodec's CPU backend (``device="cpu"``); the test
marked ``cuda`` is the node's stress check (every image of >= 200 batches against the CPU
path's pixels of the same box)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import simplejpeg
import torch

import shardfeed
from shardfeed.dataset import Dataset
from shardfeed.format.writer import ShardWriter
from shardfeed.loaders import torch_decode
from shardfeed.loaders.device_resize import resize_boxes
from shardfeed.pipeline import Loader
from shardfeed.transforms import presets
from shardfeed.transforms.decode import region

pytestmark = pytest.mark.skipif(region.backend() is None,
                                reason="nvImageCodec (shardfeed[nvimgcodec]) is not installed")

SIZES = [(96, 128), (150, 200), (61, 83), (300, 260)]
# The device's pixels against the CPU path's for the same box and flip, mean |difference| per
# image (measured on the CPU backend, 80 images at size 40: median 0.68, largest 2.70 grey
# levels, the large ones where the CPU decoded a large box at a DCT scale); another box or
# flip is tens of levels off.
MEAN_TOLERANCE = 3.5


def _pixels(i: int, hw: tuple[int, int]) -> np.ndarray:
    noise = np.random.default_rng(i).integers(0, 256, (*hw, 3), dtype=np.uint8)
    return cv2.GaussianBlur(noise, (7, 7), 2.0)


def _write(folder: Path, count: int = 40) -> Dataset:
    folder.mkdir(parents=True, exist_ok=True)
    with ShardWriter(str(folder / "part-0.tfrecord")) as writer:
        for i in range(count):
            data = bytes(simplejpeg.encode_jpeg(_pixels(i, SIZES[i % len(SIZES)]), quality=92))
            writer.write_example({"image/encoded": data, "image/filename": f"i{i}.jpg".encode(),
                                  "image/class/label": i})
    return Dataset(str(folder))


def _loader(ds: Dataset, *, threads: int = 2, decode_on: str = "cuda", **preset: Any) -> Loader:
    return Loader(ds, batch_size=4, shuffle=True, seed=9, num_threads=threads,
                  transform=presets.train(size=preset.pop("size", 40), decode_on=decode_on,
                                          **preset))  # type: ignore[arg-type]


def _device(ds: Dataset, threads: int = 2, **options: Any) -> Any:
    return shardfeed.torch.adapt(_loader(ds, threads=threads), device="cpu", **options)


def _np(value: Any) -> np.ndarray:
    return value.cpu().numpy() if isinstance(value, torch.Tensor) else np.array(value)


def _images(loader: Any) -> list[np.ndarray]:
    with loader:
        return [_np(b["image"]) for b in loader]


class _Counting:
    """Counts the stage's calls (the batches made) from the run-ahead thread."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.made = 0
        self.threads: set[str] = set()
        real = torch_decode.DeviceDecode.__call__

        def counting(stage: Any, batch: Any, keys: Any) -> Any:
            out = real(stage, batch, keys)
            self.made += 1
            self.threads.add(threading.current_thread().name)
            return out

        monkeypatch.setattr(torch_decode.DeviceDecode, "__call__", counting)

    def settle(self, expected: int) -> int:
        deadline = time.monotonic() + 10
        while self.made < expected and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)  # time to overshoot the bound, if it were not kept
        return self.made


def test_batches_are_made_ahead_on_another_thread_within_the_bound(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    counting = _Counting(monkeypatch)
    with _device(_write(tmp_path / "d")) as loader:
        ahead = loader.decode.ahead_batches
        assert ahead >= 1
        iterator = iter(loader)
        for handed in range(1, 4):
            next(iterator)
            made = counting.settle(handed + ahead)
            # ahead of the caller, never more than `ahead` waiting plus the one being made
            assert handed + ahead <= made <= handed + ahead + 1, (handed, made)
        assert threading.current_thread().name not in counting.threads


def test_the_state_counts_only_batches_handed_out(tmp_path: Path) -> None:
    ds = _write(tmp_path / "d")
    whole = _images(_device(ds))
    for stop in (0, 1, 3, len(whole) - 1):
        with _device(ds) as loader:
            iterator = iter(loader)
            first = [_np(next(iterator)["image"]) for _ in range(stop)]
            time.sleep(0.1)  # the thread has made more by now
            state = json.loads(json.dumps(loader.state()))
            assert state["consumed"] == 4 * stop
        with _device(ds, threads=1) as loader:
            loader.restore(state)
            rest = _images(loader)
        for a, b in zip(whole, first + rest, strict=True):
            np.testing.assert_array_equal(a, b)


def test_breaking_out_and_iterating_again_loses_no_batch(tmp_path: Path) -> None:
    ds = _write(tmp_path / "d")
    whole = _images(_device(ds))
    with _device(ds) as loader:
        got = []
        for batch in loader:
            got.append(_np(batch["image"]))
            if len(got) == 2:
                break
        time.sleep(0.1)
        got += [_np(b["image"]) for b in loader]  # the rest of the epoch, made again
    for a, b in zip(whole, got, strict=True):
        np.testing.assert_array_equal(a, b)


def test_close_mid_epoch_stops_the_thread(tmp_path: Path) -> None:
    loader = _device(_write(tmp_path / "d"))
    next(iter(loader))
    loader.close()
    loader.close()  # idempotent
    assert not [t for t in threading.enumerate() if t.name == "shardfeed-run-ahead"]
    assert loader.decode.closed
    with pytest.raises(RuntimeError, match="closed"):
        next(iter(loader))


def test_an_error_in_the_thread_names_the_batch_after_the_batches_before_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ds = _write(tmp_path / "d")
    whole = _images(_device(ds))
    real = torch_decode.DeviceDecode._tail
    calls = {"n": 0}

    def failing_third(stage: Any, images: torch.Tensor) -> torch.Tensor:
        calls["n"] += 1
        if calls["n"] == 3:
            raise MemoryError("device out of memory (simulated)")
        return real(stage, images)

    monkeypatch.setattr(torch_decode.DeviceDecode, "_tail", failing_third)
    with _device(ds) as loader:
        got = []
        with pytest.raises(MemoryError) as caught:
            for batch in loader:
                got.append(_np(batch["image"]))
        assert len(got) == 2  # the two made before it reach the caller first
        assert any("batch 2 of the pass over epoch 0" in note
                   for note in getattr(caught.value, "__notes__", []))
        assert loader.state()["consumed"] == 8
        got += [_np(b["image"]) for b in loader]  # iterating again makes it again
    for a, b in zip(whole, got, strict=True):
        np.testing.assert_array_equal(a, b)


def test_pixels_are_the_cpu_paths_within_the_tolerance(tmp_path: Path) -> None:
    ds = _write(tmp_path / "d")
    cpu = _images(_loader(ds, decode_on="cpu"))
    for region_decode in (True, False):
        device = _images(_device(ds, region_decode=region_decode))
        for want, got in zip(cpu, device, strict=True):
            for a, b in zip(want.astype(np.int32), got.astype(np.int32), strict=True):
                same, mirrored = np.abs(a - b).mean(), np.abs(a - b[:, ::-1]).mean()
                assert same < MEAN_TOLERANCE, same
                assert mirrored > 2 * same + 3  # the same flip, not merely similar pixels


def test_the_streams_are_parsed_by_the_loaders_threads(tmp_path: Path) -> None:
    ds = _write(tmp_path / "d")
    with _device(ds) as adapted:
        assert adapted.transform.__iter__().__next__().streams == "region"
    plain = _loader(ds)
    with plain:
        batch = next(iter(plain))
        assert all(s is None for s in batch["plan/stream"])  # no stage asked for them


def test_resize_boxes_is_opencvs_resize_of_each_box() -> None:
    rng = np.random.default_rng(1)
    shapes = [(100, 130), (30, 20), (224, 224), (500, 375), (61, 83)]
    boxes = [cv2.GaussianBlur(rng.integers(0, 256, (*s, 3), dtype=np.uint8), (5, 5), 1.5)
             for s in shapes]
    flat = torch.cat([torch.from_numpy(b).reshape(-1, 3) for b in boxes])
    sizes = [h * w for h, w in shapes]
    origin = torch.tensor([0, *np.cumsum(sizes)[:-1]], dtype=torch.int64)
    hw = torch.tensor(shapes, dtype=torch.int64)
    flips = torch.tensor([False, True, False, True, True])
    for scratch in (1 << 10, 1 << 30):  # a row a chunk, and one chunk
        made = resize_boxes(flat, origin, hw[:, 1].clone(), hw, flips, (48, 56),
                            scratch_bytes=scratch).numpy()
        for k, box in enumerate(boxes):
            shrink = box.shape[0] > 48 and box.shape[1] > 56
            want = cv2.resize(box, (56, 48), interpolation=cv2.INTER_AREA if shrink
                              else cv2.INTER_LINEAR)
            want = want[:, ::-1] if flips[k] else want
            diff = np.abs(want.astype(np.int32) - made[k])
            assert diff.max() <= 1 and diff.mean() < 0.15, (box.shape, diff.mean())


def test_memory_budget_counts_the_stage(tmp_path: Path) -> None:
    with _device(_write(tmp_path / "d")) as loader:
        before = loader.memory_budget()
        next(iter(loader))
        after = loader.memory_budget()
    batch_out = 4 * 40 * 40 * 3
    ahead = loader.decode.ahead_batches
    # before a batch: the batches in flight and the whole scratch bound; after: what the
    # largest batch took (decoded boxes, scratch), never more than the bound said
    assert before.device_bytes >= (ahead + 2) * batch_out + loader.decode.scratch_bytes
    assert (ahead + 2) * batch_out < after.device_bytes <= before.device_bytes
    assert after.stage_bytes == after.device_bytes  # a CPU device: it is host memory


def test_jax_gets_the_same_batches_through_dlpack(tmp_path: Path) -> None:
    jax = pytest.importorskip("jax")
    ds = _write(tmp_path / "d")
    # the torch side on the device JAX decodes on (its default): a GPU's decoder and the CPU
    # backend round differently, the same decoder never does
    gpu = jax.devices()[0].platform == "gpu"
    if gpu and not torch.cuda.is_available():
        pytest.skip("JAX sees a GPU that torch does not")
    want = _images(shardfeed.torch.adapt(_loader(ds), device="cuda" if gpu else "cpu"))
    adapted = shardfeed.jax.adapt(_loader(ds))
    with adapted:
        batches = list(adapted)
    assert all(isinstance(b["image"], jax.Array) for b in batches)
    assert isinstance(batches[0]["image/class/label"], jax.Array)
    for a, b in zip(want, batches, strict=True):
        np.testing.assert_array_equal(a, np.asarray(b["image"]))


def test_the_planning_threads_are_bounded_with_thread_workers_only(tmp_path: Path) -> None:
    ds = _write(tmp_path / "d", count=16)
    with _device(ds, threads=6) as adapted:
        assert adapted.decode.slice_threads == 2
        next(iter(adapted))
        assert adapted.loader._gate.limit == 2  # six threads, two of them planning at once
    processes = Loader(ds, batch_size=4, num_threads=3, workers="processes",
                       transform=presets.train(size=40, decode_on="cuda"))
    with shardfeed.torch.adapt(processes, device="cpu") as adapted:
        assert adapted.decode.slice_threads == 3  # each process plans under its own GIL


# --- the node ---------------------------------------------------------------------------

@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU here")
def test_stress_on_the_gpu_every_image_is_the_cpu_paths(tmp_path: Path) -> None:
    """>= 200 batches on the GPU while the caller's stream is busy: every image against the
    CPU path's pixels of the same box; an image read while the decoder still wrote it (the
    nvJPEG hardware batch path, torchvision#9606) would be tens of levels off."""
    ds = _write(tmp_path / "d", count=64)
    epochs, batches = 13, 0  # 13 epochs x 16 batches = 208
    busy = torch.randn(2048, 2048, device="cuda")
    gpu = shardfeed.torch.adapt(_loader(ds, threads=4), device="cuda")
    cpu = _loader(ds, decode_on="cpu", threads=4)
    with gpu, cpu:
        for epoch in range(epochs):
            gpu.set_epoch(epoch)
            cpu.set_epoch(epoch)
            for made, want in zip(gpu, cpu, strict=True):
                for _ in range(4):
                    busy = busy @ busy / 2048  # the caller's own work on its stream
                got = made["image"].cpu().numpy().astype(np.int32)
                for a, b in zip(want["image"].astype(np.int32), got, strict=True):
                    same = np.abs(a - b).mean()
                    assert same < MEAN_TOLERANCE, (epoch, batches, same)
                    assert np.abs(a - b[:, ::-1]).mean() > 2 * same + 3
                batches += 1
    assert batches >= 200
    assert gpu.decode.whole_batches == 0  # the region decode did not fail (nvImageCodec#55)
