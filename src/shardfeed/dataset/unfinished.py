"""Refusing folders whose dataset was never committed: an interrupted pack never reads as whole.

The manifest is a dataset's commit point: ``pack`` saves its plan first, writes each shard
under a temporary name, writes ``shardfeed.json`` last and then removes the plan. A folder is
*unfinished* when

- it holds pack's plan file (``.shardfeed-pack.json``): a pack started there and did not
  complete. This holds even beside a manifest: pack removes the plan right after writing
  the manifest, so both together mean a pack stopped in between (``--resume`` completes it
  without rewriting a shard) or a manifest written over an unfinished pack by other means;

or, when it has no manifest,

- it holds the parts folder (``_parts/``) of a pack in parts (``pack_ray``, a pack of data
  such as rows or Parquet): its tasks write there and its merge renames the parts out,
  writes the manifest and removes the folder last, so without a manifest the tasks or the
  merge were stopped, however many shards already have their final names (a rerun of the
  same pack removes what was left and packs again);
- a shard writer's temporary file (``shard-00003-of-00030.tfrecord.tmp``): a shard being
  written, or left by a writer that was stopped;
- shards named ``NAME-00003-of-00030`` with fewer than the 30 of that name present: a pack,
  copy or download that stopped part-way (TensorFlow's naming states the total).

Folders of TFRecords written by other tools (every ``-of-N`` shard present, Spark
``part-NNNNN`` files, plain ``*.tfrecord``) have none of these signs and open as they are.
The check runs on the folder of the files however they are named (the folder, a glob, a
list, one file), so ``shardfeed verify out/*.tfrecord`` (a list, once the shell expands it)
is refused like ``out/``. The one way past it is explicit: ``Dataset(..., allow_partial=True)``
reads the complete shards that are there.

Cost: nothing beyond the listing a folder is opened with; a glob or a list lists the
folders of its files (one listing each).
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Iterable, Sequence

from shardfeed.errors import FormatError, StorageError
from shardfeed.format import spec as S
from shardfeed.storage import files, is_remote

_OF_NAME = re.compile(r"^(?P<prefix>.+)-(?P<index>\d+)-of-(?P<total>\d+)(?P<suffix>(\.[^.]+)*)$")
"""TensorFlow's shard naming: ``train-00003-of-01024`` (with any extension after it)."""
_SHARD_TEMP = re.compile(r"(\.tfrec(ord)?s?|-\d+-of-\d+|^part-([rm]-)?\d+.*)\.tmp$")
"""The temporary name a shard writer gives a shard (``ShardWriter``: the final name + .tmp).
Index and manifest temporaries are not signs: an index may be built beside a complete shard
while another process opens the folder, and pack's manifest comes with its plan file."""

ESCAPE_HINT = "or open it with Dataset(..., allow_partial=True) to read only the shards there"
"""The one way past the check, named in every refusal."""


def _missing_shards(names: Iterable[str]) -> tuple[str, int, int] | None:
    """The first ``-of-N`` family with shards missing: (pattern, present, total), else None."""
    families: dict[tuple[str, int, str], set[int]] = {}
    for name in names:
        if name.startswith((".", "_")) or name.endswith((S.TEXT_INDEX_SUFFIX,
                                                        S.BINARY_INDEX_SUFFIX, S.TEMP_SUFFIX)):
            continue
        found = _OF_NAME.match(name)
        if found is None:
            continue
        total = int(found["total"])
        key = (found["prefix"], total, found["suffix"])
        families.setdefault(key, set()).add(int(found["index"]))
    for (prefix, total, suffix), present in sorted(families.items()):
        have = sum(1 for i in present if i < total)
        if have < total:
            return f"{prefix}-NNNNN-of-{total:05d}{suffix}", have, total
    return None


def _shard_temp(names: Iterable[str]) -> str | None:
    """The first temporary file of a shard writer, else None."""
    for name in names:
        if not name.startswith(".") and _SHARD_TEMP.search(name):
            return name
    return None


def unfinished_reason(folder: str, names: Sequence[str]) -> str | None:
    """Why the folder ``folder`` holding the entries ``names`` is unfinished, or None.

    The reason is one line: what was found and how to finish the dataset.
    """
    entries = set(names)
    missing = _missing_shards(names)
    counted = "" if missing is None else f", {missing[1]} of {missing[2]} shards written"
    resume = f"`shardfeed pack SOURCE {folder} --resume`"
    if S.PACK_PLAN_NAME in entries:
        finish = f"finish it with {resume} (the same inputs and options)"
        if is_remote(folder):  # a pack into object storage does not resume: it starts over
            finish = f"pack it again with `shardfeed pack SOURCE {folder} --overwrite`"
        return (
            f"folder '{folder}' holds a pack that did not finish ({S.PACK_PLAN_NAME} is "
            f"there{counted}): {finish}, {ESCAPE_HINT}"
        )
    if S.MANIFEST_NAME in entries:
        return None  # committed: the manifest names the shards
    if S.PARTS_FOLDER in entries:
        return (
            f"folder '{folder}' has no {S.MANIFEST_NAME} and holds {S.PARTS_FOLDER}/, the parts "
            f"of a pack in parts (pack_ray, or pack of data) that stopped before its merge "
            f"finished{counted}: run the same pack again (it removes what was left, then "
            f"packs), {ESCAPE_HINT}"
        )
    temp = _shard_temp(names)
    if temp is not None:
        return (
            f"folder '{folder}' has no {S.MANIFEST_NAME} and holds '{temp}', a shard whose "
            f"writing did not finish: let the writer finish, or finish the pack with {resume}, "
            f"{ESCAPE_HINT}"
        )
    if missing is not None:
        pattern, have, total = missing
        return (
            f"folder '{folder}' has no {S.MANIFEST_NAME} and only {have} of the {total} shards "
            f"named {pattern}: a pack, copy or download stopped part-way; finish it (for a "
            f"pack, {resume}), {ESCAPE_HINT}"
        )
    return None


def check_folder(folder: str, names: Sequence[str]) -> None:
    """Raise :class:`FormatError` if the folder ``folder`` (entries ``names``) is unfinished."""
    reason = unfinished_reason(folder, names)
    if reason is not None:
        raise FormatError(reason)


def check_plan_beside(manifest_url: str) -> None:
    """Raise FormatError if pack's plan file lies beside the local manifest ``manifest_url``.

    Remote manifests are not checked: pack builds shards in a local folder and uploads them,
    its plan never reaches object storage (and the check would cost a request).
    """
    if is_remote(manifest_url):
        return
    folder = os.path.dirname(os.path.abspath(manifest_url.removeprefix("file://")))
    if os.path.exists(os.path.join(folder, S.PACK_PLAN_NAME)):
        check_folder(folder, files.listdir(folder))


def _parent(url: str) -> str:
    if is_remote(url):
        return posixpath.dirname(url.rstrip("/"))
    return os.path.dirname(os.path.abspath(url.removeprefix("file://")))


def check_folders_of(urls: Sequence[str]) -> None:
    """Check the folder of each file in ``urls`` (one listing a folder).

    A folder that does not exist is skipped (its files do not either; opening them says so).
    """
    seen: set[str] = set()
    for url in urls:
        folder = _parent(url)
        if not folder or folder in seen or folder.endswith("://"):
            continue
        seen.add(folder)
        try:
            names = files.listdir(folder)
        except StorageError as exc:
            if isinstance(exc.__cause__, (FileNotFoundError, NotADirectoryError)):
                continue
            raise StorageError(
                f"{exc}; the folder is listed to check that the dataset there is complete: "
                "open the files with Dataset(..., allow_partial=True) to skip that check"
            ) from exc
        check_folder(folder, names)
