"""``demo``: the main jobs of shardfeed, end to end, on datasets built from bundled photographs.

:func:`demo` writes into ``out``::

    out/
      .shardfeed-demo              marker: this folder may be replaced by the next demo
      sources/                     the images and CSVs the datasets are packed from
        timelapse/ highres/ labelled/
      datasets/                    packed, indexed TFRecord shards + shardfeed.json
        timelapse/  4 days x 40 frames, 23 float labels, day + timestamp (groups, order)
        highres/    8 photographs, 1024-1566 px
        labelled/   2,000 crops of 64 px, 10 labels sorted ascending, a PNG mask each
      report/                      shuffle report plots (exact shuffle vs shuffle buffer)
      summary.json                 every figure that does not depend on timing
      timings/                     what varies between runs: timings.json, the bench plot,
                                   summary.txt (the printed summary)

and runs, in order: pack (through the pack API), verify (every CRC, every image decoded), a
shuffled train epoch over ``labelled`` (``presets.train``, with masks), 3-frame windows over
``timelapse`` (16 s apart, never across a day or a gap), cached patches over ``highres``, the
shuffle report over ``labelled`` (exact shuffle vs a shuffle buffer of 5 % of the records),
and a short bench over ``timelapse`` (its frames are the most photograph-like images).

Determinism: everything outside ``timings/`` is byte-identical from run to run (same sizes,
same library builds). State: none. Memory: the largest of the steps: a few MB of batches,
the shuffle report's label arrays, one high-resolution photograph.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shardfeed.tools.demo.data import (
    TIMELAPSE_FLOATS,
    DemoSizes,
    write_highres,
    write_labelled,
    write_timelapse,
)
from shardfeed.tools.demo.output import finish, format_summary, start

__all__ = ["WINDOW_LENGTH", "WINDOW_STRIDE_SECONDS", "demo", "format_summary"]

Report = Callable[[str], None]

SEED = 0
WINDOW_LENGTH = 3
WINDOW_STRIDE_SECONDS = 16.0
WINDOW_MAX_GAP_SECONDS = 16.0
PATCH_SIZE = 64
_STEPS = 9


def _json_dump(path: str, data: Any) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.write("\n")


def _pack_all(build: str, sizes: DemoSizes, workers: int, step: Report) -> dict[str, Any]:
    from shardfeed.tools.pack import pack
    from shardfeed.tools.pack.csvinput import CsvColumns

    src = os.path.join(build, "sources")
    step("writing source images from scikit-image photographs")
    timelapse_csv = write_timelapse(os.path.join(src, "timelapse"), sizes)
    highres = write_highres(os.path.join(src, "highres"), sizes)
    labelled_csv = write_labelled(os.path.join(src, "labelled"), sizes)
    step("packing three datasets")
    jobs: dict[str, tuple[str, dict[str, Any], str]] = {
        "timelapse": (timelapse_csv, {
            "csv": CsvColumns(floats=TIMELAPSE_FLOATS, group="day", order="timestamp"),
            "records_per_shard": 64,
        }, f"{sizes.days} days, {len(TIMELAPSE_FLOATS)} float labels, frames 8 s apart"),
        "highres": (highres, {"records_per_shard": 4},
                    "photographs 1024-1566 px, no labels"),
        "labelled": (labelled_csv, {
            "csv": CsvColumns(labels=("label",), mask="mask"),
            "records_per_shard": max(1, sizes.labelled_images // 4),
        }, f"{sizes.crop_pixels} px crops, {sizes.classes} labels sorted, PNG masks"),
    }
    datasets: dict[str, Any] = {}
    for name, (source, options, what) in jobs.items():
        result = pack(source, os.path.join(build, "datasets", name), workers=workers, **options)
        datasets[name] = {
            "path": f"datasets/{name}", "what": what, "records": result.records,
            "shards": result.shards, "bytes": result.bytes,
        }
    return datasets


def _verify_all(build: str, datasets: dict[str, Any], workers: int, step: Report) -> None:
    from shardfeed.tools.verify import verify

    step("verifying every record and image")
    for info in datasets.values():
        report = verify(os.path.join(build, info["path"]), decode=True, workers=workers)
        info["verify"] = {
            "ok": report.ok, "records": report.records,
            "decoded": sum(s.decoded for s in report.shards),
            "problems": len(report.problems),
            "first_problems": [str(p) for p in report.problems[:5]],
        }


def _train_epoch(path: str, sizes: DemoSizes, workers: int) -> tuple[dict[str, Any], float]:
    from shardfeed.dataset import Dataset
    from shardfeed.pipeline import Loader
    from shardfeed.tools.shuffle_report.stats import expected_labels_per_batch
    from shardfeed.transforms import presets

    size = max(16, sizes.crop_pixels - sizes.crop_pixels // 4)
    batch_size = 64
    digest = hashlib.sha256()
    labels_seen: list[np.ndarray] = []
    distinct: list[int] = []
    image_shape = mask_shape = None
    with Dataset(path) as ds, Loader(
        ds, batch_size=batch_size, shuffle=True, seed=SEED, transform=presets.train(size=size),
        num_threads=workers, drop_last=True,
    ) as loader:
        start_s = time.perf_counter()
        for batch in loader:
            labels = np.asarray(batch["image/class/label"]).reshape(-1)
            labels_seen.append(labels.copy())
            distinct.append(len(np.unique(labels)))
            digest.update(np.ascontiguousarray(batch["image"]).tobytes())
            digest.update(np.ascontiguousarray(batch["mask"]).tobytes())
            image_shape, mask_shape = list(batch["image"].shape), list(batch["mask"].shape)
        seconds = time.perf_counter() - start_s
        all_labels = np.concatenate(labels_seen)
        stored = np.asarray([int(np.asarray(r["image/class/label"]).reshape(-1)[0])
                             for r in ds.read_many(range(len(ds)))])
    figures = {
        "size": size, "batch_size": batch_size, "threads": workers, "batches": len(distinct),
        "images": int(all_labels.size), "image_shape": image_shape, "mask_shape": mask_shape,
        "labels_per_batch": float(np.mean(distinct)),
        "expected_labels_per_batch": float(expected_labels_per_batch(stored, batch_size)),
        "epoch_sha256": digest.hexdigest(),
    }
    return figures, all_labels.size / seconds


def _windows(path: str, workers: int) -> tuple[dict[str, Any], float]:
    from shardfeed.dataset import Dataset
    from shardfeed.pipeline import Loader, Windows
    from shardfeed.transforms import presets

    with Dataset(path) as ds:
        windows = Windows(ds, length=WINDOW_LENGTH, stride_seconds=WINDOW_STRIDE_SECONDS,
                          max_gap_seconds=WINDOW_MAX_GAP_SECONDS)
        excluded = windows.excluded
        count = 0
        image_shape = label_shape = None
        with Loader(windows, batch_size=16, shuffle=True, seed=SEED,
                    transform=presets.train(size=96, scale=(0.5, 1.0)), num_threads=workers,
                    drop_last=False) as loader:
            start_s = time.perf_counter()
            for batch in loader:
                count += int(batch["image"].shape[0])
                if image_shape is None:  # a full batch (the last one may be short)
                    image_shape = list(batch["image"].shape)
                    label_shape = list(np.asarray(batch["labels"]).shape)
            seconds = time.perf_counter() - start_s
        groups = ds.group_ids
        figures = {
            "length": WINDOW_LENGTH, "stride_seconds": WINDOW_STRIDE_SECONDS,
            "max_gap_seconds": WINDOW_MAX_GAP_SECONDS, "windows": len(windows),
            "samples": count, "records": len(ds),
            "groups": 0 if groups is None else len(np.unique(groups)),
            "excluded": {"group_end": excluded.group_end, "gap": excluded.gap,
                         "off_grid": excluded.off_grid, "missing_time": excluded.missing_time},
            "image_shape": image_shape, "label_shape": label_shape,
        }
    return figures, count / seconds


def _patches(
    path: str, sizes: DemoSizes, workers: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    from shardfeed.dataset import Dataset
    from shardfeed.pipeline import Loader, Patches

    cache_images = min(sizes.highres_images, max(2, sizes.highres_images // 2))
    refresh_every = 32
    with Dataset(path) as ds:
        patches = Patches(ds, size=PATCH_SIZE, cache_images=cache_images,
                          refresh_every=refresh_every)
        count = 0
        per_batch: list[int] = []
        with Loader(patches, batch_size=32, shuffle=True, seed=SEED, num_threads=workers,
                    drop_last=False) as loader:
            start_s = time.perf_counter()
            for batch in loader:
                count += int(batch["image"].shape[0])
                per_batch.append(len(np.unique(np.asarray(batch["patch/record"]))))
            seconds = time.perf_counter() - start_s
        stats = patches.cache_stats()
        figures = {
            "size": PATCH_SIZE, "cache_images": cache_images, "refresh_every": refresh_every,
            "images": len(ds), "patches": count, "batches": len(per_batch),
            "distinct_images_per_batch": float(np.mean(per_batch)),
        }
        # decodes depend on which thread asks first: a timing, kept out of summary.json
        decodes = None if stats is None else int(stats.loads)
    return figures, {"patches_per_s": count / seconds, "decodes": decodes}


def _shuffle(build: str, path: str, sizes: DemoSizes) -> dict[str, Any]:
    from shardfeed.tools.shuffle_report import shuffle_report

    buffer = max(2, sizes.labelled_images // 20)
    report = shuffle_report(path, buffer_size=buffer, seed=SEED, batch_size=64,
                            out_dir=os.path.join(build, "report"))
    rows = {}
    for name, key in (("exact", "shardfeed"), ("buffer", "buffer")):
        stats = report["orders"][key]
        rows[name] = {
            "description": stats["description"], "rho": stats["spearman_rho"],
            "displacement": stats["mean_abs_displacement"], "chi2_p": stats["chi2_p_value"],
            "latest_label": stats["latest_label"],
            "latest_first_position": stats["latest_first_position"],
            "labels_per_batch": stats["mean_labels_per_batch"],
        }
    plots = [os.path.relpath(p, build) for p in report["plots"].values()]
    return {"records": report["records"], "classes": report["classes"], "buffer": buffer,
            "batch_size": 64, **rows, "plots": plots}


def _bench(build: str, path: str, sizes: DemoSizes, workers: int, seconds: float) -> dict[str, Any]:
    from shardfeed.tools.bench import bench

    plot = os.path.join(build, "timings", "bench_throughput.png")
    width, height = sizes.frame_size
    result = bench(path, size=max(16, min(width, height) * 2 // 3),
                   batch_size=32, num_threads=workers, seconds=seconds,
                   warmup_seconds=min(1.0, seconds / 3), decode_seconds=max(0.2, seconds / 3),
                   plot=plot)
    limit = result["decode_limit"] or {}
    return {
        "seconds": result["seconds"], "threads": workers, "images_per_s": result["images_per_s"],
        "decode_limit_images_per_s": limit.get("images_per_s", float("nan")),
        "ratio_to_decode_limit": result["ratio_to_decode_limit"] or float("nan"),
        "time_to_first_batch_s": result["time_to_first_batch_s"],
        "peak_rss_bytes": result["peak_rss_bytes"],
        "memory_bound_bytes": result["memory_bound_bytes"],
        "plot": os.path.relpath(plot, build),
    }


def demo(
    out: str | os.PathLike[str],
    *,
    quick: bool = False,
    sizes: DemoSizes | None = None,
    workers: int = 2,
    bench_seconds: float | None = None,
    report: Report | None = None,
) -> dict[str, Any]:
    """Build the demo datasets in ``out`` and run the main jobs on them; see the module doc.

    ``quick`` uses :meth:`DemoSizes.quick` (a few seconds); ``sizes`` sets them explicitly.
    ``workers`` threads pack, verify and load. ``bench_seconds``: the bench's measured time
    (default 4, quick 0.5). ``report(line)`` is called at the start of every step.

    Returns ``{"summary": ..., "timings": ..., "text": ...}``: the figures written to
    ``summary.json`` (identical every run), those written to ``timings/timings.json``, and the
    printed summary. Raises ValueError when ``out`` exists and is not an earlier demo output.
    """
    if sizes is None:
        sizes = DemoSizes.quick() if quick else DemoSizes()
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an int >= 1, got {workers!r}")
    if bench_seconds is None:
        bench_seconds = 0.5 if quick else 4.0
    out_path = os.path.abspath(os.fspath(out))
    step = _Steps(report=report)
    build = start(out_path)
    os.makedirs(os.path.join(build, "timings"))
    datasets = _pack_all(build, sizes, workers, step)
    _verify_all(build, datasets, workers, step)
    jobs = _run_jobs(build, sizes, workers, bench_seconds, step)
    step("writing the summary")
    summary = _summary(os.fspath(out), sizes, datasets, jobs)
    timings = {
        "total_seconds": time.perf_counter() - step.began, "steps_started_at_s": step.times,
        "train": {"images_per_s": jobs.train_rate}, "windows": {"windows_per_s": jobs.windows_rate},
        "patches": jobs.patches_timing, "bench": jobs.bench,
    }
    text = format_summary(summary, timings)
    _write_results(build, summary, timings, text)
    finish(build, out_path)
    return {"summary": summary, "timings": timings, "text": text}


@dataclass(slots=True)
class _Steps:
    """Numbers the steps, notes when each started, and tells ``report`` of each."""

    report: Report | None
    began: float = field(default_factory=time.perf_counter)
    count: int = 0
    times: dict[str, float] = field(default_factory=dict)

    def __call__(self, text: str) -> None:
        self.count += 1
        self.times[text] = time.perf_counter() - self.began
        if self.report is not None:
            self.report(f"[{self.count}/{_STEPS}] {text}")


@dataclass(frozen=True, slots=True)
class _Jobs:
    """What the jobs over the packed datasets gave: figures and their speeds."""

    train: dict[str, Any]
    train_rate: float
    windows: dict[str, Any]
    windows_rate: float
    patches: dict[str, Any]
    patches_timing: dict[str, Any]
    shuffle: dict[str, Any]
    bench: dict[str, Any]


def _run_jobs(build: str, sizes: DemoSizes, workers: int, bench_seconds: float,
              step: Report) -> _Jobs:
    """A train epoch, windows, patches, a shuffle report and a short bench, in that order."""
    step("one shuffled train epoch over labelled")
    train, train_rate = _train_epoch(os.path.join(build, "datasets", "labelled"), sizes, workers)
    step("windows of 3 frames over timelapse")
    windows, windows_rate = _windows(os.path.join(build, "datasets", "timelapse"), workers)
    step("cached patches over highres")
    patches, patches_timing = _patches(os.path.join(build, "datasets", "highres"), sizes, workers)
    step("shuffle report over labelled")
    shuffle = _shuffle(build, os.path.join(build, "datasets", "labelled"), sizes)
    step("a short bench over timelapse")
    bench = _bench(build, os.path.join(build, "datasets", "timelapse"), sizes, workers,
                   bench_seconds)
    return _Jobs(train=train, train_rate=train_rate, windows=windows, windows_rate=windows_rate,
                 patches=patches, patches_timing=patches_timing, shuffle=shuffle, bench=bench)


def _summary(out: str, sizes: DemoSizes, datasets: dict[str, Any], jobs: _Jobs) -> dict[str, Any]:
    """The figures of ``summary.json``: identical every run."""
    return {
        "out": out, "sizes": {
            "days": sizes.days, "frames_per_day": sizes.frames_per_day,
            "frame_size": list(sizes.frame_size), "dropped": sizes.dropped,
            "highres_images": sizes.highres_images, "labelled_images": sizes.labelled_images,
            "crop_pixels": sizes.crop_pixels, "classes": sizes.classes,
        },
        "datasets": datasets, "train": jobs.train, "windows": jobs.windows,
        "patches": jobs.patches, "shuffle": jobs.shuffle,
    }


def _write_results(build: str, summary: dict[str, Any], timings: dict[str, Any],
                   text: str) -> None:
    """Write ``summary.json``, ``timings/timings.json`` and ``timings/summary.txt``."""
    _json_dump(os.path.join(build, "summary.json"), summary)
    _json_dump(os.path.join(build, "timings", "timings.json"), timings)
    with open(os.path.join(build, "timings", "summary.txt"), "w", encoding="utf-8") as f:
        f.write(text + "\n")
