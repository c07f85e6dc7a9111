"""Patches from a decoded-image cache vs decoding per patch; windows of frames vs single frames.

Patches: ``--images`` (200) JPEGs of 1566x1566, quality 90, made deterministically from
scikit-image's bundled photographs (resized up, each image flipped/rotated/shifted so that no
two are alike), packed into shards. Contenders, each a full epoch of its own loader:

- ``patches``: ``Patches(ds, size=32, cache_images=64, refresh_every=100)``, batch 32: every
  image is decoded once per residency, each output is a 32x32 crop of a cached image.
- ``naive``: a record loader whose transform decodes the whole image and cuts one random
  32x32 crop (one decode per patch), batch 32.

Reported: patches/s, the ratio patches/naive, and the mean share of distinct images in a
batch of 32 (targets: >= 20x, >= 75%).

Windows: a scaled-down time-lapse (``--days`` 20 x ``--frames`` 300 JPEGs of 320x320, one
every 8 s, with day and timestamp; group/order sidecars written by ``index_files``).
Contenders, each in its own subprocess (so peak RSS is its own), on T threads, transform
``presets.train(size=160)``, batch 32, ``--samples`` outputs timed after a warm-up batch:

- ``frames``: one frame a sample (the record loader).
- ``windows``: ``Windows(ds, length=3, stride=2)``: three frames a sample. The fair
  reference is a third of the frame rate (three decodes per sample).
- ``windows@D``: windows on the first D days (5, 10, 20): peak RSS should not grow with D.

Prints a table and the same figures as CSV. Measured (2 shared cores, 2 threads): patches
1,468/s vs naive 46.7/s (31.4x), 97.3% distinct images a batch, 200 decodes an epoch, cache
peak 505 of 505 MiB; windows 223/s vs frames 668/s (1.00x a third of the frame rate); peak
RSS 137 MiB at 5, 10 and 20 days.

    python bench/bench_windows_patches.py [--data bench/data/windows_patches] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

PATCH_SIDE = 1566
FRAME_SIDE = 320


# -- data -----------------------------------------------------------------------------------


def _photos() -> list[np.ndarray]:
    from skimage import data

    names = ("astronaut", "coffee", "chelsea", "rocket", "immunohistochemistry", "motorcycle_left",
             "retina", "hubble_deep_field")
    out = []
    for name in names:
        try:
            image = getattr(data, name)()
        except Exception:  # noqa: BLE001, S112 - some photos need a download; skip those
            continue
        if image.ndim == 3 and image.shape[2] == 3:
            out.append(np.ascontiguousarray(image[:, :, :3]))
    return out


def _variant(base: np.ndarray, i: int, side: int) -> np.ndarray:
    import cv2

    image = cv2.resize(base, (side, side), interpolation=cv2.INTER_CUBIC)
    image = np.rot90(image, k=i % 4)
    if (i // 4) % 2:
        image = image[:, ::-1]
    shift = (i * 97) % side
    return np.ascontiguousarray(np.roll(image, shift, axis=1))


def build_photos(folder: Path, count: int) -> Path:
    import simplejpeg

    from shardfeed.format.writer import ShardWriter

    if (folder / "done").exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    bases = _photos()
    per_shard = 50
    for s in range(0, count, per_shard):
        with ShardWriter(str(folder / f"photos-{s // per_shard:03d}.tfrecord")) as writer:
            for i in range(s, min(count, s + per_shard)):
                image = _variant(bases[i % len(bases)], i, PATCH_SIDE)
                writer.write_example({
                    "image/encoded": simplejpeg.encode_jpeg(image, quality=90),
                    "image/height": [PATCH_SIDE], "image/width": [PATCH_SIDE],
                    "index": [i], "label": [i % 10],
                })
    (folder / "done").write_text("ok")
    return folder


def build_frames(folder: Path, days: int, frames: int) -> Path:
    import simplejpeg

    from shardfeed.format.writer import ShardWriter
    from shardfeed.tools.index import index_files

    if (folder / "done").exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    bases = _photos()
    base = _variant(bases[0], 0, FRAME_SIDE * 2)
    for day in range(days):
        with ShardWriter(str(folder / f"day-{day:03d}.tfrecord")) as writer:
            for f in range(frames):
                # a slow pan across the scene, brighter at noon: every frame differs
                x = (f * 3 + day * 7) % FRAME_SIDE
                frame = base[FRAME_SIDE // 2 : FRAME_SIDE // 2 + FRAME_SIDE, x : x + FRAME_SIDE]
                level = 0.6 + 0.4 * np.sin(np.pi * f / frames)
                pixels = np.ascontiguousarray((frame * level).astype(np.uint8))
                writer.write_example({
                    "image/encoded": simplejpeg.encode_jpeg(pixels, quality=90),
                    "image/height": [FRAME_SIDE], "image/width": [FRAME_SIDE],
                    "day": [day], "timestamp": [23400.0 + 8.0 * f],
                    "labels": np.full(23, f / frames, dtype=np.float32),
                })
    index_files(folder, group_key="day", order_key="timestamp")
    (folder / "done").write_text("ok")
    return folder


# -- contenders (run in a child process) ----------------------------------------------------


def _time_loader(loader: Any, samples: int | None) -> tuple[int, float, list[dict[str, Any]]]:
    it = iter(loader)
    count = 0
    kept: list[dict[str, Any]] = []
    start = time.perf_counter()
    for batch in it:
        count += len(next(iter(batch.values())))
        if "index" in batch:
            kept.append({"index": np.asarray(batch["index"]).copy()})
        if samples is not None and count >= samples:
            break
    return count, time.perf_counter() - start, kept


class NaivePatch:
    """Decode the whole image, cut one random 32x32 crop: one decode per patch."""

    def __call__(self, sample: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
        from shardfeed.transforms.decode.image import decode_image

        image = decode_image(sample.pop("image/encoded"))
        y = int(rng.integers(0, image.shape[0] - 31))
        x = int(rng.integers(0, image.shape[1] - 31))
        sample["image"] = np.ascontiguousarray(image[y : y + 32, x : x + 32])
        return sample


def run_child(args: argparse.Namespace) -> dict[str, Any]:
    import shardfeed
    from shardfeed.pipeline.patches import Patches
    from shardfeed.pipeline.windows import Windows

    name, folder, threads = args.child, args.folder, args.threads[0]
    ds = shardfeed.Dataset(folder)
    result: dict[str, Any] = {"name": name, "threads": threads}
    if name == "patches":
        patches = Patches(ds, size=32, cache_images=64, refresh_every=100)
        loader = shardfeed.Loader(patches, batch_size=32, seed=0, num_threads=threads,
                                  drop_last=True)
        count, seconds, kept = _time_loader(loader, None)
        distinct = [len(set(b["index"].tolist())) / len(b["index"]) for b in kept]
        stats = patches.cache_stats()
        result.update(samples=count, seconds=seconds, distinct=float(np.mean(distinct)),
                      decodes=stats.loads if stats else 0,
                      cache_peak_bytes=stats.peak_bytes if stats else 0,
                      cache_max_bytes=stats.max_bytes if stats else 0)
    elif name == "naive":
        loader = shardfeed.Loader(ds, batch_size=32, seed=0, num_threads=threads,
                                  transform=NaivePatch(), drop_last=True)
        count, seconds, _ = _time_loader(loader, None)
        result.update(samples=count, seconds=seconds)
    else:
        transform = shardfeed.presets.train(size=160)
        source: Any = ds if name == "frames" else Windows(ds, length=3, stride=2)
        loader = shardfeed.Loader(source, batch_size=32, seed=0, num_threads=threads,
                                  transform=transform, drop_last=True)
        _time_loader(loader, 32)  # warm-up batch
        count, seconds, _ = _time_loader(loader, args.samples)
        result.update(samples=count, seconds=seconds, units=len(source))
    loader.close()
    result["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return result


def _spawn(name: str, folder: Path, threads: int, args: argparse.Namespace) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", name, "--folder", str(folder),
               "--threads", str(threads), "--samples", str(args.samples)]
    out = subprocess.run(command, check=True, capture_output=True, text=True)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="bench/data/windows_patches",
                        help="folder to build the data in once and reuse")
    parser.add_argument("--images", type=int, default=200)
    parser.add_argument("--days", type=int, default=20)
    parser.add_argument("--frames", type=int, default=300)
    parser.add_argument("--samples", type=int, default=1500,
                        help="samples timed per window/frame contender")
    parser.add_argument("--threads", type=int, nargs="+", default=[2])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(run_child(args)))
        return 0

    data = Path(args.data)
    photos = build_photos(data / f"photos-{args.images}", args.images)
    day_sets = sorted({d for d in (5, 10, args.days) if d <= args.days})
    frame_sets = {d: build_frames(data / f"frames-{d}x{args.frames}", d, args.frames)
                  for d in day_sets}
    rows: list[dict[str, Any]] = []
    for threads in args.threads:
        for name in ("patches", "naive"):
            rows.append(_spawn(name, photos, threads, args))
        for name in ("frames", "windows"):
            rows.append(_spawn(name, frame_sets[args.days], threads, args))
        for d in day_sets:
            row = _spawn("windows", frame_sets[d], threads, args)
            row["name"] = f"windows@{d}days"
            rows.append(row)

    def rate(name: str, threads: int) -> float:
        row = next(r for r in rows if r["name"] == name and r["threads"] == threads)
        return float(row["samples"] / row["seconds"])

    print(f"{'contender':<18}{'threads':>8}{'samples/s':>12}{'vs ref':>9}{'peak RSS':>11}"
          "  notes")
    csv = ["contender,threads,samples_per_s,ratio_to_reference,peak_rss_mib,notes"]
    for r in rows:
        t = r["threads"]
        per_s = r["samples"] / r["seconds"]
        ratio, notes = float("nan"), ""
        if r["name"] == "patches":
            ratio = per_s / rate("naive", t)
            notes = (f"distinct images/batch {100 * r['distinct']:.1f}%; decodes {r['decodes']}; "
                     f"cache peak {r['cache_peak_bytes'] / 2**20:.0f} of "
                     f"{r['cache_max_bytes'] / 2**20:.0f} MiB")
        elif r["name"].startswith("windows"):
            ratio = per_s / (rate("frames", t) / 3)
            notes = f"{r['units']} windows; ratio vs frames/3"
        elif r["name"] == "frames":
            notes = f"{r['units']} frames"
        print(f"{r['name']:<18}{t:>8}{per_s:>12.1f}{ratio:>9.2f}{r['peak_rss_mib']:>9.0f} MiB"
              f"  {notes}")
        csv.append(f"{r['name']},{t},{per_s:.1f},{ratio:.3f},{r['peak_rss_mib']:.0f},{notes}")
    print()
    print("\n".join(csv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
