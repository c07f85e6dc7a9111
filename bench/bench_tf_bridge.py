"""The TensorFlow and Keras roads against the loader they wrap and the tf.data pipeline a
TensorFlow user would write, on the seeds' five workloads, in one run.

Workloads (batch ``--batch``, ``--threads`` threads; all data made here, in a temporary
folder):

    imagenet   JPEGs of 213x160, 320x240 and 427x320 with two label levels; random resized
               crop to 64, flip
    mnist      28x28 grey PNG digits; decoded whole
    masks      TensorFlow's guide layout (height, width, image_raw JPEG 320x240, mask_raw
               raw class ids); one crop and flip for both, to 64
    windows    time-lapse days of 160x160 JPEG frames with 23 float labels; windows of 3
               consecutive frames of a day, the last frame's labels; crop to 64
    patches    large photos (1024x768); random 32x32 patches from a cache of 8 decoded images

Contenders, each a whole epoch:

    loader         the Loader's own NumPy batches (``for batch in loader``)
    tf.dataset     shardfeed.tf.dataset(loader, features=[image, target]), drained inside a
                   tf.function (as Keras's compiled train step takes its batches)
    keras.adapt    shardfeed.keras.adapt(loader): the NumPy iterator of Keras's PyDataset
                   adapter, which Keras's JAX and torch backends iterate
    tf.data        the pipeline a TensorFlow user writes for the workload (TFRecordDataset,
                   shuffle buffer, map with num_parallel_calls=AUTOTUNE, batch, prefetch;
                   its private thread pool of ``--threads``), drained like tf.dataset

The tf.data graph drain costs a bare constant Dataset about 30-60 us an element on 2 cores:
that floor is in both TensorFlow contenders and not in the loader's own figure.
Rounds are interleaved (one epoch of each contender a round), each contender's first epoch
is a warm-up; the table gives the median images/s, the ratio to the loader, and the ratio
of tf.dataset to tf.data::

    .venv/bin/python bench/bench_tf_bridge.py [--batch 16] [--rounds 3] [--threads 2]
        [--only imagenet,mnist]

``--road-cost`` measures instead what the tf road itself costs a batch: a stand-in loader
hands out one real batch of each workload (copies from a small pool) at once, so the time of
``shardfeed.tf.dataset`` drained in a tf.function is the road's alone; beside it, the same
batch as a constant Dataset drained the same way (TensorFlow's own floor a batch).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_node  # its JPEG generator and photos
import numpy as np

SHUFFLE = 10_000
LABELS = 23  # the time-lapse user's float labels


@dataclass
class Workload:
    """One seed's data, its loader, and the tf.data pipeline its user would write."""

    name: str
    folder: Path
    loader: Callable[[int, int], Any]  # (threads, batch) -> Loader
    image: str
    target: str
    peer: Callable[[Any, list[str], int, int], Any]  # (tf, files, threads, batch) -> Dataset


def _write(folder: Path, rows: Iterable[dict[str, Any]], shards: int, count: int) -> list[Path]:
    from shardfeed.format.writer import ShardWriter

    folder.mkdir(parents=True)
    bounds = np.linspace(0, count, shards + 1).astype(int)
    paths = [folder / f"part-{s:05d}.tfrecord" for s in range(shards)]
    rows = iter(rows)
    for s, path in enumerate(paths):
        with ShardWriter(str(path)) as writer:
            for _ in range(bounds[s], bounds[s + 1]):
                writer.write_example(next(rows))
    return paths


# -- imagenet -----------------------------------------------------------------------------------

SIZES = ((160, 213), (240, 320), (320, 427))


def _imagenet(root: Path, count: int, threads: int) -> Workload:
    per = [bench_node.make_jpegs(count // 3 + 1, h, w, threads=threads, seed=7 + k)
           for k, (h, w) in enumerate(SIZES)]

    def rows() -> Iterable[dict[str, Any]]:
        for i in range(count):
            h, w = SIZES[i % 3]
            yield {"image/encoded": per[i % 3][i // 3], "image/format": b"jpeg",
                   "image/height": [h], "image/width": [w],
                   "image/class/label": [i % 1000], "image/class/superlabel": [i % 1000 // 100]}

    folder = root / "imagenet"
    _write(folder, rows(), 4, count)

    def loader(threads: int, batch: int) -> Any:
        import shardfeed

        return shardfeed.Loader(shardfeed.Dataset(str(folder)), batch_size=batch, shuffle=True,
                                seed=0, transform=shardfeed.presets.train(64),
                                num_threads=threads, drop_last=True)

    def peer(tf: Any, files: list[str], threads: int, batch: int) -> Any:
        features = {"image/encoded": tf.io.FixedLenFeature([], tf.string),
                    "image/class/label": tf.io.FixedLenFeature([], tf.int64)}

        def one(serialized: Any) -> tuple[Any, Any]:  # TensorFlow's ImageNet input
            parsed = tf.io.parse_single_example(serialized, features)
            data = parsed["image/encoded"]
            begin, crop, _ = tf.image.sample_distorted_bounding_box(
                tf.io.extract_jpeg_shape(data), tf.constant([0.0, 0.0, 1.0, 1.0], shape=[1, 1, 4]),
                min_object_covered=0.1, aspect_ratio_range=(3 / 4, 4 / 3),
                area_range=(0.08, 1.0), max_attempts=10, use_image_if_no_bounding_boxes=True)
            y, x, _ = tf.unstack(begin)
            h, w, _ = tf.unstack(crop)
            image = tf.io.decode_and_crop_jpeg(data, tf.stack([y, x, h, w]), channels=3)
            image = tf.image.random_flip_left_right(tf.image.resize(image, [64, 64]))
            return tf.cast(tf.round(image), tf.uint8), parsed["image/class/label"]

        return _records(tf, files, one, threads, batch)

    return Workload("imagenet", folder, loader, "image", "image/class/label", peer)


# -- mnist --------------------------------------------------------------------------------------


def _mnist(root: Path, count: int, threads: int) -> Workload:
    folder = bench_node.make_png28(root / "mnist", count)

    def loader(threads: int, batch: int) -> Any:
        import shardfeed

        return shardfeed.Loader(shardfeed.Dataset(str(folder)), batch_size=batch, shuffle=True,
                                seed=0, transform=shardfeed.transforms.DecodeImage(
                                    channels="gray"),
                                num_threads=threads, drop_last=True)

    def peer(tf: Any, files: list[str], threads: int, batch: int) -> Any:
        features = {"image/encoded": tf.io.FixedLenFeature([], tf.string),
                    "label": tf.io.FixedLenFeature([], tf.int64)}

        def one(serialized: Any) -> tuple[Any, Any]:
            parsed = tf.io.parse_single_example(serialized, features)
            return tf.io.decode_png(parsed["image/encoded"], channels=1), parsed["label"]

        return _records(tf, files, one, threads, batch)

    return Workload("mnist", folder, loader, "image", "label", peer)


# -- masks (TensorFlow's guide layout) ----------------------------------------------------------


def _masks(root: Path, count: int, threads: int) -> Workload:
    h, w = 240, 320
    jpegs = bench_node.make_jpegs(count, h, w, threads=threads, seed=11)
    y, x = np.mgrid[0:h, 0:w]

    def rows() -> Iterable[dict[str, Any]]:
        for i in range(count):
            mask = (((y // (8 + i % 5)) + (x // (8 + i % 7)) + i) % 5).astype(np.uint8)
            yield {"height": [h], "width": [w], "depth": [3], "image_raw": jpegs[i],
                   "mask_raw": mask.tobytes()}

    folder = root / "masks"
    _write(folder, rows(), 4, count)
    where = {"key": "image_raw", "mask_key": "mask_raw", "mask_encoding": "raw",
             "mask_height_key": "height", "mask_width_key": "width"}

    def loader(threads: int, batch: int) -> Any:
        import shardfeed

        return shardfeed.Loader(shardfeed.Dataset(str(folder)), batch_size=batch, shuffle=True,
                                seed=0, transform=shardfeed.presets.train(64, **where),
                                num_threads=threads, drop_last=True)

    def peer(tf: Any, files: list[str], threads: int, batch: int) -> Any:
        features = {"height": tf.io.FixedLenFeature([], tf.int64),
                    "width": tf.io.FixedLenFeature([], tf.int64),
                    "image_raw": tf.io.FixedLenFeature([], tf.string),
                    "mask_raw": tf.io.FixedLenFeature([], tf.string)}

        def one(serialized: Any) -> tuple[Any, Any]:
            parsed = tf.io.parse_single_example(serialized, features)
            image = tf.io.decode_jpeg(parsed["image_raw"], channels=3)
            mask = tf.reshape(tf.io.decode_raw(parsed["mask_raw"], tf.uint8),
                              tf.stack([parsed["height"], parsed["width"], 1]))
            begin, crop, _ = tf.image.sample_distorted_bounding_box(
                tf.shape(image), tf.constant([0.0, 0.0, 1.0, 1.0], shape=[1, 1, 4]),
                area_range=(0.08, 1.0), use_image_if_no_bounding_boxes=True)
            image = tf.image.resize(tf.slice(image, begin, crop), [64, 64])
            mask = tf.image.resize(tf.slice(mask, begin, tf.concat([crop[:2], [1]], 0)),
                                   [64, 64], method="nearest")
            flip = tf.random.uniform([]) < 0.5
            image = tf.cond(flip, lambda: tf.image.flip_left_right(image), lambda: image)
            mask = tf.cond(flip, lambda: tf.image.flip_left_right(mask), lambda: mask)
            return tf.cast(tf.round(image), tf.uint8), mask[..., 0]

        return _records(tf, files, one, threads, batch)

    return Workload("masks", folder, loader, "image", "mask", peer)


# -- windows ------------------------------------------------------------------------------------


def _windows(root: Path, count: int, threads: int) -> Workload:
    from shardfeed.tools.index import index_files

    side, days = 160, 8
    jpegs = bench_node.make_jpegs(count, side, side, threads=threads, seed=13)
    per_day = count // days
    rng = np.random.Generator(np.random.Philox(2))
    labels = rng.random((count, LABELS), dtype=np.float32)

    def rows() -> Iterable[dict[str, Any]]:
        for i in range(count):
            yield {"image/encoded": jpegs[i], "image/format": b"jpeg",
                   "image/height": [side], "image/width": [side],
                   "day": [i // per_day], "timestamp": [float(i % per_day) * 8.0],
                   "labels": labels[i]}

    folder = root / "windows"
    _write(folder, rows(), days, per_day * days)
    index_files(folder, group_key="day", order_key="timestamp")

    def loader(threads: int, batch: int) -> Any:
        import shardfeed

        windows = shardfeed.Windows(shardfeed.Dataset(str(folder)), length=3)
        return shardfeed.Loader(windows, batch_size=batch, shuffle=True, seed=0,
                                transform=shardfeed.presets.train(64), num_threads=threads,
                                drop_last=True)

    def peer(tf: Any, files: list[str], threads: int, batch: int) -> Any:
        features = {"image/encoded": tf.io.FixedLenFeature([], tf.string),
                    "day": tf.io.FixedLenFeature([], tf.int64),
                    "labels": tf.io.FixedLenFeature([LABELS], tf.float32)}

        def frames(window: Any) -> Any:
            return tf.data.Dataset.zip(tuple(window[k].batch(3) for k in range(3)))

        def one(encoded: Any, day: Any, labels: Any) -> tuple[Any, Any]:
            begin, crop, _ = tf.image.sample_distorted_bounding_box(
                tf.io.extract_jpeg_shape(encoded[0]),
                tf.constant([0.0, 0.0, 1.0, 1.0], shape=[1, 1, 4]), area_range=(0.08, 1.0),
                use_image_if_no_bounding_boxes=True)
            window = tf.stack([begin[0], begin[1], crop[0], crop[1]])
            images = [tf.image.resize(tf.io.decode_and_crop_jpeg(encoded[k], window, channels=3),
                                      [64, 64]) for k in range(3)]
            return tf.cast(tf.round(tf.stack(images)), tf.uint8), labels[2]

        parsed = tf.data.TFRecordDataset(files).map(  # frames in day and time order
            lambda s: tuple(tf.io.parse_single_example(s, features)[k]
                            for k in ("image/encoded", "day", "labels")))
        windows = parsed.window(3, shift=1, drop_remainder=True).flat_map(
            lambda *w: frames(w)).filter(lambda e, d, _: d[0] == d[2])  # within one day
        return _finish(tf, windows.shuffle(SHUFFLE).map(
            one, num_parallel_calls=tf.data.AUTOTUNE), threads, batch)

    return Workload("windows", folder, loader, "image", "labels", peer)


# -- patches ------------------------------------------------------------------------------------

CACHE, REFRESH = 8, 32


def _patches(root: Path, count: int, threads: int) -> Workload:
    jpegs = bench_node.make_jpegs(count, 768, 1024, threads=threads, seed=17)

    def rows() -> Iterable[dict[str, Any]]:
        for i in range(count):
            yield {"image/encoded": jpegs[i], "image/format": b"jpeg",
                   "image/height": [768], "image/width": [1024], "image/class/label": [i]}

    folder = root / "patches"
    _write(folder, rows(), 2, count)

    def loader(threads: int, batch: int) -> Any:
        import shardfeed

        patches = shardfeed.Patches(shardfeed.Dataset(str(folder)), size=32,
                                    cache_images=CACHE, refresh_every=REFRESH)
        return shardfeed.Loader(patches, batch_size=batch, shuffle=True, seed=0,
                                num_threads=threads, drop_last=True)

    def peer(tf: Any, files: list[str], threads: int, batch: int) -> Any:
        features = {"image/encoded": tf.io.FixedLenFeature([], tf.string),
                    "image/class/label": tf.io.FixedLenFeature([], tf.int64)}

        def decode(serialized: Any) -> tuple[Any, Any]:
            parsed = tf.io.parse_single_example(serialized, features)
            return tf.io.decode_jpeg(parsed["image/encoded"], channels=3), \
                parsed["image/class/label"]

        ds = tf.data.TFRecordDataset(files).shuffle(count).map(
            decode, num_parallel_calls=tf.data.AUTOTUNE)
        # each decoded image gives REFRESH patches; a buffer of CACHE images' patches mixes them
        patches = ds.flat_map(lambda image, label: tf.data.Dataset.from_tensors(
            (image, label)).repeat(REFRESH)).map(
            lambda image, label: (tf.image.random_crop(image, [32, 32, 3]), label),
            num_parallel_calls=tf.data.AUTOTUNE)
        return _finish(tf, patches.shuffle(CACHE * REFRESH), threads, batch)

    return Workload("patches", folder, loader, "image", "image/class/label", peer)


def _records(tf: Any, files: list[str], one: Callable[[Any], Any], threads: int,
             batch: int) -> Any:
    """The usual tf.data input: records read in parallel, a shuffle buffer, ``one`` on each
    with AUTOTUNE parallelism, batched and prefetched."""
    ds = tf.data.TFRecordDataset(files, num_parallel_reads=tf.data.AUTOTUNE)
    return _finish(tf, ds.shuffle(SHUFFLE).map(one, num_parallel_calls=tf.data.AUTOTUNE),
                   threads, batch)


def _finish(tf: Any, ds: Any, threads: int, batch: int) -> Any:
    options = tf.data.Options()
    options.threading.private_threadpool_size = threads
    return ds.batch(batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE).with_options(options)


BUILDERS = {"imagenet": (_imagenet, 1536), "mnist": (_mnist, 20000), "masks": (_masks, 1024),
            "windows": (_windows, 1024), "patches": (_patches, 96)}


# -- the run ------------------------------------------------------------------------------------


def _timed(images: Callable[[], int]) -> tuple[float, float]:
    """(images/s, CPU microseconds an image: every thread of this process)."""
    start, cpu = time.perf_counter(), time.process_time()
    n = images()
    return n / (time.perf_counter() - start), (time.process_time() - cpu) * 1e6 / n


def contenders(tf: Any, work: Workload, threads: int, batch: int) -> dict[str, Callable[[], int]]:
    """One epoch of each contender, as a function giving the images it read."""
    from keras.src.trainers.data_adapters.py_dataset_adapter import PyDatasetAdapter

    import shardfeed

    plain = work.loader(threads, batch)
    bridged = shardfeed.tf.dataset(work.loader(threads, batch),
                                   features=[work.image, work.target])
    adapted = PyDatasetAdapter(shardfeed.keras.adapt(work.loader(threads, batch),
                                                     inputs=work.image, targets=work.target))
    files = sorted(str(p) for p in work.folder.glob("*.tfrecord"))
    peer = work.peer(tf, files, threads, batch)
    steps = len(plain)

    @tf.function
    def drain(ds: Any) -> Any:
        count = tf.constant(0, tf.int64)
        for element in ds:
            count += tf.cast(tf.shape(tf.nest.flatten(element)[0])[0], tf.int64)
        return count

    def keras_epoch() -> int:
        adapted.on_epoch_begin()
        n = sum(len(y) for _, y in adapted.get_numpy_iterator())
        adapted.on_epoch_end()
        return n

    return {
        "loader": lambda: sum(len(b[work.target]) for b in plain),
        "tf.dataset": lambda: int(drain(bridged)),
        "keras.adapt": keras_epoch,
        "tf.data": lambda: int(drain(peer.take(steps))),
    }


class _Instant:
    """A stand-in loader for ``--road-cost``: ``count`` batches a pass, handed out at once
    (the pool's batches in turn), with the loader interface ``shardfeed.tf.dataset`` uses."""

    def __init__(self, batch: dict[str, Any], count: int, loader: Any) -> None:
        self.batch_stages: list[Any] = []
        self.pool = [{k: (v.copy() if isinstance(v, np.ndarray) else list(v))
                      for k, v in batch.items()} for _ in range(8)]
        self.count, self.options, self.position = count, loader.options, 0
        self.batch_layout = loader.batch_layout  # the real one: the road's blocks as in use

    def state(self) -> dict[str, int]:
        return {"position": self.position}

    def restore(self, state: dict[str, int]) -> None:
        self.position = state["position"]

    def reserve_held_batches(self, count: int) -> None:
        pass

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Any:
        while self.position < self.count:
            self.position += 1
            yield self.pool[self.position % len(self.pool)]
        self.position = 0


def road_cost(tf: Any, work: Workload, threads: int, batch: int, batches: int) -> None:
    """Print the tf road's own cost a batch, and TensorFlow's floor (see the module doc)."""
    import shardfeed

    real = work.loader(threads, batch)
    first = next(iter(real))
    road = shardfeed.tf.dataset(_Instant(first, batches, real),
                                features=[work.image, work.target])
    kept = {k: first[k] for k in (work.image, work.target)}
    floor = tf.data.Dataset.from_tensors(kept).repeat(batches)

    @tf.function
    def drain(ds: Any) -> Any:
        count = tf.constant(0, tf.int64)
        for _ in ds:
            count += 1
        return count

    for label, ds in (("tf.dataset", road), ("constant", floor)):
        drain(ds)
        runs = []
        for _ in range(3):
            start, cpu = time.perf_counter(), time.process_time()
            n = int(drain(ds))
            runs.append(((time.perf_counter() - start) * 1e6 / n,
                         (time.process_time() - cpu) * 1e6 / n))
        wall, used = sorted(runs)[1]
        print(f"{work.name:<10}{label:<13}{wall:>12,.1f}{used:>12,.1f}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--scale", type=float, default=4.0,
                        help="records made, times each workload's base count (default 4: "
                             "epochs of about 1-3 s on 2 cores, so a pass's start and end "
                             "weigh as they do in training)")
    parser.add_argument("--only", default=",".join(BUILDERS),
                        help="workloads, comma-separated (default: all five)")
    parser.add_argument("--road-cost", action="store_true",
                        help="measure the tf road's own cost a batch with a stand-in loader "
                             "that costs nothing (see the module doc)")
    args = parser.parse_args(argv)

    import tensorflow as tf

    names = [n for n in args.only.split(",") if n]
    unknown = sorted(set(names) - set(BUILDERS))
    if unknown:
        parser.error(f"unknown workloads {unknown}; choose among {sorted(BUILDERS)}")
    if args.road_cost:
        print(f"batch {args.batch}, 4,000 batches a pass, median of 3 passes, "
              f"{os.cpu_count()} CPUs, TensorFlow {tf.__version__}")
        print(f"{'workload':<10}{'drained':<13}{'wall us/b':>12}{'CPU us/b':>12}")
        with tempfile.TemporaryDirectory(prefix="shardfeed-tfroad-") as tmp:
            for name in names:
                build, count = BUILDERS[name]
                work = build(Path(tmp), max(1, round(count * args.scale / 8)), args.threads)
                road_cost(tf, work, args.threads, args.batch, 4000)
        return 0
    print(f"batch {args.batch}, {args.threads} threads, median of {args.rounds} interleaved "
          f"epochs, {os.cpu_count()} CPUs, TensorFlow {tf.__version__}")
    print(f"{'workload':<10}{'contender':<13}{'images/s':>10}{'vs loader':>11}"
          f"{'vs tf.data':>12}{'CPU us/img':>12}   epochs")
    with tempfile.TemporaryDirectory(prefix="shardfeed-tfbridge-") as tmp:
        for name in names:
            build, count = BUILDERS[name]
            work = build(Path(tmp), max(1, round(count * args.scale)), args.threads)
            epochs = contenders(tf, work, args.threads, args.batch)
            rates: dict[str, list[float]] = {k: [] for k in epochs}
            cpu: dict[str, list[float]] = {k: [] for k in epochs}
            for epoch in epochs.values():  # warm-up: files, caches, tracing, shuffle buffers
                epoch()
            for _ in range(args.rounds):
                for key, epoch in epochs.items():
                    rate, used = _timed(epoch)
                    rates[key].append(rate)
                    cpu[key].append(used)
            medians = {k: statistics.median(v) for k, v in rates.items()}
            for key, values in rates.items():
                versus_peer = (f"{medians[key] / medians['tf.data']:>11.2f}x"
                               if key != "tf.data" else f"{'':>12}")
                shown = ", ".join(f"{v:,.0f}" for v in values)
                print(f"{name:<10}{key:<13}{medians[key]:>10,.0f}"
                      f"{medians[key] / medians['loader']:>10.2f}x{versus_peer}"
                      f"{statistics.median(cpu[key]):>12,.1f}   {shown}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
