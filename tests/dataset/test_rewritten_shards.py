"""A local shard replaced while a Dataset has it open (a file renamed over it, at the same
size, the manifest left as it was) is never read as its old bytes: the next read raises
ShardChangedError naming the shard, on every read path (ranges, mapped gather, a Loader's
compiled slices); a Dataset opened after reads the new bytes. A shard written over in place
is read as it is now."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shardfeed import Dataset, Loader, ShardChangedError, StorageError
from shardfeed.format.writer import ShardWriter
from shardfeed.pipeline import native_slices
from shardfeed.storage import versions
from shardfeed.tools.index import index_files
from shardfeed.tools.pack import pack
from shardfeed.tools.pack.rows import RowFields
from shardfeed.transforms import DecodeImage

N = 64


@pytest.fixture()
def settle(monkeypatch: pytest.MonkeyPatch) -> None:
    """Folders count as settled at once (not 2 s after their last change, which a test's
    own writes are): a read then looks at a folder alone while it is unchanged."""
    monkeypatch.setattr(versions, "SETTLED_SECONDS", 0.0)


def write_shard(path: Path, prefix: str) -> None:
    """``N`` records named ``{prefix}000``...: the same size for any one-letter prefix.
    Written as every tool writes: a temporary file renamed over the shard."""
    with ShardWriter(str(path)) as writer:
        for i in range(N):
            writer.write_example({"index": [i], "name": f"{prefix}{i:03d}".encode()})


def names(ds: Dataset) -> list[bytes]:
    return [bytes(r["name"]) for r in ds.read_many(range(len(ds)))]  # type: ignore[arg-type]


def expected(prefix: str) -> list[bytes]:
    return [f"{prefix}{i:03d}".encode() for i in range(N)]


@pytest.fixture()
def indexed(tmp_path: Path) -> Path:
    """A dataset folder of one shard with its index and manifest."""
    folder = tmp_path / "ds"
    folder.mkdir()
    write_shard(folder / "part-000.tfrecord", "a")
    index_files(str(folder))
    return folder


@pytest.mark.parametrize("path", ["mapped", "ranges"])
@pytest.mark.parametrize("settled", [False, True])
def test_a_shard_replaced_at_the_same_size_raises_on_the_next_read(
        indexed: Path, path: str, settled: bool, request: pytest.FixtureRequest) -> None:
    shard = indexed / "part-000.tfrecord"
    if settled:  # each read is one stat of the folder while it is unchanged
        request.getfixturevalue("settle")
    with Dataset(str(indexed)) as ds:
        if path == "ranges":  # as with more shards than stay open, or no compiled part
            ds._shards.can_gather = False
        assert names(ds) == expected("a")
        size = shard.stat().st_size
        write_shard(shard, "b")  # the manifest is left as it was
        assert shard.stat().st_size == size
        for _ in range(2):  # and again: never the old bytes
            with pytest.raises(ShardChangedError, match="changed since this Dataset opened "
                               "it .* open the Dataset again") as raised:
                ds.read_many(range(N))
            assert raised.value.path == str(shard) and raised.value.found is not None
            assert isinstance(raised.value, StorageError)
    with Dataset(str(indexed)) as ds:  # opened after the rewrite: the new bytes
        assert names(ds) == expected("b")


def test_a_shard_replaced_before_its_first_read_raises(indexed: Path) -> None:
    """The Dataset opened (and read the manifest and indexes) before the rewrite: the file
    its first read opens is not the one it opened with."""
    with Dataset(str(indexed)) as ds:
        write_shard(indexed / "part-000.tfrecord", "b")
        with pytest.raises(ShardChangedError):
            ds.read_many([0])


def test_a_removed_shard_is_named_gone(indexed: Path) -> None:
    with Dataset(str(indexed)) as ds:
        assert ds[0]["name"] == b"a000"
        os.remove(indexed / "part-000.tfrecord")
        with pytest.raises(ShardChangedError, match="it is gone"):
            ds.read_many([1])


def test_a_linked_shard_whose_target_is_replaced_raises(tmp_path: Path, settle: None) -> None:
    """The link's folder is unchanged; its target's folder is watched too."""
    blobs, ds_folder = tmp_path / "blobs", tmp_path / "ds"
    blobs.mkdir()
    ds_folder.mkdir()
    write_shard(blobs / "blob-1", "a")
    (ds_folder / "part-000.tfrecord").symlink_to(blobs / "blob-1")
    with Dataset(str(ds_folder / "part-000.tfrecord")) as ds:
        assert names(ds) == expected("a")
        write_shard(blobs / "blob-1", "b")
        with pytest.raises(ShardChangedError):
            ds.read_many(range(N))


def test_a_shard_written_over_in_place_reads_the_new_bytes(indexed: Path,
                                                           settle: None) -> None:
    """The same file written over (not replaced, its folder unchanged): what is read is
    what is there now, never the old bytes."""
    shard = indexed / "part-000.tfrecord"
    other = indexed.parent / "other.tfrecord"
    write_shard(other, "b")
    with Dataset(str(indexed)) as ds:
        assert names(ds) == expected("a")
        with open(shard, "r+b") as handle:
            handle.write(other.read_bytes())
        assert names(ds) == expected("b")


def test_a_loader_pass_after_the_rewrite_raises(indexed: Path) -> None:
    with Dataset(str(indexed)) as ds, Loader(ds, batch_size=16, shuffle=True, seed=1,
                                             transform=None, num_threads=2) as loader:
        first = [n for batch in loader for n in batch["name"]]
        assert sorted(first) == expected("a")
        write_shard(indexed / "part-000.tfrecord", "b")
        loader.set_epoch(1)
        with pytest.raises(ShardChangedError):
            for _ in loader:
                pass


def _digits(seed: int) -> tuple[np.ndarray, np.ndarray]:
    pixels = np.random.default_rng(seed).integers(0, 256, (96, 28, 28, 1), dtype=np.uint8)
    return pixels, np.arange(96, dtype=np.int64) % 10


def replace_then_next_epoch_raises(shard: Path, source: Path, loader: Any) -> None:
    """``shard`` replaced by a copy of ``source`` of its size, as tools write (a temporary
    file renamed over it), then the loader's next epoch raises ShardChangedError."""
    replacement = shard.with_name("replacement.tmp")
    shutil.copyfile(source, replacement)
    assert replacement.stat().st_size == shard.stat().st_size
    os.replace(replacement, shard)
    loader.set_epoch(1)
    with pytest.raises(ShardChangedError):
        for _ in loader:
            pass


@pytest.mark.skipif(native_slices.compiled is None, reason="built without the compiled slice")
def test_the_compiled_slices_raise_after_the_rewrite(tmp_path: Path) -> None:
    """Raw images built a slice in one compiled call from the mapped shards: the map of the
    replaced file keeps the old pixels, so the call's read is checked too."""
    old, new = tmp_path / "old", tmp_path / "new"
    for folder, seed in ((old, 5), (new, 6)):
        pack(_digits(seed), str(folder), records_per_shard=48, overwrite=True,
             fields=RowFields(encode="raw"))
    shard = min(old.glob("*.tfrecord"))
    with Dataset(str(old)) as ds, Loader(ds, batch_size=16, seed=2, num_threads=2,
                                         transform=DecodeImage(channels="gray")) as loader:
        assert sum(len(b["image"]) for b in loader) == 96
        native = loader._builder._native
        assert native is not None and native.enabled and native._built > 0
        replace_then_next_epoch_raises(shard, new / shard.name, loader)
