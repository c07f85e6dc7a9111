"""Measuring a Loader: batches epoch after epoch, each counted and time-stamped through a
warm-up and a measured stretch, and the figures one run reports (options, rates, memory).

Bytes read. Local shards are memory-mapped: their bytes arrive by page faults, which the
process's read counter (``rchar``) never sees (it printed 0.0 MB/s). So ``read_mb_per_s``
counts the bytes the records occupy: records read a second (samples; frames for windows;
the patch cache's decodes for patches) times the dataset's mean record size (its shard
bytes over its records, framing included). A uniform shuffle reads a uniform sample of the
records, so this is their true rate on average. For a referenced dataset (records hold image
paths) the image files are read with ``read`` calls, and the OS counter is the figure.
Where neither applies, the figure is None and ``read_note`` says why.

Determinism: the batches are the Loader's; the figures are timings. State: none. Memory: one
stamp a batch.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from shardfeed.tools.bench.probe import RssSampler, bytes_read, peak_rss_bytes

if TYPE_CHECKING:
    from shardfeed.pipeline.memory import MemoryBudget
    from shardfeed.tools.bench import BenchOptions


def _count(batch: dict[str, Any]) -> tuple[int, int]:
    """(samples, output pixels) of one batch; the pixels of its ``image`` array."""
    image = batch.get("image")
    if isinstance(image, np.ndarray) and image.ndim >= 3:
        samples = int(image.shape[0])
        per_sample = int(np.prod(image.shape[1:]))
        channels = image.shape[-1] if image.shape[-1] in (1, 3, 4) else (
            image.shape[-3] if image.ndim >= 4 and image.shape[-3] in (1, 3, 4) else 1
        )
        return samples, per_sample // int(channels)
    for value in batch.values():
        if isinstance(value, np.ndarray) and value.ndim >= 1:
            return int(value.shape[0]), 0
        if isinstance(value, list):
            return len(value), 0
    return 0, 0


def _batches(loader: Any) -> Iterator[dict[str, Any]]:
    """Batches epoch after epoch, for as long as the caller asks."""
    while True:
        got = False
        for batch in loader:
            got = True
            yield batch
        if not got:
            raise ValueError(
                "the loader yields no batch in an epoch: the dataset is smaller than one batch "
                "(lower the batch size)"
            )


def _mean_source_pixels(dataset: Any, *, seed: int) -> float | None:
    """Mean stored image size in pixels, from the height/width of up to 256 records."""
    schema = dataset.schema
    image = schema.image
    if image is None or not image.height_key or not image.width_key:
        return None
    n = len(dataset)
    rng = np.random.Generator(np.random.Philox(np.random.SeedSequence([seed, 0x5A])))
    picks = np.sort(rng.permutation(n)[: min(n, 256)]).tolist()
    sizes = []
    for record in dataset.read_many(picks):
        h, w = record.get(image.height_key), record.get(image.width_key)
        if h is not None and w is not None:
            sizes.append(float(np.asarray(h).reshape(-1)[0]) * float(np.asarray(w).reshape(-1)[0]))
    return float(np.mean(sizes)) if sizes else None


def _timeline(stamps: list[tuple[float, int]], *, max_bins: int = 60) -> list[list[float]]:
    """``[[t_end_seconds, samples_per_s], ...]`` over even bins from the first batch on (about
    four batches a bin, at most ``max_bins``)."""
    if len(stamps) < 2:
        return []
    bins = max(1, min(max_bins, (len(stamps) - 1) // 4))
    t0, t1 = stamps[0][0], stamps[-1][0]
    span = t1 - t0
    if span <= 0:
        return []
    width = span / bins
    counts = np.zeros(bins)
    for t, n in stamps[1:]:
        counts[min(bins - 1, int((t - t0) / width))] += n
    return [[round((i + 1) * width, 4), float(c / width)] for i, c in enumerate(counts)]


@dataclass(slots=True)
class Measured:
    """What one run counted: a stamp a batch, and after the warm-up the samples, batches and
    output pixels over ``seconds``, with the bytes read before and after."""

    stamps: list[tuple[float, int]] = field(default_factory=list)
    samples: int = 0
    batches: int = 0
    pixels: int = 0
    first_batch_s: float = 0.0
    seconds: float = 0.0
    read_from: int | None = None
    read_to: int | None = None
    decodes_from: int | None = None
    decodes_to: int | None = None
    # where the time went: (seconds since the measured stretch began, the window's figures)
    stages: list[tuple[float, Any]] = field(default_factory=list)


STAGE_TICK_S = 0.5
"""How often the stage figures are taken while measuring (each a window of the stretch)."""


def measure(loader: Any, options: BenchOptions, *, start: float, progress: bool,
            decodes: Callable[[], int] | None = None) -> Measured:
    """Time the first batch, warm up for ``options.warmup``, then count for
    ``options.seconds`` (a tqdm bar on stderr with ``progress``). ``decodes``: a counter of
    the records the source decodes (the patch cache's loads), read at both ends of the
    measured stretch."""
    from tqdm import tqdm

    measured = Measured()
    unit = {"records": "img", "windows": "win", "patches": "patch"}[options.kind]
    bar = tqdm(unit=f" {unit}", unit_scale=True, disable=not progress, leave=False,
               desc="first batch")
    batches = _batches(loader)
    measure_from = None
    for i, batch in enumerate(batches):
        now = time.perf_counter()
        samples, pixels = _count(batch)
        measured.stamps.append((now, samples))
        bar.update(samples)
        if i == 0:
            measured.first_batch_s = now - start
            warm_until = now + options.warmup
            bar.set_description("warm-up")
        if measure_from is None:
            if now >= warm_until:
                measure_from, measured.read_from = now, bytes_read()
                measured.decodes_from = None if decodes is None else decodes()
                bar.set_description("measuring")
                window = loader.stats_window()  # the stage figures' window starts here
                tick = now + STAGE_TICK_S
            continue
        if now >= tick:
            measured.stages.append((now - measure_from, loader.stats(window).window))
            tick = now + STAGE_TICK_S
        measured.samples += samples
        measured.batches += 1
        measured.pixels += samples * pixels
        measured.seconds = now - measure_from
        if measured.seconds >= options.seconds:
            break
    measured.read_to = bytes_read()
    measured.decodes_to = None if decodes is None else decodes()
    if measure_from is not None:
        measured.stages.append((time.perf_counter() - measure_from,
                                loader.stats(window).window))
    bar.close()
    return measured


def stage_figures(measured: Measured) -> dict[str, Any]:
    """The measured stretch's stage figures (its windows summed) and their timeline: each
    window's start and end (seconds since the stretch began) and its threads busy in each
    stage (stage seconds over the window's seconds)."""
    from shardfeed.pipeline.stage_stats import combine

    windows = [w for _, w in measured.stages if w is not None]
    if not windows:
        return {"stages": None, "stage_timeline": []}
    timeline = [[max(0.0, t - w.seconds), t,
                 {name: seconds / w.seconds for name, seconds in w.stages.items()}
                 if w.seconds > 0 else {}] for t, w in measured.stages if w is not None]
    return {"stages": combine(windows).to_dict(), "stage_timeline": timeline}


def setup_figures(dataset: Any, options: BenchOptions, source: Any) -> dict[str, Any]:
    """What was measured: the dataset's size and the options in effect."""
    kind = options.kind
    return {
        "kind": kind,
        "records": len(dataset),
        "preset": options.preset,
        "size": options.patches if kind == "patches" else options.size,
        "batch_size": options.batch_size,
        "threads": options.num_threads,
        "windows": options.windows,
        "stride": options.stride if kind == "windows" else None,
        "patches": options.patches,
        "cache_images": source.options.cache_images if kind == "patches" else None,
        "refresh_every": options.refresh_every if kind == "patches" else None,
        "warmup_seconds": options.warmup,
    }


def _mean_record_bytes(dataset: Any) -> tuple[float | None, str]:
    """The dataset's mean record size in bytes (framing included) and its mode, from the
    manifest's shard sizes; ``(None, why)`` for a source without them."""
    from shardfeed.dataset import Dataset

    if not isinstance(dataset, Dataset):
        return None, f"a {type(dataset).__name__} states no record sizes"
    manifest = dataset.manifest
    records = sum(shard.records for shard in manifest.shards)
    if records == 0:
        return None, "the dataset holds no records"
    return sum(shard.bytes for shard in manifest.shards) / records, manifest.mode


def _records_read(options: BenchOptions, measured: Measured) -> int | None:
    """Records the loader read in the measured stretch."""
    if options.kind == "patches":
        if measured.decodes_from is None or measured.decodes_to is None:
            return None
        return measured.decodes_to - measured.decodes_from
    return measured.samples * (options.windows or 1)


def read_figures(dataset: Any, options: BenchOptions, measured: Measured) -> dict[str, Any]:
    """MB/s read: the records' bytes (see the module docstring), or the OS read counter for
    referenced datasets, with what was counted and, where nothing could be, why."""
    seconds = measured.seconds
    mean, mode = _mean_record_bytes(dataset)
    records = _records_read(options, measured)
    figures: dict[str, Any] = {
        "read_mb_per_s": None, "read_counted": None, "read_note": None,
        "records_read_per_s": None if records is None else records / seconds,
        "mean_record_bytes": mean,
    }
    if mode == "referenced":
        read_from, read_to = measured.read_from, measured.read_to
        if read_from is None or read_to is None:
            figures["read_note"] = ("the records hold image paths, and this platform has no "
                                    "read counter (/proc/self/io) for the image files")
        else:
            figures["read_mb_per_s"] = (read_to - read_from) / seconds / 1e6
            figures["read_counted"] = "os"
    elif mean is None:
        figures["read_note"] = mode
    elif records is None:
        figures["read_note"] = "the source counts no decodes"
    else:
        figures["read_mb_per_s"] = records * mean / seconds / 1e6
        figures["read_counted"] = "records"
    return figures


def rate_figures(dataset: Any, options: BenchOptions, measured: Measured) -> dict[str, Any]:
    """The rates: samples, images (frames, patches), megapixels and bytes read a second."""
    kind = options.kind
    t_measure = measured.seconds
    rate = measured.samples / t_measure
    frames = rate * (options.windows or 1)
    mean_pixels = _mean_source_pixels(dataset, seed=options.seed)
    return {
        "seconds": t_measure,
        "samples": measured.samples,
        "batches": measured.batches,
        "samples_per_s": rate,
        "images_per_s": frames if kind != "patches" else rate,
        "frames_per_s": frames if kind == "windows" else None,
        "patches_per_s": rate if kind == "patches" else None,
        "output_mpix_per_s": measured.pixels / t_measure / 1e6,
        "source_mpix_per_s": (
            frames * mean_pixels / 1e6 if mean_pixels is not None and kind != "patches" else None
        ),
        **read_figures(dataset, options, measured),
        "time_to_first_batch_s": measured.first_batch_s,
    }


def memory_figures(options: BenchOptions, budget: MemoryBudget, rss: RssSampler,
                    measured: Measured) -> dict[str, Any]:
    """The Loader's stated memory bound by part, resident memory, and the timeline."""
    return {
        "memory_bound_bytes": budget.total_bytes,
        "memory_budget": {
            "batch_bytes": budget.batch_bytes, "ring_batches": budget.ring_batches,
            "work_bytes_per_thread": budget.work_bytes_per_thread, "threads": budget.threads,
            "decode_bytes_per_thread": budget.decode_bytes_per_thread,
            "index_bytes": budget.index_bytes, "cache_bytes": budget.cache_bytes,
            "fixed_bytes": budget.fixed_bytes,
        },
        "max_pixels": options.max_pixels,
        "start_rss_bytes": rss.start_bytes,
        "peak_rss_bytes": rss.peak_bytes if rss.peak_bytes is not None else peak_rss_bytes(),
        "timeline": _timeline(measured.stamps),
    }
