"""The tf.data contender of the loader comparisons: TFRecordDataset over shardfeed's shards.

Runs in the bench-only environment that has tensorflow-cpu (bench/peers/make_tfenv.sh), never
in shardfeed's own. ``--kind train`` (default) is the standard ImageNet training input of
TensorFlow's reference models:

    TFRecordDataset(shards, num_parallel_reads=AUTOTUNE)
      .shuffle(10000)
      .map(parse Example -> sample_distorted_bounding_box (area 0.08-1, ratio 3/4-4/3)
           -> decode_and_crop_jpeg -> resize SIZExSIZE bilinear -> random flip -> uint8,
           num_parallel_calls=AUTOTUNE)
      .batch(BATCH, drop_remainder=True).prefetch(AUTOTUNE)

(SIZE 224 and BATCH 64 unless --size / --batch say otherwise). The small-image kinds read
records in stored order (no shuffle: the cheapest order for tf.data) and decode whole images:

    --kind png   parse_single_example -> decode_png(channels=1)
    --kind raw   parse_single_example -> decode_raw(uint8) -> reshape [SIZE, SIZE, 1]

with tf.data's private thread pool and TensorFlow's op pools set to --threads. Before timing it
reads every record of the shards unchanged and checks the record count and label sum against
what shardfeed wrote (tf.data reads our files as they are). Then it warms up (3 batches, which
also fills the shuffle buffer), times one epoch of batches, and prints one JSON line: images,
seconds, rate, CPU per image, peak RSS.

    /tmp/tfenv/bin/python bench/peers/tfdata_loader.py --shards DIR --records N --label-sum S
        [--kind train|png|raw] [--size 224] [--batch 64] [--threads 2]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import resource
import sys
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

SIZE = 224
BATCH = 64
SHUFFLE = 10_000
WARMUP_BATCHES = 3
KINDS = ("train", "png", "raw")


def _peak_rss_kib() -> int:
    """This process's peak RSS: VmHWM (ru_maxrss on Linux also counts the parent's peak at
    fork time)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def _features(tf: Any, kind: str) -> dict[str, Any]:
    image_key = "image/raw" if kind == "raw" else "image/encoded"
    return {
        image_key: tf.io.FixedLenFeature([], tf.string),
        "image/class/label": tf.io.FixedLenFeature([], tf.int64),
    }


def _preprocess(tf: Any, kind: str, size: int) -> Callable[[Any], tuple[Any, Any]]:
    """The per-record map function of ``kind``: serialized Example -> (uint8 image, label)."""
    features = _features(tf, kind)

    def train(serialized: Any) -> tuple[Any, Any]:
        parsed = tf.io.parse_single_example(serialized, features)
        data = parsed["image/encoded"]
        shape = tf.io.extract_jpeg_shape(data)
        begin, crop, _ = tf.image.sample_distorted_bounding_box(
            shape, bounding_boxes=tf.constant([0.0, 0.0, 1.0, 1.0], shape=[1, 1, 4]),
            min_object_covered=0.1, aspect_ratio_range=(3 / 4, 4 / 3), area_range=(0.08, 1.0),
            max_attempts=10, use_image_if_no_bounding_boxes=True,
        )
        y, x, _ = tf.unstack(begin)
        h, w, _ = tf.unstack(crop)
        window = tf.stack([y, x, h, w])
        image = tf.io.decode_and_crop_jpeg(data, window, channels=3)
        image = tf.image.resize(image, [size, size], method="bilinear")
        image = tf.image.random_flip_left_right(image)
        image = tf.cast(tf.clip_by_value(tf.round(image), 0, 255), tf.uint8)
        return image, parsed["image/class/label"]

    def png(serialized: Any) -> tuple[Any, Any]:
        parsed = tf.io.parse_single_example(serialized, features)
        image = tf.io.decode_png(parsed["image/encoded"], channels=1)
        return image, parsed["image/class/label"]

    def raw(serialized: Any) -> tuple[Any, Any]:
        parsed = tf.io.parse_single_example(serialized, features)
        pixels = tf.io.decode_raw(parsed["image/raw"], tf.uint8)
        return tf.reshape(pixels, [size, size, 1]), parsed["image/class/label"]

    return {"train": train, "png": png, "raw": raw}[kind]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--shards", required=True, help="folder of .tfrecord shards")
    parser.add_argument("--kind", choices=KINDS, default="train",
                        help="train: JPEG random crop + flip, shuffled; png / raw: whole "
                             "grey images in stored order")
    parser.add_argument("--size", type=int, default=SIZE,
                        help="output side (train) or stored side (raw)")
    parser.add_argument("--batch", type=int, default=BATCH)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--records", type=int, default=None, help="expected record count")
    parser.add_argument("--label-sum", type=int, default=None, help="expected sum of labels")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    import tensorflow as tf

    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.random.set_seed(args.seed)
    files = sorted(glob.glob(os.path.join(args.shards, "*.tfrecord")))
    if not files:
        sys.stderr.write(f"no .tfrecord files in {args.shards}\n")
        return 1

    # 1. tf.data reads shardfeed's shards unchanged: every record parses, counts and labels agree.
    features = _features(tf, args.kind)
    count = 0
    label_sum = 0
    for batch in tf.data.TFRecordDataset(files).batch(1024):
        parsed = tf.io.parse_example(batch, features)
        count += int(tf.shape(parsed["image/class/label"])[0])
        label_sum += int(tf.reduce_sum(parsed["image/class/label"]))
    reads_ok = (args.records is None or count == args.records) and (
        args.label_sum is None or label_sum == args.label_sum
    )

    # 2. the input pipeline.
    options = tf.data.Options()
    options.threading.private_threadpool_size = args.threads
    options.deterministic = False
    dataset = tf.data.TFRecordDataset(files, num_parallel_reads=tf.data.AUTOTUNE)
    if args.kind == "train":
        dataset = dataset.shuffle(SHUFFLE, seed=args.seed, reshuffle_each_iteration=True)
    dataset = (
        dataset.repeat()
        .map(_preprocess(tf, args.kind, args.size), num_parallel_calls=tf.data.AUTOTUNE)
        .batch(args.batch, drop_remainder=True)
        .prefetch(tf.data.AUTOTUNE)
        .with_options(options)
    )
    iterator = iter(dataset)
    for _ in range(WARMUP_BATCHES):
        next(iterator)
    batches = max(1, count // args.batch)
    start = time.perf_counter()
    cpu_start = time.process_time()  # every thread of this process, TensorFlow's included
    images = 0
    for _ in range(batches):
        image, _label = next(iterator)
        images += int(image.shape[0])
    seconds = time.perf_counter() - start
    cpu_ms = (time.process_time() - cpu_start) * 1000 / images
    peak_kib = _peak_rss_kib()
    print(json.dumps({
        "name": "tf.data", "kind": args.kind, "images": images, "seconds": seconds,
        "rate": images / seconds, "cpu_ms_per_image": cpu_ms, "rss_mib": peak_kib / 1024,
        "children_rss_mib": 0.0, "records_read": count, "label_sum": label_sum,
        "reads_ok": reads_ok, "tensorflow": tf.__version__,
    }))
    sys.stdout.flush()
    os._exit(0)  # skip TensorFlow's teardown once the figures are out


if __name__ == "__main__":
    sys.exit(main())
