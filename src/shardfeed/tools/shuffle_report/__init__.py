"""The shuffle report: how shardfeed's exact shuffle compares with a shuffle buffer on your data.

:func:`shuffle_report` reads the label of every record (only the label feature is used), builds
the orders of one epoch:

- ``stored``: no shuffle, the order on disk (the baseline: rho = 1);
- ``shardfeed``: the exact shuffle, ``EpochOrder(n, seed=seed, epoch=epoch, shuffle=True)``;
- ``buffer``: a shuffle buffer of ``buffer_size`` over the stored order (tf.data's
  ``shuffle(buffer_size)``, DALI's ``random_shuffle``, WebDataset's ``shuffle``);
- ``file+buffer`` (with ``file_shuffle=True``): shard order shuffled, then the buffer;

and measures each one (see :mod:`shardfeed.tools.shuffle_report.stats`): Spearman rho of position vs
index, mean displacement, a chi-square test of position bin x index bin, the first position of
every label and the mean number of distinct labels per batch; then judges each, from those
figures, as ``not uniform``, ``looks uniform`` or ``too small to tell`` (see
:mod:`shardfeed.tools.shuffle_report.verdict`). With ``out_dir`` it also draws the two plots of
:mod:`shardfeed.tools.shuffle_report.plots`.

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
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from shardfeed.pipeline.mixture import Mixture
from shardfeed.tools.shuffle_report.buffer import (
    buffer_shuffle_order,
    file_shuffle_buffer_order,
)
from shardfeed.tools.shuffle_report.buffer import check_count as _check_int
from shardfeed.tools.shuffle_report.labels import (
    LabelSource,
    Progress,
    check_label_feature,
    class_features,
    encode_labels,
    label_key_of,
    read_labels,
)
from shardfeed.tools.shuffle_report.mixture import mixture_report
from shardfeed.tools.shuffle_report.stats import expected_labels_per_batch, order_stats
from shardfeed.tools.shuffle_report.verdict import Design, class_counts

__all__ = ["LabelSource", "mixture_report", "read_labels", "shuffle_report"]

log = logging.getLogger(__name__)

_MAX_LISTED_CLASSES = 1000  # per-label first positions are listed up to this many classes

ORDER_DESCRIPTIONS = {
    "stored": "no shuffle (order on disk)",
    "shardfeed": "shardfeed exact shuffle",
    "buffer": "shuffle buffer ({buffer_size:,})",
    "file+buffer": "shard shuffle + buffer ({buffer_size:,})",
}

def _named_classes(dataset: Any, key: str, names: list[str]) -> list[str]:
    """The class names the manifest keeps for ``key`` (pack's class folders, one-hot
    vocabularies) in place of the label values "0", "1", ...; ``names`` as they are otherwise."""
    extra = getattr(getattr(dataset, "manifest", None), "extra", None) or {}
    vocabulary = (extra.get("vocabularies") or {}).get(key)
    if not vocabulary:
        return names
    try:
        values = [int(name) for name in names]
    except ValueError:
        return names
    if any(not 0 <= v < len(vocabulary) for v in values):
        return names
    return [str(vocabulary[v]) for v in values]


def _shard_sizes(dataset: Any) -> list[int] | None:
    manifest = getattr(dataset, "manifest", None)
    shards = getattr(manifest, "shards", None)
    if shards:
        return [int(shard.records) for shard in shards]
    return None


def _check_records(n: int) -> int:
    if n < 2:
        raise ValueError(f"the dataset has {n} record(s): a shuffle report needs at least 2")
    return n


def _exact_order(n: int, *, seed: int, epoch: int) -> npt.NDArray[np.int64]:
    from shardfeed.sampling.permutation import EpochOrder

    return np.asarray(EpochOrder(n, seed=seed, epoch=epoch, shuffle=True)[0:n], dtype=np.int64)


def shuffle_report(
    path_or_dataset: str | os.PathLike[str] | LabelSource | npt.ArrayLike, *,
    label_key: str | None = None, buffer_size: int = 10_000, seed: int = 0, epoch: int = 0,
    file_shuffle: bool = False, batch_size: int = 256, out_dir: str | os.PathLike[str] | None = None,
    shard_sizes: Sequence[int] | None = None, progress: Progress | None = None,
    allow_outside_paths: bool = False,
) -> dict[str, Any]:
    """Compare shardfeed's exact shuffle with a shuffle buffer on one dataset; a JSON-able dict.

    ``path_or_dataset``: a dataset path (folder, manifest, glob, TFRecord file), an open
    Dataset, or an array of labels (one per record, stored order). A
    :class:`~shardfeed.pipeline.mixture.Mixture` gives :func:`mixture_report` instead: the
    proportions its epoch realises, batch by batch. ``label_key`` names the
    label feature (default: the schema's label key, else ``image/class/label``); without labels
    only the position statistics are computed. ``shard_sizes`` gives the shard record counts
    for ``file_shuffle`` when the input is a label array (a dataset knows its own).
    ``out_dir``: write ``position_vs_index.png`` and (with labels) ``label_vs_position.png``.
    ``progress(done, total)`` is called while labels are read. ``allow_outside_paths``: open
    a dataset path as ``Dataset(path, allow_outside_paths=True)``.

    The label must be a class (an integer, string or one-hot vector a record): float labels,
    several values a record or nearly one value a record raise ValueError naming the feature.

    Returned keys: ``source``, ``records``, ``label_key``, ``classes``, ``class_names``
    (up to 1000), ``seed``, ``epoch``, ``buffer_size``, ``batch_size``, ``file_shuffle``,
    ``expected_labels_per_batch`` (a uniform shuffle's mean), ``tests`` (the tests run and what
    they can see: :meth:`Design.to_json`), ``orders`` (name -> statistics with a
    ``description``, see :meth:`OrderStats.to_json`, plus ``rho_p_value``,
    ``last_class_p_value``, the combined ``p_value`` and the ``verdict``: ``not uniform``,
    ``looks uniform`` or ``too small to tell``, see :mod:`shardfeed.tools.shuffle_report.verdict`)
    and ``plots`` (name -> path).
    """
    options = _check_options(buffer_size=buffer_size, batch_size=batch_size, seed=seed,
                             epoch=epoch, file_shuffle=file_shuffle)
    if isinstance(path_or_dataset, Mixture):  # what a mixture realises, not a buffer's bias
        return mixture_report(path_or_dataset, seed=seed, epoch=epoch, batch_size=batch_size)
    if isinstance(path_or_dataset, (str, os.PathLike)) or hasattr(path_or_dataset, "read_many"):
        labels = _labels_of_dataset(
            path_or_dataset, label_key=label_key, file_shuffle=file_shuffle,
            shard_sizes=shard_sizes, progress=progress, allow_outside_paths=allow_outside_paths,
        )
    else:
        labels = _labels_of_array(path_or_dataset, label_key=label_key, shard_sizes=shard_sizes)
    orders = _orders(labels, options)
    summary = _summary(labels, options)
    design = Design(
        records=labels.n,
        class_counts=() if labels.codes is None else class_counts(labels.codes, len(labels.names)),
        buffer_size=options.buffer_size,
    )
    summary["tests"] = design.to_json()
    for name, order in orders.items():
        summary["orders"][name] = _order_report(name, order, labels, options, design)
    if out_dir is not None:
        summary["plots"] = _draw_plots(orders, labels, options, Path(out_dir))
    return summary


@dataclass(frozen=True, slots=True)
class _Options:
    """The checked report options."""

    buffer_size: int
    batch_size: int
    seed: int
    epoch: int
    file_shuffle: bool


@dataclass(frozen=True, slots=True)
class _Labels:
    """What was read: where from, how many records, and each record's label code (None
    without labels) with the class names; the shard sizes ``file_shuffle`` needs."""

    source: str
    n: int
    key: str | None
    codes: npt.NDArray[np.int64] | None
    names: list[str]
    shard_sizes: Sequence[int] | None


def _check_options(*, buffer_size: int, batch_size: int, seed: int, epoch: int,
                   file_shuffle: bool) -> _Options:
    """Check every option (a count, a seed, a flag) before anything is read."""
    buffer_size = _check_int("buffer_size", buffer_size, minimum=1)
    batch_size = _check_int("batch_size", batch_size, minimum=1)
    seed = _check_int("seed", seed, minimum=0)
    epoch = _check_int("epoch", epoch, minimum=0)
    if not isinstance(file_shuffle, bool):
        raise TypeError(f"file_shuffle must be True or False, got {file_shuffle!r}")
    return _Options(buffer_size=buffer_size, batch_size=batch_size, seed=seed, epoch=epoch,
                    file_shuffle=file_shuffle)


def _labels_of_dataset(
    path_or_dataset: Any, *, label_key: str | None,
    file_shuffle: bool, shard_sizes: Sequence[int] | None, progress: Progress | None,
    allow_outside_paths: bool,
) -> _Labels:
    """Read the label of every record of a dataset: a path (opened here, and closed) or an
    open one (anything with ``read_many``)."""
    names: list[str] = []
    codes: npt.NDArray[np.int64] | None
    if isinstance(path_or_dataset, (str, os.PathLike)):
        from shardfeed.dataset import Dataset

        dataset: Any = Dataset(os.fspath(path_or_dataset),
                               allow_outside_paths=allow_outside_paths)
        source = os.fspath(path_or_dataset)
        owned = True
    else:
        dataset, source, owned = path_or_dataset, type(path_or_dataset).__name__, False
    try:
        n = _check_records(len(dataset))
        key = label_key_of(dataset, label_key)
        if key is None:
            log.warning("no label feature found; pass label_key to get label statistics")
            codes = None
        else:
            check_label_feature(dataset, key)
            codes, names = encode_labels(
                read_labels(dataset, key, progress=progress),
                key=key, candidates=class_features(dataset),
            )
            names = _named_classes(dataset, key, names)
        if file_shuffle and shard_sizes is None:
            shard_sizes = _shard_sizes(dataset)
    finally:
        if owned:
            dataset.close()
    return _Labels(source=source, n=n, key=key, codes=codes, names=names,
                   shard_sizes=shard_sizes)


def _labels_of_array(
    given: npt.ArrayLike, *, label_key: str | None, shard_sizes: Sequence[int] | None
) -> _Labels:
    """Labels given as an array, one per record in stored order."""
    labels = np.asarray(given)
    if labels.ndim not in (1, 2):
        raise TypeError(
            f"labels must be one label (or one label vector) per record, got shape "
            f"{labels.shape}; or pass a dataset path"
        )
    n, source, key = _check_records(int(labels.shape[0])), "labels", label_key
    codes, names = encode_labels(labels, key=key)
    return _Labels(source=source, n=n, key=key, codes=codes, names=names,
                   shard_sizes=shard_sizes)


def _orders(labels: _Labels, options: _Options) -> dict[str, npt.NDArray[np.int64]]:
    """The orders of one epoch: stored, the exact shuffle, the buffer (and file+buffer)."""
    n, shard_sizes = labels.n, labels.shard_sizes
    buffer_size, seed, epoch = options.buffer_size, options.seed, options.epoch
    orders: dict[str, npt.NDArray[np.int64]] = {
        "stored": np.arange(n, dtype=np.int64),
        "shardfeed": _exact_order(n, seed=seed, epoch=epoch),
        "buffer": buffer_shuffle_order(n, buffer_size, seed, epoch=epoch),
    }
    if options.file_shuffle:
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
    return orders


def _summary(labels: _Labels, options: _Options) -> dict[str, Any]:
    """The report's header, with ``tests``, ``orders`` and ``plots`` still empty."""
    codes, names = labels.codes, labels.names
    return {
        "source": labels.source,
        "records": labels.n,
        "label_key": labels.key,
        "classes": None if codes is None else len(names),
        "class_names": names if codes is not None and len(names) <= _MAX_LISTED_CLASSES else None,
        "seed": options.seed,
        "epoch": options.epoch,
        "buffer_size": options.buffer_size,
        "batch_size": options.batch_size,
        "file_shuffle": options.file_shuffle,
        "expected_labels_per_batch": (
            None if codes is None else expected_labels_per_batch(codes, options.batch_size)
        ),
        "tests": {},
        "orders": {},
        "plots": {},
    }


def _order_report(name: str, order: npt.NDArray[np.int64], labels: _Labels,
                  options: _Options, design: Design) -> dict[str, Any]:
    """One order's statistics, p-values and verdict, labels shown by class name."""
    names = labels.names
    stats = order_stats(order, labels=labels.codes, batch_size=options.batch_size,
                        num_records=labels.n).to_json()
    verdict, p_values = design.judge(
        rho=stats["spearman_rho"], chi2_p_value=stats["chi2_p_value"],
        latest_first_position=stats["latest_first_position"],
    )
    if stats["label_first_positions"] is not None:
        firsts = {names[int(c)]: p for c, p in stats["label_first_positions"].items()}
        stats["label_first_positions"] = firsts if len(firsts) <= _MAX_LISTED_CLASSES else None
        stats["latest_label"] = names[int(stats["latest_label"])]
    stats["description"] = ORDER_DESCRIPTIONS[name].format(buffer_size=options.buffer_size)
    stats["rho_p_value"] = p_values["rho"]
    stats["last_class_p_value"] = p_values.get("last_class")
    stats["p_value"] = p_values["combined"]
    stats["verdict"] = verdict
    return stats


def _draw_plots(orders: dict[str, npt.NDArray[np.int64]], labels: _Labels, options: _Options,
                folder: Path) -> dict[str, str]:
    """Draw the position plot (and with labels the label plot) into ``folder``."""
    from shardfeed.tools.shuffle_report import plots

    shown = {
        ORDER_DESCRIPTIONS[name].format(buffer_size=options.buffer_size): order
        for name, order in orders.items()
        if name != "stored"
    }
    drawn = {"position_vs_index": str(
        plots.plot_position_vs_index(shown, folder / "position_vs_index.png")
    )}
    if labels.codes is not None:
        drawn["label_vs_position"] = str(
            plots.plot_label_vs_position(
                shown, labels.codes, folder / "label_vs_position.png", class_names=labels.names
            )
        )
    return drawn
