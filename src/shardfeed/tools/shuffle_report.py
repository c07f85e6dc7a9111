"""The shuffle report: how shardfeed's exact shuffle compares with a shuffle buffer on your data.

:func:`shuffle_report` reads the label of every record (only the label feature is used), builds
the orders of one epoch:

- ``stored``: no shuffle, the order on disk (the baseline: rho = 1);
- ``shardfeed``: the exact shuffle, ``EpochOrder(n, seed=seed, epoch=epoch, shuffle=True)``;
- ``buffer``: a shuffle buffer of ``buffer_size`` over the stored order (tf.data's
  ``shuffle(buffer_size)``, DALI's ``random_shuffle``, WebDataset's ``shuffle``);
- ``file+buffer`` (with ``file_shuffle=True``): shard order shuffled, then the buffer;

and measures each one (see :mod:`shardfeed.tools.shuffle_stats`): Spearman rho of position vs
index, mean displacement, a chi-square test of position decile x index decile, the first
position of every label and the mean number of distinct labels per batch. With ``out_dir`` it
also draws the two plots of :mod:`shardfeed.tools.plots`.

The input can be a dataset (a path :class:`shardfeed.dataset.Dataset` opens, or an open
Dataset: open one yourself for a list of TFRecord files) or a plain array or list of labels,
one per record in stored order, to ask "what would a buffer do to data sorted like this?"
without any files.

Memory: the labels (one code per record) and a few int64 arrays of ``n``; reading labels holds
one chunk of decoded records at a time.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from shardfeed.errors import SchemaError
from shardfeed.tools.shuffle_buffer import (
    buffer_shuffle_order,
    file_shuffle_buffer_order,
)
from shardfeed.tools.shuffle_buffer import check_count as _check_int
from shardfeed.tools.shuffle_stats import expected_labels_per_batch, order_stats

__all__ = ["LabelSource", "read_labels", "shuffle_report"]

log = logging.getLogger(__name__)

DEFAULT_LABEL_KEY = "image/class/label"
_CHUNK_RECORDS = 1024  # records decoded at a time: bounded memory even for large images
_MAX_LISTED_CLASSES = 1000  # per-label first positions are listed up to this many classes

ORDER_DESCRIPTIONS = {
    "stored": "no shuffle (order on disk)",
    "shardfeed": "shardfeed exact shuffle",
    "buffer": "shuffle buffer ({buffer_size:,})",
    "file+buffer": "shard shuffle + buffer ({buffer_size:,})",
}

Progress = Callable[[int, int], None]


class LabelSource(Protocol):
    """What the report needs of a dataset: the contract of :class:`shardfeed.dataset.Dataset`."""

    def __len__(self) -> int: ...

    def read_many(self, indices: Sequence[int]) -> list[dict[str, Any]]: ...


def _label_value(value: Any) -> Any:
    """One record's label as a hashable scalar: int/float, str, or a tuple for a vector."""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", errors="replace")
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return tuple(_label_value(v) for v in value)
    array = np.asarray(value)
    if array.ndim == 0:
        return array.item()
    if array.size == 1:
        return array.reshape(-1)[0].item()
    return tuple(array.reshape(-1).tolist())


def _label_key(dataset: Any, label_key: str | None) -> str | None:
    if label_key is not None:
        return label_key
    schema = getattr(dataset, "schema", None)
    key = getattr(schema, "label_key", None)
    if key:
        return str(key)
    features = getattr(schema, "features", None) or {}
    return DEFAULT_LABEL_KEY if DEFAULT_LABEL_KEY in features else None


def read_labels(
    dataset: LabelSource,
    label_key: str,
    *,
    chunk_records: int = _CHUNK_RECORDS,
    progress: Progress | None = None,
) -> list[Any]:
    """The label of every record of ``dataset``, in stored order, read in chunks.

    Raises :class:`SchemaError` naming the record when one has no ``label_key`` feature.
    ``progress(done, total)`` is called after each chunk.
    """
    chunk_records = _check_int("chunk_records", chunk_records, minimum=1)
    total = len(dataset)
    labels: list[Any] = []
    for start in range(0, total, chunk_records):
        stop = min(start + chunk_records, total)
        for offset, record in enumerate(dataset.read_many(range(start, stop))):
            if label_key not in record:
                where = f"record {start + offset}"
                locate = getattr(dataset, "locate", None)
                if callable(locate):
                    from shardfeed.errors import location

                    path, index, byte = locate(start + offset)
                    where = location(path, index, byte)
                raise SchemaError(
                    f"{where} has no feature {label_key!r} (it has {sorted(record)}): "
                    f"pass label_key= (--label-key) naming the label feature"
                )
            labels.append(_label_value(record[label_key]))
        if progress is not None:
            progress(stop, total)
    return labels


def _encode_labels(
    values: Sequence[Any] | npt.NDArray[Any],
) -> tuple[npt.NDArray[np.int64], list[str]]:
    """Labels as integer codes ``0..K-1`` (sorted by value) and the K class names.

    One-hot label vectors count as the class of their 1; other vectors as whole tuples.
    """
    try:
        array = np.asarray(values)
    except ValueError:  # label vectors of different lengths
        array = np.empty(0, dtype=object)
    one_hot = (
        array.ndim == 2
        and array.dtype.kind in "biuf"
        and array.size > 0
        and bool(np.all((array == 0) | (array == 1)))
        and bool(np.all(array.sum(axis=1) == 1))
    )
    if one_hot:  # one-hot vectors: the class is the position of the 1
        array = np.argmax(array, axis=1)
    if array.dtype.kind in "biufUS" and array.ndim == 2:
        classes, codes = np.unique(array, axis=0, return_inverse=True)
        names = [str(tuple(row.tolist())) for row in classes]
    elif array.dtype.kind in "biufUS" and array.ndim == 1:
        classes, codes = np.unique(array, return_inverse=True)
        names = [str(c.item()) for c in classes]
    else:
        keys = list(values)
        try:
            ordered = sorted(set(keys))
        except TypeError:  # mixed kinds: order them by their text
            ordered = sorted(set(keys), key=str)
        code_of = {value: i for i, value in enumerate(ordered)}
        codes = np.fromiter((code_of[v] for v in keys), dtype=np.int64, count=len(keys))
        names = [str(v) for v in ordered]
    return np.asarray(codes, dtype=np.int64).reshape(-1), names


def _shard_sizes(dataset: Any) -> list[int] | None:
    manifest = getattr(dataset, "manifest", None)
    shards = getattr(manifest, "shards", None)
    if shards:
        return [int(shard.records) for shard in shards]
    return None


def _exact_order(n: int, *, seed: int, epoch: int) -> npt.NDArray[np.int64]:
    from shardfeed.sampling.permutation import EpochOrder

    return np.asarray(EpochOrder(n, seed=seed, epoch=epoch, shuffle=True)[0:n], dtype=np.int64)


def shuffle_report(
    path_or_dataset: str | os.PathLike[str] | LabelSource | npt.ArrayLike,
    *,
    label_key: str | None = None,
    buffer_size: int = 10_000,
    seed: int = 0,
    epoch: int = 0,
    file_shuffle: bool = False,
    batch_size: int = 256,
    out_dir: str | os.PathLike[str] | None = None,
    shard_sizes: Sequence[int] | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Compare shardfeed's exact shuffle with a shuffle buffer on one dataset; a JSON-able dict.

    ``path_or_dataset``: a dataset path (folder, manifest, glob, TFRecord file), an open
    Dataset, or an array of labels (one per record, stored order). ``label_key`` names the
    label feature (default: the schema's label key, else ``image/class/label``); without labels
    only the position statistics are computed. ``shard_sizes`` gives the shard record counts
    for ``file_shuffle`` when the input is a label array (a dataset knows its own).
    ``out_dir``: write ``position_vs_index.png`` and (with labels) ``label_vs_position.png``.
    ``progress(done, total)`` is called while labels are read.

    Returned keys: ``source``, ``records``, ``label_key``, ``classes``, ``class_names``
    (up to 1000), ``seed``, ``epoch``, ``buffer_size``, ``batch_size``, ``file_shuffle``,
    ``expected_labels_per_batch`` (a uniform shuffle's mean), ``orders`` (name -> statistics
    with a ``description``; see :meth:`OrderStats.to_json`) and ``plots`` (name -> path).
    """
    buffer_size = _check_int("buffer_size", buffer_size, minimum=1)
    batch_size = _check_int("batch_size", batch_size, minimum=1)
    seed = _check_int("seed", seed, minimum=0)
    epoch = _check_int("epoch", epoch, minimum=0)
    if not isinstance(file_shuffle, bool):
        raise TypeError(f"file_shuffle must be True or False, got {file_shuffle!r}")

    codes: npt.NDArray[np.int64] | None
    names: list[str] = []
    key: str | None = None
    if isinstance(path_or_dataset, (str, os.PathLike)) or hasattr(path_or_dataset, "read_many"):
        if isinstance(path_or_dataset, (str, os.PathLike)):
            from shardfeed.dataset import Dataset

            dataset: Any = Dataset(os.fspath(path_or_dataset))
            source = os.fspath(path_or_dataset)
            owned = True
        else:
            dataset, source, owned = path_or_dataset, type(path_or_dataset).__name__, False
        try:
            n = len(dataset)
            key = _label_key(dataset, label_key)
            if key is None:
                log.warning("no label feature found; pass label_key to get label statistics")
                codes = None
            else:
                codes, names = _encode_labels(read_labels(dataset, key, progress=progress))
            if file_shuffle and shard_sizes is None:
                shard_sizes = _shard_sizes(dataset)
        finally:
            if owned:
                dataset.close()
    else:
        labels = np.asarray(path_or_dataset)
        if labels.ndim not in (1, 2):
            raise TypeError(
                f"labels must be one label (or one label vector) per record, got shape "
                f"{labels.shape}; or pass a dataset path"
            )
        codes, names = _encode_labels(labels)
        n, source, key = int(labels.shape[0]), "labels", label_key
    if n < 2:
        raise ValueError(f"the dataset has {n} record(s): a shuffle report needs at least 2")

    orders: dict[str, npt.NDArray[np.int64]] = {
        "stored": np.arange(n, dtype=np.int64),
        "shardfeed": _exact_order(n, seed=seed, epoch=epoch),
        "buffer": buffer_shuffle_order(n, buffer_size, seed, epoch=epoch),
    }
    if file_shuffle:
        if shard_sizes is None:
            raise ValueError(
                "file_shuffle=True needs the record count of each shard: pass shard_sizes= "
                "with a label array, or a dataset whose manifest lists its shards"
            )
        if sum(shard_sizes) != n:
            raise ValueError(
                f"shard_sizes add up to {sum(shard_sizes)} records but there are {n}: "
                f"give the record count of every shard, in stored order"
            )
        orders["file+buffer"] = file_shuffle_buffer_order(
            shard_sizes, buffer_size, seed, epoch=epoch
        )

    summary: dict[str, Any] = {
        "source": source,
        "records": n,
        "label_key": key,
        "classes": None if codes is None else len(names),
        "class_names": names if codes is not None and len(names) <= _MAX_LISTED_CLASSES else None,
        "seed": seed,
        "epoch": epoch,
        "buffer_size": buffer_size,
        "batch_size": batch_size,
        "file_shuffle": file_shuffle,
        "expected_labels_per_batch": (
            None if codes is None else expected_labels_per_batch(codes, batch_size)
        ),
        "orders": {},
        "plots": {},
    }
    for name, order in orders.items():
        stats = order_stats(order, labels=codes, batch_size=batch_size, num_records=n).to_json()
        if stats["label_first_positions"] is not None:
            firsts = {names[int(c)]: p for c, p in stats["label_first_positions"].items()}
            stats["label_first_positions"] = firsts if len(firsts) <= _MAX_LISTED_CLASSES else None
            stats["latest_label"] = names[int(stats["latest_label"])]
        stats["description"] = ORDER_DESCRIPTIONS[name].format(buffer_size=buffer_size)
        summary["orders"][name] = stats

    if out_dir is not None:
        from shardfeed.tools import plots

        shown = {
            ORDER_DESCRIPTIONS[name].format(buffer_size=buffer_size): order
            for name, order in orders.items()
            if name != "stored"
        }
        folder = Path(out_dir)
        summary["plots"]["position_vs_index"] = str(
            plots.plot_position_vs_index(shown, folder / "position_vs_index.png")
        )
        if codes is not None:
            summary["plots"]["label_vs_position"] = str(
                plots.plot_label_vs_position(
                    shown, codes, folder / "label_vs_position.png", class_names=names
                )
            )
    return summary
