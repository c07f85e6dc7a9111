"""What ``pack`` packs: one :class:`PackItem` per output record, and folder scanning.

A pack input (a folder of class sub-folders, or a CSV read by ``tools.csvinput``) becomes a
:class:`PackInput`: the items in input order plus what the manifest must remember about them
(class names, one-hot vocabularies, the group and order column names, the label key).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from shardfeed.errors import PackError
from shardfeed.format import spec

log = logging.getLogger(__name__)

IMAGE_EXTENSIONS = frozenset(
    {".jpg", ".jpeg", ".jpe", ".jfif", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp",
     ".ppm", ".pgm"}
)
"""File extensions a folder scan takes as images (case-insensitive); other files are not
packed, and are counted and listed (:attr:`PackInput.ignored`)."""

LabelValue = tuple[int, ...] | tuple[float, ...]


@dataclass(frozen=True, slots=True)
class PackItem:
    """One future record.

    ``source`` is the image file to read; ``name`` is the path stored in the record
    (relative to the dataset root, with ``/`` separators). ``int_labels`` and
    ``float_labels`` map feature names to their values, already in record form.
    ``group`` is the group id (int64 in the manifest sidecar), ``group_value`` what the
    record stores under the group column, ``order_ns`` the order key in integer nanoseconds
    (see :mod:`shardfeed.tools.pack.time`). ``row`` is the item's position in the input (a
    CSV line number or a file count), for messages and for a stable sort.
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
    order_ns: int | None = None


@dataclass(frozen=True, slots=True)
class Ignored:
    """A file of the input that is not packed, and why (e.g. it is not an image)."""

    path: str
    reason: str


@dataclass(frozen=True, slots=True)
class PackInput:
    """Items in input order and the facts the manifest keeps about them.

    ``vocabularies`` maps a label feature name to its class names (index = label value);
    ``where`` names the input (a folder or CSV path) in messages; ``kind`` says which, so
    that ``PackItem.row`` reads as a CSV line or not. ``order_unit`` is the unit the order
    column was read in (``s``, ``ms``, ``us``, ``ns`` or ``iso``); ``ignored`` lists the files
    of a folder input that are not packed.
    """

    items: tuple[PackItem, ...]
    root: str
    where: str
    label_key: str | None = None
    vocabularies: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    group_key: str | None = None
    order_key: str | None = None
    group_names: tuple[str, ...] | None = None
    order_unit: str | None = None
    kind: Literal["folder", "csv"] = "folder"
    ignored: tuple[Ignored, ...] = ()


def _is_image(name: str) -> bool:
    return os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS


def _walk(folder: str, ignored: list[Ignored]) -> list[str]:
    """Every image file under ``folder``, recursively, as sorted absolute paths; other
    files (hidden ones aside) go into ``ignored``."""
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for f in sorted(filenames):
            path = os.path.join(dirpath, f)
            if _is_image(f):
                found.append(path)
            elif not f.startswith("."):
                ignored.append(Ignored(path, _not_image_reason(f)))
    return sorted(found)


def _not_image_reason(name: str) -> str:
    ext = os.path.splitext(name)[1].lower()
    return f"not an image file ({ext or 'no extension'}); not packed"


def _relative_name(path: str, root: str) -> str:
    return os.path.relpath(path, root).replace(os.sep, "/")


def check_class_names(names: Sequence[str]) -> tuple[str, ...]:
    """Validate a class list (unique, non-empty plain names); raise ValueError naming the fix."""
    if isinstance(names, (str, bytes)):
        raise TypeError(
            f"classes must be a list of class names, got the string {names!r}; write "
            "classes=['cat', 'dog'], or classes_from='train_out/' for a packed dataset"
        )
    out = tuple(names)
    if not out:
        raise ValueError("classes is empty; name at least one class")
    for name in out:
        if not isinstance(name, str) or not name or "/" in name or name != name.strip():
            raise ValueError(
                f"class name {name!r} is not a plain folder name; fix the class list"
            )
    dup = sorted({n for n in out if out.count(n) > 1})
    if dup:
        raise ValueError(f"class list names {', '.join(dup)} more than once; fix the list")
    return out


def scan_folder(
    folder: str | os.PathLike[str], *, classes: Sequence[str] | None = None
) -> PackInput:
    """Read a folder of images. Class sub-folders become labels.

    Without ``classes``, ``folder/cat/*.jpg, folder/dog/*.png`` gives labels 0 (cat) and 1
    (dog): the index of the class name in sorted order. With ``classes`` (e.g. the class list
    of the training split), the label is the index in that list: a class with no folder, or
    an empty one, simply has no records, and a folder not in the list is refused. Without
    it an empty class folder is refused too: skipping it would shift the labels of every
    later class. The class names are kept as the vocabulary of ``image/class/label``.
    Images inside a class folder are taken recursively; other files are listed in
    ``ignored``. A folder with images but no sub-folders is packed without labels.
    Order: class, then path, sorted.
    """
    root = os.path.abspath(os.fspath(folder))
    if not os.path.isdir(root):
        raise PackError(f"input folder '{root}' does not exist; check the path")
    given = None if classes is None else check_class_names(classes)
    entries = sorted(os.listdir(root))
    folders = [e for e in entries if os.path.isdir(os.path.join(root, e)) and not e.startswith(".")]
    ignored: list[Ignored] = []
    if not folders:
        if given is not None:
            raise PackError(
                f"a class list was given but '{root}' has no class sub-folders; put the images "
                "in one folder per class, or pack without --classes"
            )
        return _flat(root, ignored)
    ignored += _loose_files(root, entries)
    names = _class_list(root, folders, given)
    items = _class_items(root, names, given=given, ignored=ignored)
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
        vocabularies={spec.IMAGE_LABEL: names},
        ignored=tuple(ignored),
    )


def _loose_files(root: str, entries: list[str]) -> list[Ignored]:
    """The files directly in a folder that has class sub-folders: none of them is packed."""
    ignored: list[Ignored] = []
    for e in entries:
        path = os.path.join(root, e)
        if os.path.isfile(path) and not e.startswith("."):
            reason = ("directly in the input folder, not in a class folder; not packed"
                      if _is_image(e) else _not_image_reason(e))
            ignored.append(Ignored(path, reason))
    return ignored


def _class_items(root: str, names: tuple[str, ...], *, given: tuple[str, ...] | None,
                 ignored: list[Ignored]) -> list[PackItem]:
    """The images of each class folder, labelled by the class's index in ``names``; files
    that are not images go to ``ignored``. An empty class folder is refused without
    ``given``."""
    items: list[PackItem] = []
    for label, name in enumerate(names):
        path = os.path.join(root, name)
        files = _walk(path, ignored) if os.path.isdir(path) else []
        if not files and given is None:
            raise PackError(
                f"class folder '{path}' holds no images; leaving it out would give every "
                "later class another label than in other splits. Add its images, remove the "
                "folder, or pass the class list (--classes a,b,c or --classes-from TRAIN_OUT; "
                "Python: classes=[...]) so the labels stay fixed"
            )
        for file in files:
            items.append(
                PackItem(
                    source=file,
                    name=_relative_name(file, root),
                    row=len(items),
                    int_labels={spec.IMAGE_LABEL: (label,)},
                )
            )
    return items


def _class_list(root: str, folders: list[str], given: tuple[str, ...] | None) -> tuple[str, ...]:
    if given is None:
        return tuple(folders)
    unknown = [f for f in folders if f not in given]
    if unknown:
        raise PackError(
            f"class folder{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(repr(u) for u in unknown)} of '{root}' "
            f"{'are' if len(unknown) > 1 else 'is'} not in the class list "
            f"({', '.join(given)}); a new class would need a new label everywhere: rename or "
            "remove the folder, or fix the class list"
        )
    return given


def _flat(root: str, ignored: list[Ignored]) -> PackInput:
    items = [
        PackItem(source=path, name=_relative_name(path, root), row=i)
        for i, path in enumerate(_walk(root, ignored))
    ]
    if not items:
        raise PackError(
            f"no images found in '{root}'; expected class sub-folders of images, or files "
            f"ending in {', '.join(sorted(IMAGE_EXTENSIONS))}"
        )
    return PackInput(items=tuple(items), root=root, where=root, ignored=tuple(ignored))


def vocabularies_from_path(path: str | os.PathLike[str]) -> dict[str, tuple[str, ...]]:
    """The label vocabularies a packed dataset kept (feature name → names, index = value):
    its class names and its CSV one-hot vocabularies. PackError if ``path`` is no dataset."""
    text = os.fspath(path)
    manifest = os.path.join(text, spec.MANIFEST_NAME) if os.path.isdir(text) else text
    if not os.path.isfile(manifest):
        raise PackError(
            f"'{text}' is not a packed dataset (no {spec.MANIFEST_NAME}); the labels of a CSV "
            "are taken from the dataset packed from the training split's CSV"
        )
    from shardfeed.format.manifest import Manifest

    vocabularies = Manifest.load(manifest).extra.get("vocabularies") or {}
    return {str(k): tuple(str(n) for n in v) for k, v in vocabularies.items()
            if isinstance(v, list)}


def classes_from_path(path: str | os.PathLike[str]) -> tuple[str, ...]:
    """The class list of a packed dataset (its folder or manifest: the class names ``pack``
    kept for ``image/class/label``, or for its label key, as a Hugging Face ``ClassLabel``
    column's) or of a folder of class sub-folders (sorted)."""
    text = os.fspath(path)
    manifest = os.path.join(text, spec.MANIFEST_NAME) if os.path.isdir(text) else text
    if os.path.isfile(manifest):
        from shardfeed.format.manifest import Manifest

        loaded = Manifest.load(manifest)
        vocabularies = loaded.extra.get("vocabularies") or {}
        label_key = loaded.schema.label_key if loaded.schema is not None else None
        names = vocabularies.get(spec.IMAGE_LABEL) or vocabularies.get(label_key or "")
        if not names:
            raise PackError(
                f"dataset '{manifest}' has no class names (it was not packed from a folder of "
                "class sub-folders); pass the class list itself (--classes a,b,c)"
            )
        return check_class_names([str(n) for n in names])
    if not os.path.isdir(text):
        raise PackError(
            f"'{text}' does not exist; --classes-from takes a packed dataset (folder or "
            "shardfeed.json) or a folder of class sub-folders"
        )
    folders = sorted(
        e for e in os.listdir(text) if os.path.isdir(os.path.join(text, e)) and not e.startswith(".")
    )
    if not folders:
        raise PackError(
            f"folder '{text}' has no {spec.MANIFEST_NAME} and no class sub-folders; "
            "--classes-from takes a packed dataset or a folder of class sub-folders"
        )
    return check_class_names(folders)
