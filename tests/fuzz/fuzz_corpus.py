"""The seed corpus of the fuzz target: valid files of every format shardfeed reads.

::

    corpus/
      packed/        2 shards of 5 records, shardfeed.json, groups.npy, order.npy,
                     .idx and .idx.npy per shard                       (pack's layout)
      packed-text/   the same without .idx.npy (the DALI text index is read)
      tf-text/       TensorFlow's mixed.tfrecord and second.tfrecord with DALI .idx files
      tf-binary/     mixed.tfrecord with an .idx.npy
      tf-bare/       mixed.tfrecord alone (its index is built when opened)
      ingest/        pack inputs: a WebDataset tar, an .npz, a Parquet file (fuzz_ingest)
      cache-seeds/   two entry files of the disk cache (fuzz_cache)
      cache-plans/   plans of hostile cache folders and of stopped holders (fuzz_cache_folders)
      hf/            a Hugging Face save_to_disk folder; hf-private/ the user's data beside
                     it (fuzz_hf)
"""

from __future__ import annotations

import itertools
import shutil
from pathlib import Path

import fuzz_cache
import fuzz_cache_folders
import fuzz_hf
import fuzz_ingest
import numpy as np

from shardfeed.format.framing import scan
from shardfeed.format.index import write_binary_index
from shardfeed.format.manifest import Manifest, save_sidecars
from shardfeed.format.schema import FeatureInfo, ImageInfo, Schema
from shardfeed.format.writer import ShardWriter

TF_FIXTURES = Path(__file__).resolve().parent.parent / "data" / "tf"
FOLDERS = ("packed", "packed-text", "tf-text", "tf-binary", "tf-bare", fuzz_ingest.FOLDER,
           fuzz_cache.FOLDER, fuzz_cache_folders.FOLDER, *fuzz_hf.FOLDERS)


def _packed(folder: Path) -> None:
    folder.mkdir(parents=True)
    infos = []
    i = 0
    for s in range(2):
        with ShardWriter(folder / f"train-{s:05d}.tfrecord") as writer:
            for _ in range(5):
                writer.write_example({
                    "image/encoded": bytes([i]) * (20 + 7 * i),
                    "image/format": b"jpeg",
                    "image/class/label": i % 3,
                    "image/height": 4, "image/width": 5,
                    "labels": [0.5 * i, 1.0, -2.0],
                    "names": [b"a", b"bc"],
                    "day": i // 4,
                    "timestamp": 8.0 * i,
                })
                i += 1
        infos.append(writer.close())
    schema = Schema(
        features={
            "image/encoded": FeatureInfo("image/encoded", "bytes", 1),
            "image/format": FeatureInfo("image/format", "bytes", 1),
            "image/class/label": FeatureInfo("image/class/label", "int64", 1),
            "image/height": FeatureInfo("image/height", "int64", 1),
            "image/width": FeatureInfo("image/width", "int64", 1),
            "labels": FeatureInfo("labels", "float", 3),
            "names": FeatureInfo("names", "bytes", 2),
            "day": FeatureInfo("day", "int64", 1),
            "timestamp": FeatureInfo("timestamp", "float", 1),
        },
        image=ImageInfo("image/encoded", "jpeg", "image/height", "image/width"),
        label_key="image/class/label",
    )
    Manifest(shards=infos, schema=schema, mode="embedded", group_key="day",
             order_key="timestamp", extra={"classes": ["a", "b", "c"]}).save(
        folder / "shardfeed.json")
    save_sidecars(folder, group_ids=np.arange(i) // 4, order_keys=8.0 * np.arange(i))


def build(root: Path) -> Path:
    """Write the seed corpus under ``root`` (which must not exist); return ``root``."""
    _packed(root / "packed")
    shutil.copytree(root / "packed", root / "packed-text")
    for npy in (root / "packed-text").glob("*.idx.npy"):
        npy.unlink()
    text = root / "tf-text"
    text.mkdir()
    for name in ("mixed", "second"):
        shutil.copy(TF_FIXTURES / f"{name}.tfrecord", text / f"{name}.tfrecord")
        shutil.copy(TF_FIXTURES / f"{name}.idx", text / f"{name}.tfrecord.idx")
    binary = root / "tf-binary"
    binary.mkdir()
    shutil.copy(TF_FIXTURES / "mixed.tfrecord", binary / "mixed.tfrecord")
    write_binary_index(binary / "mixed.tfrecord.idx.npy", scan(binary / "mixed.tfrecord"))
    bare = root / "tf-bare"
    bare.mkdir()
    shutil.copy(TF_FIXTURES / "mixed.tfrecord", bare / "mixed.tfrecord")
    fuzz_ingest.build(root / fuzz_ingest.FOLDER)
    fuzz_cache.build(root / fuzz_cache.FOLDER)
    fuzz_cache_folders.build(root / fuzz_cache_folders.FOLDER)
    fuzz_hf.build(root)
    return root


def payloads(shard: Path) -> list[bytes]:
    """The serialized Examples of a TFRecord file (framing stripped)."""
    data = shard.read_bytes()
    offsets = scan(shard).tolist()
    return [data[a + 12:b - 4] for a, b in itertools.pairwise(offsets)]
