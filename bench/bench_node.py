"""The node bench: one run on a training node (many cores, one GPU) that prints one table.

Generates its data on the machine (nothing to download), then measures, in one process:

- ``decode``: full decode (simplejpeg, default settings) of the 500x375 JPEGs, bytes in
  memory, at 1 and N threads: the CPU decode limit;
- ``train``: ``Loader(presets.train(224))``, batch B, at 1/4/8/N threads as shipped, and
  ``train-held`` the same with every thread held (``Loader(adaptive_threads=False)``; in
  versions without it, the slice gate held by hand);
- ``torch-pil``: torch ``DataLoader`` over the same files as .jpg, N workers, PIL decode +
  RandomResizedCrop + flip (torchvision's v2 transforms where torchvision is installed, else
  the same box rule written with PIL and NumPy; the table says which);
- ``png28``: 28x28 grey PNG records packed from arrays, ``DecodeImage(channels="gray")``, at
  1 and N threads (and held); ``patches``: ``Patches(size=32, cache_images=64,
  refresh_every=100)`` over 1566x1566 JPEGs, at 1 and N threads (and held);
- ``gpu-train``: ``presets.train(224, decode_on="cuda")`` + ``shardfeed.torch.adapt(...,
  device="cuda")`` at 8 and N threads, against ``nvimgcodec-whole`` / ``nvimgcodec-region``:
  nvImageCodec's batched decode into GPU memory of the same files, whole or the preset's own
  boxes (drawn by the loader's CPU half), code streams made before the clock starts;
- ``gpu-overlap``: the GPU path while a training stream runs matrix products that take about
  one batch's decode, ending each step on the product (as ``loss.item()`` does); ``overlap``
  = (t_decode + t_train - t_both) / min(t_decode, t_train): 1 when the decode hides under
  training, 0 when the two run one after the other;
- the host's RSS (sampled, the process's whole) and the GPU's used memory (device-wide) at
  their peak during each case, and both peaks over the run.

Each case has its own budget: a warm-up, then ``repeats`` windows of ``window_s`` seconds or
``max_batches`` batches, whichever comes first; the table gives the median window's rate.
Loaders keep running across windows (the shipped thread choice is measured as it settles).
A case whose dependency is missing (no CUDA, no nvImageCodec, no torch), or that is reached
after the run's deadline, says ``skipped: <why>`` in its row; nothing else stops the run.

    python bench/bench_node.py [--out node.json] [--threads N] [--data DIR]   # node: < 5 min
    python bench/bench_node.py --quick       # every case, small: a few minutes on 2 cores
    python bench/bench_node.py --quick --tiny   # seconds: checks that every case still runs

``--device cpu`` runs the nvImageCodec rows and the GPU path on nvImageCodec's CPU backend (a
check that the code runs, not a figure); the overlap case needs CUDA.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import resource
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np

JPEG_W, JPEG_H = 500, 375
TRAIN_SIZE = 224


@dataclass(frozen=True)
class Sizes:
    """How much data and time each case gets."""

    jpegs: int
    pngs: int
    big_images: int
    big_side: int
    cache_images: int
    refresh_every: int
    batch: int
    patch_batch: int
    warmup_batches: int
    repeats: int
    window_s: float
    max_batches: int
    deadline_s: float

    @classmethod
    def node(cls) -> Sizes:
        return cls(jpegs=8000, pngs=60_000, big_images=200, big_side=1566, cache_images=64,
                   refresh_every=100, batch=256, patch_batch=256, warmup_batches=3, repeats=3,
                   window_s=2.0, max_batches=60, deadline_s=270.0)

    @classmethod
    def quick(cls) -> Sizes:
        return cls(jpegs=768, pngs=8192, big_images=72, big_side=1566, cache_images=64,
                   refresh_every=100, batch=64, patch_batch=256, warmup_batches=2, repeats=3,
                   window_s=0.6, max_batches=12, deadline_s=170.0)

    @classmethod
    def tiny(cls) -> Sizes:
        return cls(jpegs=48, pngs=512, big_images=6, big_side=392, cache_images=3,
                   refresh_every=10, batch=16, patch_batch=32, warmup_batches=1, repeats=1,
                   window_s=0.05, max_batches=1, deadline_s=120.0)


class Skip(Exception):
    """A case that cannot run here; the message says why."""


@dataclass
class Row:
    """One line of the table."""

    case: str
    threads: int | None
    what: str
    rates: list[float] = field(default_factory=list)
    unit: str = "img/s"
    note: str = ""
    skipped: str | None = None
    rss_mib: float | None = None
    gpu_mib: float | None = None
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return self.case if self.threads is None else f"{self.case}@{self.threads}"

    @property
    def rate(self) -> float | None:
        return statistics.median(self.rates) if self.rates else None


# -- memory sampling ----------------------------------------------------------------------------


class Peaks:
    """Samples the process's RSS and the GPU's used memory every 20 ms, keeping the peak
    since the last :meth:`reset` and over the whole run."""

    def __init__(self, gpu: bool) -> None:
        self.gpu = gpu
        self.rss = self.run_rss = 0
        self.gpu_used = self.run_gpu = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        while not self._stop.wait(0.02):
            self.sample(page)

    def sample(self, page: int = 4096) -> None:
        try:
            with open("/proc/self/statm") as statm:
                rss = int(statm.read().split()[1]) * page
        except OSError:
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        self.rss, self.run_rss = max(self.rss, rss), max(self.run_rss, rss)
        if self.gpu:
            import torch

            free, total = torch.cuda.mem_get_info()
            used = total - free
            self.gpu_used, self.run_gpu = max(self.gpu_used, used), max(self.run_gpu, used)

    def reset(self) -> None:
        self.rss = self.gpu_used = 0
        self.sample()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


# -- data -------------------------------------------------------------------------------------


def _photos() -> list[np.ndarray]:
    """Colour photographs to cut from: scikit-image's where installed, else smooth synthetic
    scenes (gradients and discs) that compress like photos."""
    try:
        from skimage import data

        return [np.asarray(getattr(data, name)())
                for name in ("astronaut", "chelsea", "coffee", "rocket")]
    except Exception:  # noqa: BLE001 - no scikit-image: draw scenes
        import cv2

        rng = np.random.Generator(np.random.Philox(3))
        scenes = []
        for _ in range(4):
            y, x = np.mgrid[0:512, 0:512].astype(np.float32)
            base = np.stack([x / 2, y / 2, (x + y) / 4], axis=2)
            for _ in range(12):
                centre = (int(rng.integers(0, 512)), int(rng.integers(0, 512)))
                colour = tuple(int(c) for c in rng.integers(0, 256, 3))
                cv2.circle(base, centre, int(rng.integers(10, 120)), colour, -1)
            scenes.append(cv2.GaussianBlur(base, (0, 0), 3).clip(0, 255).astype(np.uint8))
        return scenes


def _jpeg_bases(photos: list[np.ndarray], count: int, h: int, w: int,
                rng: np.random.Generator) -> list[np.ndarray]:
    import cv2

    bases = []
    for i in range(count):
        photo = photos[i % len(photos)]
        ph, pw = photo.shape[:2]
        ch, cw = int(ph * rng.uniform(0.5, 1.0)), int(pw * rng.uniform(0.5, 1.0))
        y, x = int(rng.integers(0, ph - ch + 1)), int(rng.integers(0, pw - cw + 1))
        crop = np.ascontiguousarray(photo[y : y + ch, x : x + cw, :3])
        bases.append(cv2.resize(crop, (w, h), interpolation=cv2.INTER_AREA).astype(np.int16))
    return bases


def make_jpegs(count: int, h: int, w: int, *, threads: int, seed: int) -> list[bytes]:
    """``count`` distinct q90 4:2:0 JPEGs of h x w: 16 photo crops, each image one of them
    with its own shift, mirror and a film grain that brings a 500x375 file to about 80 KB."""
    import simplejpeg

    rng = np.random.Generator(np.random.Philox(seed))
    bases = _jpeg_bases(_photos(), 16, h, w, rng)
    grain = rng.normal(0.0, 10.0, (h, w + 64, 1)).astype(np.int16)

    def one(i: int) -> bytes:
        image = bases[i % len(bases)] + grain[:, (i * 37) % 64 : (i * 37) % 64 + w]
        image = np.roll(image, (i * 53) % w, axis=1)
        if (i // len(bases)) % 2:
            image = image[:, ::-1]
        pixels = np.ascontiguousarray(image.clip(0, 255).astype(np.uint8))
        return bytes(simplejpeg.encode_jpeg(pixels, quality=90, colorsubsampling="420"))

    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(one, range(count)))


def write_jpeg_shards(folder: Path, jpegs: list[bytes], h: int, w: int, *, shards: int,
                      files: bool) -> Path:
    from shardfeed.format.writer import ShardWriter

    folder.mkdir(parents=True)
    bounds = np.linspace(0, len(jpegs), shards + 1).astype(int)
    for s in range(shards):
        with ShardWriter(str(folder / f"part-{s:05d}.tfrecord")) as writer:
            for i in range(bounds[s], bounds[s + 1]):
                writer.write_example({
                    "image/encoded": jpegs[i], "image/format": b"jpeg",
                    "image/height": [h], "image/width": [w],
                    "image/class/label": [i % 1000],
                    "image/filename": f"{i:06d}.jpg".encode(),
                })
    if files:
        (folder.parent / f"{folder.name}-files").mkdir()
        for i, data in enumerate(jpegs):
            (folder.parent / f"{folder.name}-files" / f"{i:06d}_{i % 1000}.jpg").write_bytes(data)
    return folder


def make_png28(folder: Path, count: int) -> Path:
    """``count`` 28x28 grey digits (drawn with OpenCV, varied stroke, slant and noise),
    packed from arrays (PNG records)."""
    import cv2

    from shardfeed.tools.pack import pack

    rng = np.random.Generator(np.random.Philox(5))
    glyphs = []
    for label in range(10):
        for thickness in (2, 3, 4):
            canvas = np.zeros((56, 56), np.uint8)
            cv2.putText(canvas, str(label), (12, 44), cv2.FONT_HERSHEY_SIMPLEX, 1.5, 255,
                        thickness, cv2.LINE_AA)
            glyphs.append(cv2.resize(canvas, (28, 28), interpolation=cv2.INTER_AREA))
    pick = rng.integers(0, len(glyphs), count)
    images = np.stack([glyphs[k] for k in pick]).astype(np.int16)
    images += rng.integers(-8, 9, images.shape, dtype=np.int16)
    shifts = rng.integers(-3, 4, (count, 2))
    for i in range(count):
        images[i] = np.roll(images[i], tuple(shifts[i]), axis=(0, 1))
    pixels = images.clip(0, 255).astype(np.uint8)[..., None]
    labels = (pick // 3).astype(np.int64)
    pack((pixels, labels), str(folder), records_per_shard=5000, overwrite=True)
    return folder


@dataclass
class Data:
    jpegs: Path
    files: Path
    png28: Path
    big: Path
    seconds: float


def build_data(root: Path, sizes: Sizes, threads: int) -> Data:
    start = time.perf_counter()
    jpegs = make_jpegs(sizes.jpegs, JPEG_H, JPEG_W, threads=threads, seed=7)
    shards = write_jpeg_shards(root / "jpeg500", jpegs, JPEG_H, JPEG_W,
                               shards=max(1, min(16, sizes.jpegs // 500)), files=True)
    del jpegs
    big = make_jpegs(sizes.big_images, sizes.big_side, sizes.big_side, threads=threads,
                     seed=11)
    big_shards = write_jpeg_shards(root / "big", big, sizes.big_side, sizes.big_side,
                                   shards=max(1, sizes.big_images // 50), files=False)
    del big
    png = make_png28(root / "png28", sizes.pngs)
    return Data(jpegs=shards, files=root / "jpeg500-files", png28=png, big=big_shards,
                seconds=time.perf_counter() - start)


# -- timing -----------------------------------------------------------------------------------


def windows(batches: Iterator[int], sizes: Sizes, *,
            sync: Callable[[], None] = lambda: None) -> list[float]:
    """Rates (items/s) of ``sizes.repeats`` windows after ``sizes.warmup_batches``;
    ``batches`` yields each batch's item count; ``sync`` waits for queued device work."""
    for _ in range(sizes.warmup_batches):
        next(batches)
    sync()
    rates = []
    for _ in range(sizes.repeats):
        items, done, start = 0, 0, time.perf_counter()
        while done < sizes.max_batches and time.perf_counter() - start < sizes.window_s:
            items += next(batches)
            done += 1
        sync()
        rates.append(items / (time.perf_counter() - start))
    return rates


def endless(loader: Any, count: Callable[[Any], int]) -> Iterator[int]:
    """Batch sizes of ``loader``'s epochs, one after the other, forever."""
    epoch = 0
    while True:
        loader.set_epoch(epoch)
        for batch in loader:
            yield count(batch)
        epoch += 1


def hold_all_threads(loader: Any) -> str:
    """Keep every thread of a loader made before ``Loader(adaptive_threads=...)`` existed
    building slices (no trial of fewer); says how it was done."""
    gate = getattr(loader, "_gate", None)
    if gate is not None and callable(getattr(gate, "keep_all_threads", None)):
        gate.keep_all_threads()
        return "loader._gate.keep_all_threads()"
    raise Skip("this version has no way to hold every thread")


def _labels(batch: Any) -> int:
    return len(batch["image"])


# -- cases ------------------------------------------------------------------------------------


class Bench:
    def __init__(self, data: Data, sizes: Sizes, threads: int, device: str) -> None:
        self.data, self.sizes, self.threads, self.device = data, sizes, threads, device
        self.idle_gpu_rate: float | None = None

    def _payloads(self, folder: Path, limit: int | None = None) -> list[bytes]:
        from shardfeed.dataset import Dataset

        with Dataset(str(folder)) as ds:
            n = len(ds) if limit is None else min(limit, len(ds))
            return [bytes(cast(bytes, r["image/encoded"]))
                    for r in ds.read_many(list(range(n)))]

    def decode(self, row: Row) -> None:
        import simplejpeg

        payloads = self._payloads(self.data.jpegs)
        size = self.sizes.batch
        assert row.threads is not None

        def batches() -> Iterator[int]:
            with ThreadPoolExecutor(row.threads) as pool:
                k = 0
                while True:
                    chunk = [payloads[(k + j) % len(payloads)] for j in range(size)]
                    k += size
                    for _ in pool.map(simplejpeg.decode_jpeg, chunk, chunksize=8):
                        pass
                    yield size

        row.rates = windows(batches(), self.sizes)

    def _loader(self, data: Any, threads: int, transform: Any, batch: int) -> Any:
        from shardfeed.pipeline import Loader

        return Loader(data, batch_size=batch, shuffle=True, seed=0, transform=transform,
                      num_threads=threads, prefetch_batches=4, drop_last=True)

    def _held_loader(self, data: Any, threads: int, transform: Any, batch: int,
                     row: Row) -> Any:
        """A loader that builds with every thread: ``adaptive_threads=False``, or the gate
        held by hand in versions without it."""
        from shardfeed.pipeline import Loader

        try:
            loader = Loader(data, batch_size=batch, shuffle=True, seed=0, transform=transform,
                            num_threads=threads, prefetch_batches=4, drop_last=True,
                            adaptive_threads=False)
            row.note = "adaptive_threads=False"
        except TypeError:
            loader = self._loader(data, threads, transform, batch)
            row.note = hold_all_threads(loader)
        return loader

    def _run_loader(self, row: Row, data: Any, transform: Any, batch: int, *,
                    held: bool) -> None:
        threads = row.threads
        assert threads is not None
        made = (self._held_loader(data, threads, transform, batch, row) if held
                else self._loader(data, threads, transform, batch))
        with made as loader:
            row.rates = windows(endless(loader, _labels), self.sizes)

    def train(self, row: Row, *, held: bool = False) -> None:
        from shardfeed.dataset import Dataset
        from shardfeed.transforms import presets

        with Dataset(str(self.data.jpegs)) as ds:
            self._run_loader(row, ds, presets.train(size=TRAIN_SIZE), self.sizes.batch,
                             held=held)

    def png28(self, row: Row, *, held: bool = False) -> None:
        from shardfeed.dataset import Dataset
        from shardfeed.transforms import DecodeImage

        with Dataset(str(self.data.png28)) as ds:
            self._run_loader(row, ds, DecodeImage(channels="gray"), 256, held=held)

    def patches(self, row: Row, *, held: bool = False) -> None:
        from shardfeed.dataset import Dataset
        from shardfeed.pipeline.patches import Patches

        with Dataset(str(self.data.big)) as ds:
            source = Patches(ds, size=32, cache_images=self.sizes.cache_images,
                             refresh_every=self.sizes.refresh_every)
            self._run_loader(row, source, None, self.sizes.patch_batch, held=held)

    def torch_pil(self, row: Row) -> None:
        try:
            import torch
            from torch.utils.data import DataLoader
        except ImportError as exc:
            raise Skip(f"no torch ({exc})") from None
        files = sorted(str(p) for p in self.data.files.glob("*.jpg"))
        dataset = PilFiles(files)
        row.note = dataset.kind
        generator = torch.Generator()
        generator.manual_seed(0)
        loader: Any = DataLoader(cast(Any, dataset), batch_size=self.sizes.batch, shuffle=True,
                            num_workers=self.threads, drop_last=True, persistent_workers=True,
                            prefetch_factor=4, generator=generator)
        try:
            row.rates = windows(endless(_EpochLoader(loader), lambda b: len(b[0])), self.sizes)
        finally:
            iterator = getattr(loader, "_iterator", None)
            if iterator is not None:
                iterator._shutdown_workers()

    # -- the GPU path ---------------------------------------------------------------------------

    def _torch_device(self) -> Any:
        try:
            import torch
        except ImportError as exc:
            raise Skip(f"no torch ({exc})") from None
        if self.device == "cuda" and not torch.cuda.is_available():
            raise Skip(f"no CUDA device (torch {torch.__version__})")
        from shardfeed.transforms.decode import region

        if region.backend() is None:
            raise Skip("no nvImageCodec (pip install 'shardfeed[nvimgcodec-cu12]' or "
                       "'[nvimgcodec-cu13]')")
        return torch.device(self.device)

    def _sync(self) -> None:
        if self.device == "cuda":
            import torch

            torch.cuda.synchronize()

    def _gpu_loader(self, ds: Any, threads: int, device: Any) -> Any:
        import shardfeed
        from shardfeed.transforms import presets

        loader = self._loader(ds, threads, presets.train(size=TRAIN_SIZE, decode_on="cuda"),
                              self.sizes.batch)
        try:
            return shardfeed.torch.adapt(loader, device=str(device))
        except ValueError as exc:
            loader.close()
            raise Skip(str(exc).split(";")[0]) from None

    def gpu_train(self, row: Row) -> None:
        from shardfeed.dataset import Dataset

        device = self._torch_device()
        assert row.threads is not None
        with Dataset(str(self.data.jpegs)) as ds, \
                self._gpu_loader(ds, row.threads, device) as loader:
            row.rates = windows(endless(loader, _labels), self.sizes, sync=self._sync)
        if row.threads == self.threads:
            self.idle_gpu_rate = row.rate
        if self.device != "cuda":
            row.note = "nvImageCodec CPU backend: a check, not a figure"

    def _planned(self, batches: int) -> list[tuple[list[bytes], np.ndarray]]:
        """The JPEGs and boxes (y, x, h, w) the preset's CPU half plans for the device."""
        from shardfeed.dataset import Dataset
        from shardfeed.transforms import presets

        out = []
        with Dataset(str(self.data.jpegs)) as ds, self._loader(
                ds, self.threads, presets.train(size=TRAIN_SIZE, decode_on="cuda"),
                self.sizes.batch) as loader:
            for k, batch in enumerate(loader):
                keep = np.flatnonzero(~np.asarray(batch["plan/on_cpu"]).astype(bool))
                out.append(([bytes(batch["plan/encoded"][r]) for r in keep],
                            np.array(batch["plan/box"])[keep]))
                if k + 1 == batches:
                    break
        return out

    def nvimgcodec(self, row: Row, *, regions: bool) -> None:
        device = self._torch_device()
        from shardfeed.loaders.torch_decode import plan_of
        from shardfeed.transforms import presets
        from shardfeed.transforms.decode import region

        module = region.backend()
        assert module is not None
        op = plan_of(presets.train(size=TRAIN_SIZE, decode_on="cuda")).op  # type: ignore[union-attr]
        # the GPU path's decoder options (ROI decode with fancy upsampling warns per image)
        options = f":fast_idct={int(op.fast_dct)} :fancy_upsampling={int(not op.fast_upsample)}"
        if device.type == "cuda":
            decoder = module.Decoder(device_id=device.index or 0, options=options)
        else:
            decoder = module.Decoder(device_id=module.NVIMGCODEC_DEVICE_CPU_ONLY,
                                     backends=[module.Backend(module.BackendKind.CPU_ONLY)],
                                     options=options)
            row.note = "CPU backend: a check, not a figure"
        params = region.no_turn(module)
        work = []
        for encoded, boxes in self._planned(min(4, max(1, self.sizes.max_batches))):
            streams = [module.CodeStream(data) for data in encoded]
            if regions:
                streams = [s.get_sub_code_stream(region=module.Region(
                    start=(y, x), end=(y + h, x + w))) for s, (y, x, h, w)
                    in zip(streams, boxes.tolist())]
            work.append(streams)

        def batches() -> Iterator[int]:
            k = 0
            while True:
                streams = work[k % len(work)]
                k += 1
                images = decoder.decode(streams, params=params)
                if any(image is None for image in images):
                    raise RuntimeError("nvImageCodec refused an image of the batch")
                yield len(streams)

        row.rates = windows(batches(), self.sizes, sync=self._sync)

    def gpu_overlap(self, row: Row) -> None:
        device = self._torch_device()
        if device.type != "cuda":
            raise Skip("needs CUDA streams")
        if not self.idle_gpu_rate:
            raise Skip("the idle GPU path was not measured")
        import torch

        from shardfeed.dataset import Dataset

        a = torch.randn(4096, 4096, device=device, dtype=torch.float16)
        step_target = self.sizes.batch / self.idle_gpu_rate
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(10):
            torch.matmul(a, a)
        torch.cuda.synchronize()
        per_product = (time.perf_counter() - start) / 10
        products = max(1, round(step_target / per_product))
        train = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
        done = torch.cuda.Event()  # type: ignore[no-untyped-call]

        def step(x: Any | None) -> None:
            with torch.cuda.stream(train):
                if x is not None:
                    train.wait_stream(torch.cuda.current_stream(device))
                    x.float().mean()
                for _ in range(products):
                    torch.matmul(a, a)
                done.record(train)
            done.synchronize()  # a training step ends on its loss (loss.item())

        def alone() -> Iterator[int]:
            while True:
                step(None)
                yield self.sizes.batch

        t_train = self.sizes.batch / statistics.median(windows(alone(), self.sizes))

        def busy(loader: Any) -> Iterator[int]:
            def trained(batch: Any) -> int:
                step(batch["image"])
                return len(batch["image"])

            return endless(loader, trained)

        with Dataset(str(self.data.jpegs)) as ds, \
                self._gpu_loader(ds, self.threads, device) as loader:
            row.rates = windows(busy(loader), self.sizes, sync=self._sync)
        t_decode = self.sizes.batch / self.idle_gpu_rate
        t_both = self.sizes.batch / statistics.median(row.rates)
        overlap = (t_decode + t_train - t_both) / min(t_decode, t_train)
        row.extra = {"overlap": overlap, "vs_idle": statistics.median(row.rates)
                     / self.idle_gpu_rate, "train_ms": t_train * 1e3,
                     "decode_ms": t_decode * 1e3, "products": products}
        row.note = (f"overlap {overlap:.2f}, {row.extra['vs_idle']:.2f}x idle; train step "
                    f"{t_train * 1e3:.0f} ms ({products} fp16 4096^2 products)")


class _EpochLoader:
    """A torch DataLoader with the Loader's ``set_epoch`` (its shuffle draws anew)."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def set_epoch(self, epoch: int) -> None:
        pass

    def __iter__(self) -> Iterator[Any]:
        return iter(self.loader)


class PilFiles:
    """.jpg files, PIL decode, RandomResizedCrop(224) + horizontal flip: torchvision's v2
    transforms where installed, else the same box rule with PIL and NumPy."""

    def __init__(self, paths: list[str]) -> None:
        self.paths = paths
        try:
            from torchvision.transforms import v2

            self.transform: Any = v2.Compose([v2.RandomResizedCrop(TRAIN_SIZE, antialias=True),
                                              v2.RandomHorizontalFlip()])
            self.kind = "torchvision v2 RandomResizedCrop + flip"
        except ImportError:
            self.transform = None
            self.kind = "RandomResizedCrop + flip in PIL/NumPy (no torchvision)"

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        import torch
        from PIL import Image

        with Image.open(self.paths[i]) as im:
            image = im.convert("RGB")
        if self.transform is not None:
            array = np.asarray(self.transform(image))
        else:
            array = _resized_crop_flip(image)
        label = int(Path(self.paths[i]).stem.split("_")[1])
        return torch.from_numpy(np.ascontiguousarray(array)), label


def _resized_crop_flip(image: Any) -> np.ndarray:
    import random

    from PIL import Image

    width, height = image.size
    area = width * height
    box = (0, 0, width, height)
    for _ in range(10):  # torchvision's RandomResizedCrop box rule
        target = area * random.uniform(0.08, 1.0)
        ratio = math.exp(random.uniform(math.log(3 / 4), math.log(4 / 3)))
        w, h = round(math.sqrt(target * ratio)), round(math.sqrt(target / ratio))
        if 0 < w <= width and 0 < h <= height:
            x, y = random.randint(0, width - w), random.randint(0, height - h)
            box = (x, y, x + w, y + h)
            break
    array = np.asarray(image.resize((TRAIN_SIZE, TRAIN_SIZE), Image.Resampling.BILINEAR, box=box))
    return array[:, ::-1] if random.random() < 0.5 else array


# -- the run ----------------------------------------------------------------------------------


def plan(bench: Bench, n: int) -> list[tuple[Row, Callable[[Row], None]]]:
    """Every row, in the order they run (the torch DataLoader forks its workers before
    anything touches CUDA)."""
    rows: list[tuple[Row, Callable[[Row], None]]] = []
    counts = sorted({1, 4, 8, n})
    for t in sorted({1, n}):
        rows.append((Row("decode", t, "full decode (simplejpeg), 500x375"), bench.decode))
    rows.append((Row("torch-pil", n, "torch DataLoader + PIL, workers"), bench.torch_pil))
    for t in counts:
        rows.append((Row("train", t, "CPU train 224 as shipped"), bench.train))
    for t in [c for c in counts if c > 1]:
        rows.append((Row("train-held", t, "CPU train 224, every thread held"),
                     lambda r: bench.train(r, held=True)))
    for t in sorted({1, n}):
        rows.append((Row("png28", t, "28x28 PNG records, DecodeImage"), bench.png28))
    rows.append((Row("png28-held", n, "28x28 PNG, every thread held"),
                 lambda r: bench.png28(r, held=True)))
    for t in sorted({1, n}):
        rows.append((Row("patches", t, "Patches 32 of big JPEGs"), bench.patches))
    rows.append((Row("patches-held", n, "Patches 32, every thread held"),
                 lambda r: bench.patches(r, held=True)))
    rows.append((Row("nvimgcodec-whole", None, "nvImageCodec batched, whole images"),
                 lambda r: bench.nvimgcodec(r, regions=False)))
    rows.append((Row("nvimgcodec-region", None, "nvImageCodec batched, the preset's boxes"),
                 lambda r: bench.nvimgcodec(r, regions=True)))
    for t in sorted({8, n}):
        rows.append((Row("gpu-train", t, "decode_on='cuda' train 224"), bench.gpu_train))
    rows.append((Row("gpu-overlap", n, "decode_on='cuda', training stream busy"),
                 bench.gpu_overlap))
    return rows


def run(rows: list[tuple[Row, Callable[[Row], None]]], peaks: Peaks, deadline: float) -> None:
    for row, case in rows:
        if time.perf_counter() > deadline:
            row.skipped = "the run's time budget was spent"
            continue
        peaks.reset()
        try:
            case(row)
        except Skip as exc:
            row.skipped = str(exc)
        except Exception as exc:  # noqa: BLE001 - one case failing keeps the table
            row.skipped = f"failed: {type(exc).__name__}: {exc}"[:200]
        peaks.sample()
        row.rss_mib = peaks.rss / 2**20
        row.gpu_mib = peaks.gpu_used / 2**20 if peaks.gpu else None
        status = row.skipped or f"{row.rate:,.0f} {row.unit}"
        print(f"  {row.key:<22} {status}", file=sys.stderr, flush=True)


def table(rows: list[Row], header: str) -> str:
    refs = {"decode": "decode@", "train": "decode@", "train-held": "decode@",
            "torch-pil": "decode@", "gpu-train": "nvimgcodec-region",
            "gpu-overlap": "gpu-train@"}
    by_key = {r.key: r for r in rows}
    one = {r.case: r.rate for r in rows if r.threads == 1 and r.rate}
    lines = [header, (f"{'case':<20} {'thr':>4} {'images/s':>10} {'vs 1 thr':>8} "
                      f"{'vs ref':>7} {'RSS MiB':>8} {'GPU MiB':>8}  what / note")]
    for r in rows:
        if r.skipped is not None:
            lines.append(f"{r.case:<20} {r.threads or '':>4} {'skipped: ' + r.skipped}")
            continue
        rate = r.rate or math.nan
        vs_one = rate / one[r.case.removesuffix("-held")] if (
            r.threads and r.threads > 1 and r.case.removesuffix("-held") in one) else math.nan
        ref_name = refs.get(r.case, "")
        ref = by_key.get(ref_name + (str(r.threads) if ref_name.endswith("@") else ""))
        vs_ref = rate / ref.rate if ref is not None and ref.rate and ref is not r else math.nan
        repeats = "/".join(f"{x:.0f}" for x in r.rates)
        gpu = f"{r.gpu_mib:8.0f}" if r.gpu_mib is not None else f"{'-':>8}"
        lines.append(f"{r.case:<20} {r.threads or '':>4} {rate:>10,.0f} {vs_one:>8.2f} "
                     f"{vs_ref:>7.2f} {r.rss_mib or 0:>8.0f} {gpu}  {r.what}"
                     f"{'; ' + r.note if r.note else ''} [{repeats}]")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--out", default="bench_node.json", help="the JSON's path")
    parser.add_argument("--threads", type=int, default=None,
                        help="N (default: the cores this process may use)")
    parser.add_argument("--data", help="folder for the generated data (default: a temporary one)")
    parser.add_argument("--quick", action="store_true", help="everything small (2 cores)")
    parser.add_argument("--tiny", action="store_true", help="with --quick: seconds, for CI")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                        help="cpu: GPU rows on nvImageCodec's CPU backend (a check)")
    args = parser.parse_args(argv)
    sizes = Sizes.tiny() if args.tiny else Sizes.quick() if args.quick else Sizes.node()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    n = args.threads or cores or 1
    started = time.perf_counter()
    gpu = _has_cuda() and args.device == "cuda"
    peaks = Peaks(gpu)
    with tempfile.TemporaryDirectory(prefix="shardfeed-node-", dir=args.data) as tmp:
        print(f"generating data in {tmp} ...", file=sys.stderr, flush=True)
        data = build_data(Path(tmp), sizes, n)
        bench = Bench(data, sizes, n, args.device)
        planned = plan(bench, n)
        run(planned, peaks, started + sizes.deadline_s)
    peaks.close()
    rows = [row for row, _ in planned]
    header = (f"shardfeed node bench: {platform.node()}, {cores} usable cores, N={n}, "
              f"{_gpu_name()}, Python {platform.python_version()}, {_versions()}; "
              f"{'tiny' if args.tiny else 'quick' if args.quick else 'node'} sizes: "
              f"{sizes.jpegs} JPEGs {JPEG_W}x{JPEG_H} q90 4:2:0 (batch {sizes.batch}), "
              f"{sizes.pngs} PNG 28x28 (batch 256), {sizes.big_images} JPEGs "
              f"{sizes.big_side}^2 (patch batch {sizes.patch_batch}); data made in "
              f"{data.seconds:.0f} s; median of {sizes.repeats} windows of <= "
              f"{sizes.window_s} s / {sizes.max_batches} batches; 'vs ref': decode at the same "
              "threads (CPU rows), nvImageCodec region decode (GPU path), the idle GPU path "
              "(overlap); RSS: the process's peak during the case")
    total = time.perf_counter() - started
    text = table(rows, header)
    footer = (f"peak host RSS {peaks.run_rss / 2**20:,.0f} MiB, peak GPU memory used "
              + (f"{peaks.run_gpu / 2**20:,.0f} MiB" if gpu else "- (no CUDA)")
              + f"; whole run {total:.0f} s")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "header": header, "threads": n, "cores": cores, "sizes": asdict(sizes),
        "seconds": total, "data_seconds": data.seconds,
        "peak_rss_mib": peaks.run_rss / 2**20,
        "peak_gpu_mib": peaks.run_gpu / 2**20 if gpu else None,
        "rows": [{**asdict(r), "key": r.key, "images_per_s": r.rate} for r in rows],
    }, indent=1))
    print(text + "\n" + footer + f"\nJSON: {out}", flush=True)
    return 0


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def _gpu_name() -> str:
    if not _has_cuda():
        return "no CUDA GPU"
    import torch

    return f"{torch.cuda.get_device_name(0)} (torch CUDA {torch.version.cuda})"


def _versions() -> str:
    names = []
    for module in ("torch", "torchvision", "simplejpeg", "cv2"):
        with contextlib.suppress(Exception):  # absent: not named
            names.append(f"{module} {__import__(module).__version__}")
    with contextlib.suppress(Exception):
        from shardfeed.transforms.decode import region

        found = region.backend()
        if found is not None:
            names.append(f"nvImageCodec {found.__version__} (CUDA {found.__cuda_version__})")
    return ", ".join(names)

if __name__ == "__main__":
    sys.exit(main())
