"""What one fuzz input is, and how it is run through the public API.

An input is ``(seed, number)``: a target file of the seed corpus (a shard, an index of
either format, the manifest, a sidecar, or one Example payload) and one to three
mutations of it, all drawn from ``random.Random(f"{seed}:{number}")``. Running it writes the
mutated file into a private copy of the corpus, opens that dataset with
:class:`shardfeed.Dataset`, reads every record (one at a time, then all at once), asks for
the schema, fingerprint, manifest and sidecars, and calls the format readers directly
(index loaders, ``scan``, ``Manifest.load``, ``decode_example``). A mutated pack input (a
WebDataset tar or ``.tar.gz`` with JSON bombs, an ``.npz``, a hostile Parquet file, a damaged
``.arrow`` file of a Hugging Face folder; :mod:`fuzz_ingest`) is packed in bounded memory, and
what it wrote is read back. A mutated or swapped cache entry file is read through a
cache that must serve its own record or nothing (:mod:`fuzz_cache`); a cache folder changed as
another local user could (planted links, forged entries and rows, its key, its mode) is used,
and forked holders of its reservations are stopped or killed mid-write while a reader waits
(:mod:`fuzz_cache_folders`). A Hugging Face folder's
mutated ``state.json`` (files outside the folder, planted links; :mod:`fuzz_hf`) is packed, and
a pack holding the user's records from outside is a finding too. Any exception other than a
:class:`~shardfeed.errors.ShardfeedError` escapes: that is a finding.
"""

from __future__ import annotations

import random
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import fuzz_cache
import fuzz_cache_folders
import fuzz_corpus
import fuzz_hf
import fuzz_ingest
import fuzz_mutate as M
import numpy as np

from shardfeed import Dataset
from shardfeed.errors import ShardfeedError
from shardfeed.format.example import FeatureSpec, decode_example, example_kinds
from shardfeed.format.framing import frame, scan
from shardfeed.format.index import load_binary_index, parse_binary_index, parse_text_index
from shardfeed.format.manifest import Manifest

MAX_READS = 64
"""Records read one by one per input (the seeds hold at most 30)."""


@dataclass(frozen=True, slots=True)
class Target:
    """One seed file: ``folder``/``file`` of the corpus, mutated as ``family``."""

    name: str
    folder: str
    file: str
    family: str  # bytes | text | npy | json | example | tar | npz | parquet | cache | hf |
    #              cache-folder | cache-holders


TARGETS = (
    Target("manifest", "packed", "shardfeed.json", "json"),
    Target("groups-sidecar", "packed", "groups.npy", "npy"),
    Target("order-sidecar", "packed", "order.npy", "npy"),
    Target("packed-shard", "packed", "train-00000.tfrecord", "bytes"),
    Target("packed-binary-index", "packed", "train-00001.tfrecord.idx.npy", "npy"),
    Target("packed-text-index", "packed-text", "train-00000.tfrecord.idx", "text"),
    Target("tf-text-index", "tf-text", "mixed.tfrecord.idx", "text"),
    Target("tf-binary-index", "tf-binary", "mixed.tfrecord.idx.npy", "npy"),
    Target("tf-shard", "tf-text", "second.tfrecord", "bytes"),
    Target("tf-bare-shard", "tf-bare", "mixed.tfrecord", "bytes"),
    Target("example", "tf-bare", "mixed.tfrecord", "example"),
    Target("webdataset-tar", fuzz_ingest.FOLDER, fuzz_ingest.FILES["tar"], "tar"),
    Target("npz-archive", fuzz_ingest.FOLDER, fuzz_ingest.FILES["npz"], "npz"),
    Target("parquet-file", fuzz_ingest.FOLDER, fuzz_ingest.FILES["parquet"], "parquet"),
    Target("webdataset-tar-gz", fuzz_ingest.FOLDER, fuzz_ingest.FILES["targz"], "targz"),
    Target("cache-entry", fuzz_cache.FOLDER, "entry-0.rec", "cache"),
    Target("cache-entry-swapped", fuzz_cache.FOLDER, "entry-1.rec", "cache"),
    *(Target(name, fuzz_cache_folders.FOLDER, file, name)
      for name, file in fuzz_cache_folders.FILES.items()),
    *([Target("hf-state", fuzz_hf.FOLDER, "state.json", "hf")] if fuzz_hf.AVAILABLE else []),
    *([Target("hf-arrow", fuzz_hf.FOLDER, fuzz_hf.DATA, "arrow")] if fuzz_hf.AVAILABLE else []),
)
PACK_INPUTS = frozenset(fuzz_ingest.FILES)
"""Families whose file is a pack input, packed and then read back."""

SPECS = (
    {"image/class/label": FeatureSpec("int64", shape=())},
    {"labels": FeatureSpec("float", shape=(23,)), "day": FeatureSpec("int64", shape=(1,))},
    {"image/encoded": FeatureSpec("bytes", shape=()), "missing": FeatureSpec("int64",
                                                                              default=0)},
)


class Workspace:
    """A private copy of the corpus; each input changes one file, and :meth:`restore` puts
    the folder back as it was (files an opening wrote, such as built indexes, removed)."""

    def __init__(self, corpus: Path, work: Path) -> None:
        if work.exists():
            shutil.rmtree(work)
        shutil.copytree(corpus, work)
        self.root = work
        self.pristine = {
            folder: {p.name: p.read_bytes() for p in (work / folder).iterdir()}
            for folder in fuzz_corpus.FOLDERS
        }
        self.payloads = fuzz_corpus.payloads(work / "tf-text" / "mixed.tfrecord")

    def seed(self, target: Target) -> bytes:
        if target.family == "example":
            return self.payloads[0]
        return self.pristine[target.folder][target.file]

    def others(self, family: str) -> list[bytes]:
        """Seeds of the same family, to splice with."""
        if family == "example":
            return self.payloads
        return [self.pristine[t.folder][t.file] for t in TARGETS if t.family == family]

    def restore(self, folder: str) -> None:
        path = self.root / folder
        keep = self.pristine[folder]
        for entry in path.iterdir():
            if entry.is_symlink():
                entry.unlink()  # a planted link: removed, never written through
            elif entry.name not in keep:
                if entry.is_dir():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
        for name, data in keep.items():
            file = path / name
            if not file.is_file() or file.read_bytes() != data:
                file.write_bytes(data)


@dataclass(frozen=True, slots=True)
class Input:
    number: int
    target: Target
    data: bytes
    steps: tuple[str, ...]
    verify_crc: bool

    def describe(self) -> str:
        return f"input {self.number}: {self.target.name} <- {', '.join(self.steps)}"


FAMILY_MUTATIONS: dict[str, Callable[[random.Random, bytes], bytes]] = {
    "bytes": M.mutate_framing,
    "text": M.mutate_text_index,
    "npy": M.mutate_npy,
    "json": M.mutate_json,
    "example": M.mutate_example,
    "tar": fuzz_ingest.mutate_tar,
    "npz": fuzz_ingest.mutate_npz,
    "targz": fuzz_ingest.mutate_targz,
    "parquet": fuzz_ingest.mutate_parquet,
    "arrow": fuzz_ingest.mutate_arrow,
    "cache": fuzz_cache.mutate_entry,
    "cache-folder": fuzz_cache_folders.mutate_plan,
    "cache-holders": fuzz_cache_folders.mutate_plan,
    "hf": fuzz_hf.mutate_state,
}


def make_input(seed: int, number: int, ws: Workspace) -> Input:
    """The input ``number`` of the run ``seed`` (a pure function of both and the corpus)."""
    rng = random.Random(f"{seed}:{number}")
    target = rng.choice(TARGETS)
    data = ws.seed(target)
    if target.family == "example":
        data = rng.choice(ws.payloads)
    steps: list[str] = []
    for _ in range(rng.choice((1, 1, 2, 3))):
        roll = rng.random()
        family = FAMILY_MUTATIONS.get(target.family)
        if family is not None and roll < 0.55:
            data = family(rng, data)
            steps.append(family.__name__)
        elif roll < 0.9:
            name = rng.choice(sorted(M.BYTE_MUTATIONS))
            data = M.BYTE_MUTATIONS[name](rng, data)
            steps.append(name)
        else:
            data = M.splice(rng, data, rng.choice(ws.others(target.family)))
            steps.append("splice")
    return Input(number, target, data, tuple(steps), verify_crc=rng.random() < 0.7)


def _quietly(fn: Callable[[], Any]) -> Any:
    """``fn()``, or None when it raises a ShardfeedError (the only error allowed)."""
    try:
        return fn()
    except ShardfeedError:
        return None


def exercise_dataset(source: Path, *, verify_crc: bool) -> None:
    """Open ``source`` and use everything a user would: every record, one at a time and
    all at once, the schema, fingerprint, manifest, sidecars and locations."""
    ds = _quietly(lambda: Dataset(source, verify_crc=verify_crc))
    if ds is None:
        return
    with ds:
        n = min(len(ds), MAX_READS)
        for i in range(n):
            _quietly(partial(ds.__getitem__, i))
        _quietly(lambda: ds.read_many(range(n)))
        _quietly(lambda: ds.schema)
        _quietly(lambda: ds.fingerprint)
        _quietly(lambda: ds.manifest)
        if n:
            _quietly(lambda: ds.locate(n - 1))
        for values in (ds.group_ids, ds.order_keys):
            if values is not None:
                float(np.sum(values, dtype=np.float64))


def run_input(inp: Input, ws: Workspace) -> None:
    """Run one input; only ShardfeedError may escape the library (this raises any other)."""
    target = inp.target
    folder = ws.root / target.folder
    try:
        if target.family == "example":
            _example(inp.data, folder / target.file, ws)
            exercise_dataset(folder, verify_crc=inp.verify_crc)
        elif target.family == "cache":
            _quietly(lambda: fuzz_cache.read_back(inp.data, folder / "live"))
        elif target.family == "cache-folder":
            fuzz_cache_folders.hostile_folder(inp.data, folder / "live")
        elif target.family == "cache-holders":
            fuzz_cache_folders.holders(inp.data, folder / "live")
        elif target.family == "hf":
            out = fuzz_hf.run(inp.data, ws.root)
            if out is not None:
                exercise_dataset(out, verify_crc=inp.verify_crc)
        elif target.family == "arrow":
            packed = folder / "packed-out"
            if _quietly(lambda: fuzz_ingest.pack_saved(folder, inp.data, packed)):
                exercise_dataset(packed, verify_crc=inp.verify_crc)
        elif target.family in PACK_INPUTS:
            (folder / target.file).write_bytes(inp.data)
            out = folder / "packed-out"
            if _quietly(lambda: fuzz_ingest.pack(folder / target.file, out)):
                exercise_dataset(out, verify_crc=inp.verify_crc)
        else:
            (folder / target.file).write_bytes(inp.data)
            _direct(target, folder / target.file, inp.data)
            exercise_dataset(folder, verify_crc=inp.verify_crc)
    finally:
        ws.restore(target.folder)


def _direct(target: Target, path: Path, data: bytes) -> None:
    """The format readers called on the file by themselves."""
    if target.family == "text":
        _quietly(lambda: parse_text_index(data, path=str(path)))
    elif target.family == "npy" and path.name.endswith(".idx.npy"):
        _quietly(lambda: parse_binary_index(data, path=str(path)))
        _quietly(lambda: load_binary_index(path))
    elif target.family == "json":
        _quietly(lambda: Manifest.load(path))
    elif target.family == "bytes":
        _quietly(lambda: scan(path, verify_data=True))


def _example(payload: bytes, shard: Path, ws: Workspace) -> None:
    """A mutated Example decoded directly and, framed between two good records, read from a
    shard whose index is built at opening (the schema is then inferred from it)."""
    _quietly(lambda: decode_example(payload))
    _quietly(lambda: example_kinds(payload))
    for spec in SPECS:
        _quietly(partial(decode_example, payload, spec=spec, where="fuzz"))
    shard.write_bytes(frame(ws.payloads[1]) + frame(payload) + frame(ws.payloads[2]))
