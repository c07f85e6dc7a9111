"""What ``pack`` was given: a folder of class sub-folders or a CSV, read into a
:class:`~shardfeed.tools.pack.items.PackInput`, and the checks on it that need no image
opened: a file that is plainly not a CSV, referenced image paths outside the root, a root
far from the dataset.

Determinism: a pure function of the folder listing or the CSV. Memory: one item per input
image.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

from shardfeed.errors import PackError
from shardfeed.tools.pack.csvinput import CsvColumns, read_csv
from shardfeed.tools.pack.items import (
    PackInput,
    classes_from_path,
    scan_folder,
    vocabularies_from_path,
)

# pack's messages all come from the package's logger, whichever module says them
log = logging.getLogger("shardfeed.tools.pack")


def read_input(
    source: str,
    *,
    csv: CsvColumns | None,
    root: str | None,
    classes: Sequence[str] | None,
    classes_from: str | None = None,
) -> PackInput:
    """Read a folder (its class sub-folders, or ``classes``) or a CSV (its ``csv`` columns,
    paths relative to ``root``); refuse anything else with a message saying what to pass."""
    if os.path.isdir(source):
        if csv is not None:
            raise ValueError(
                f"CSV columns were given but '{source}' is a folder; pass the CSV file instead"
            )
        if classes is None and classes_from is not None:
            classes = classes_from_path(classes_from)
        return scan_folder(source, classes=classes)
    if not os.path.exists(source):
        raise PackError(f"input '{source}' does not exist; name a folder of images or a CSV")
    if classes is not None:
        raise ValueError(
            f"a class list was given but '{source}' is not a folder; classes name the class "
            "sub-folders of a folder input (a CSV's labels are its label columns)"
        )
    _refuse_non_csv(source)
    vocabularies = vocabularies_from_path(classes_from) if classes_from is not None else None
    return read_csv(source, columns=csv or CsvColumns(), root=root, vocabularies=vocabularies)


def check_referenced_names(data: PackInput) -> None:
    """Referenced records store paths relative to the root; a path the root does not hold
    would be stored absolute or with ``..``, which readers refuse as leaving the dataset.
    Refuse it now, naming the root that holds every image."""
    outside = [
        item for item in data.items
        for name in (item.name, item.mask_name) if name is not None
        and (name == ".." or name.startswith(("/", "../")))
    ]
    if not outside:
        return
    sources = [p for item in data.items for p in (item.source, item.mask_source) if p]
    common = os.path.commonpath([os.path.abspath(p) for p in sources])
    raise PackError(
        f"{len(outside)} image paths of '{data.where}' lie outside the root '{data.root}' "
        f"(the first: '{outside[0].source}'); referenced records store paths under the root, "
        f"so pass --root (root=) with a folder that holds every image, e.g. '{common}', and "
        "write the CSV's paths relative to it"
    )


def warn_far_root(root: str, out: str) -> None:
    """A root outside the folder that holds the dataset is stored absolute, and readers refuse
    it unless told to trust it (a downloaded dataset must not reach elsewhere): say so now."""
    near = os.path.dirname(os.path.abspath(out))
    if os.path.commonpath([os.path.abspath(root), near]) != near:
        log.warning(
            "the image root '%s' is not beside the dataset '%s': it is stored as an absolute "
            "path, and readers refuse it unless the dataset is opened with root='%s' or "
            "allow_outside_paths=True (--allow-outside-paths); pack into a folder beside the "
            "images to avoid this", root, out, root,
        )


def _refuse_non_csv(source: str) -> None:
    """A file that is plainly not a CSV (an image, a TFRecord) gets its own message."""
    from shardfeed.tools.discovery import is_shard_name
    from shardfeed.tools.pack.record import image_format

    if source.lower().endswith((".csv", ".tsv", ".txt")):
        return  # Spark names its CSV output part-00000-<id>.csv, like a shard
    with open(source, "rb") as f:
        head = f.read(16)
    if image_format(head) != "other":
        raise PackError(
            f"'{source}' is an image file; pack takes a folder of images (class sub-folders "
            "become labels) or a CSV of image paths: put the image in a folder and pack that"
        )
    if is_shard_name(source):
        raise PackError(
            f"'{source}' looks like a TFRecord file; pass --from-tfrecord (from_tfrecord=True) "
            "to re-pack TFRecord files, or `shardfeed index` to index them where they are"
        )
