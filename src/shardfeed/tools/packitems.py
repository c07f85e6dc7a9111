"""What ``pack`` packs: one :class:`PackItem` per output record, and folder scanning.

A pack input (a folder of class sub-folders, or a CSV read by ``tools.csvinput``) becomes a
:class:`PackInput`: the items in input order plus what the manifest must remember about them
(class names, one-hot vocabularies, the group and order column names, the label key).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from shardfeed.errors import PackError
from shardfeed.format import spec

log = logging.getLogger(__name__)

IMAGE_EXTENSIONS = frozenset(
    {".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp", ".ppm", ".pgm"}
)
"""File extensions a folder scan takes as images (case-insensitive)."""

LabelValue = tuple[int, ...] | tuple[float, ...]


@dataclass(frozen=True, slots=True)
class PackItem:
    """One future record.

    ``source`` is the image file to read; ``name`` is the path stored in the record
    (relative to the dataset root, with ``/`` separators). ``int_labels`` and
    ``float_labels`` map feature names to their values, already in record form.
    ``group`` is the group id (int64 in the manifest sidecar), ``group_value`` what the
    record stores under the group column, ``order`` the order key in seconds. ``row`` is
    the item's position in the input (a CSV line number or a file count), for messages and
    for a stable sort.
    """

    source: str
    name: str
    row: int
    int_labels: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    float_labels: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    mask_source: str | None = None
    mask_name: str | None = None
    group: int | None = None
    group_value: int | str | None = None
    order: float | None = None


@dataclass(frozen=True, slots=True)
class PackInput:
    """Items in input order and the facts the manifest keeps about them.

    ``vocabularies`` maps a label feature name to its class names (index = label value);
    ``where`` names the input (a folder or CSV path) in messages.
    """

    items: tuple[PackItem, ...]
    root: str
    where: str
    label_key: str | None = None
    vocabularies: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    group_key: str | None = None
    order_key: str | None = None
    group_names: tuple[str, ...] | None = None


def _is_image(name: str) -> bool:
    return os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS


def _walk_images(folder: str) -> list[str]:
    """Every image file under ``folder``, recursively, as sorted absolute paths."""
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames.sort()
        found.extend(os.path.join(dirpath, f) for f in filenames if _is_image(f))
    return sorted(found)


def _relative_name(path: str, root: str) -> str:
    return os.path.relpath(path, root).replace(os.sep, "/")


def scan_folder(folder: str | os.PathLike[str]) -> PackInput:
    """Read a folder of images. Class sub-folders become labels.

    ``folder/cat/*.jpg, folder/dog/*.png`` gives labels 0 (cat) and 1 (dog): the index of the
    class name in sorted order; the class names are kept as the vocabulary of
    ``image/class/label``. Images inside a class folder are taken recursively. A folder with
    images but no sub-folders is packed without labels. Order: class, then path, sorted.
    """
    root = os.path.abspath(os.fspath(folder))
    if not os.path.isdir(root):
        raise PackError(f"input folder '{root}' does not exist; check the path")
    entries = sorted(os.listdir(root))
    classes = [e for e in entries if os.path.isdir(os.path.join(root, e)) and not e.startswith(".")]
    top_images = [e for e in entries if os.path.isfile(os.path.join(root, e)) and _is_image(e)]
    items: list[PackItem] = []
    if classes:
        if top_images:
            log.warning(
                "%d images directly in '%s' are skipped: with class sub-folders, only images "
                "inside them are packed", len(top_images), root,
            )
        kept: list[str] = []
        for name in classes:
            files = _walk_images(os.path.join(root, name))
            if not files:
                log.warning("class folder '%s' holds no images; it gets no label", name)
                continue
            label = len(kept)
            kept.append(name)
            for path in files:
                items.append(
                    PackItem(
                        source=path,
                        name=_relative_name(path, root),
                        row=len(items),
                        int_labels={spec.IMAGE_LABEL: (label,)},
                    )
                )
        if not items:
            raise PackError(
                f"no images found in the class folders of '{root}'; expected files ending in "
                f"{', '.join(sorted(IMAGE_EXTENSIONS))}"
            )
        return PackInput(
            items=tuple(items),
            root=root,
            where=root,
            label_key=spec.IMAGE_LABEL,
            vocabularies={spec.IMAGE_LABEL: tuple(kept)},
        )
    for path in _walk_images(root):
        items.append(PackItem(source=path, name=_relative_name(path, root), row=len(items)))
    if not items:
        raise PackError(
            f"no images found in '{root}'; expected class sub-folders of images, or files "
            f"ending in {', '.join(sorted(IMAGE_EXTENSIONS))}"
        )
    return PackInput(items=tuple(items), root=root, where=root)
