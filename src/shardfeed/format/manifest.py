"""The dataset manifest (``shardfeed.json``) and its per-record sidecars.

::

    dataset/
      shardfeed.json          format, version, mode, root, schema, shards, group/order keys
      train-00000.tfrecord    shard
      train-00000.tfrecord.idx      DALI text index
      train-00000.tfrecord.idx.npy  n+1 uint64 offsets
      groups.npy              int64 group id per record (optional)
      order.npy               float64 order key per record (optional)

Shard paths are relative to the manifest's folder unless they are absolute or URLs (readers
refuse those that lead outside the folder: :mod:`shardfeed.storage.paths`). So is the
``root`` of referenced images: :meth:`Manifest.save` stores a local root that lies near the
dataset (inside the folder that holds the dataset folder) relative to the manifest's folder,
so that the dataset and its images can be moved or copied together::

    data/                          root stored as "../photos"
      photos/cat/001.jpg           (an absolute root, stored by older versions or for images
      packed/shardfeed.json         elsewhere, is used as it is; ``Dataset(root=)`` re-points)
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

import numpy as np

from shardfeed.errors import FormatError, SchemaError
from shardfeed.format import _fileio, manifest_check
from shardfeed.format import spec as S
from shardfeed.format.manifest_check import MODES, Mode
from shardfeed.format.schema import Schema
from shardfeed.storage import is_remote
from shardfeed.storage.paths import contained

DATASET_VERSION_KEY = "dataset_version"
"""The manifest's ``extra`` field numbering the dataset's version (see ``tools/pack/append``)."""
SIDECARS_KEY = "sidecars"
"""The manifest's ``extra`` field naming its sidecar files, where not ``groups.npy`` and
``order.npy`` (each version of an appended dataset has its own)."""


def version_file(version: int) -> str:
    """The file name that keeps dataset version ``version``'s manifest, beside the newest
    (``shardfeed.json``)."""
    return f"shardfeed.v{version}.json"


@dataclass(frozen=True, slots=True)
class ShardInfo:
    """One shard: path (relative to the manifest folder), record count, size, file CRC32C,
    and the hash of its records (:mod:`shardfeed.format.records_hash`; None when the shard
    was not written or indexed by shardfeed)."""

    path: str
    records: int
    bytes: int
    crc32c: int | None = None
    records_hash: int | None = None

    def __post_init__(self) -> None:
        if not self.path:
            raise ValueError("ShardInfo path must not be empty")
        if self.records < 0 or self.bytes < 0:
            raise ValueError(
                f"ShardInfo {self.path!r}: records and bytes must be >= 0, got "
                f"{self.records} and {self.bytes}"
            )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path, "records": self.records,
                               "bytes": self.bytes, "crc32c": self.crc32c}
        if self.records_hash is not None:
            out["records_hash"] = self.records_hash
        return out


@dataclass(frozen=True, slots=True)
class Manifest:
    """What is in a dataset. ``mode``: ``embedded`` (images inside the records),
    ``referenced`` (records hold paths under ``root``: absolute, a URL, or relative to the
    manifest's folder, which :meth:`load` resolves), ``raw`` (decoded pixels and their shape
    inside the records) or ``tfrecord`` (indexed files written
    by other tools). ``group_key``/``order_key`` name the features whose per-record values
    are stored in the ``groups.npy``/``order.npy`` sidecars. ``extra`` holds free-form JSON
    (e.g. class names)."""

    shards: Sequence[ShardInfo]
    schema: Schema | None = None
    mode: Mode = "embedded"
    root: str | None = None
    group_key: str | None = None
    order_key: str | None = None
    version: int = S.FORMAT_VERSION
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "shards", tuple(self.shards))
        object.__setattr__(self, "extra", MappingProxyType(dict(self.extra)))
        if self.mode not in MODES:
            raise ValueError(f"manifest mode must be one of {MODES}, got {self.mode!r}")
        if not isinstance(self.version, int) or self.version < 1:
            raise ValueError(f"manifest version must be an int >= 1, got {self.version!r}")
        for shard in self.shards:
            if not isinstance(shard, ShardInfo):
                raise TypeError(f"manifest shards must be ShardInfo, got {type(shard).__name__}")

    @property
    def num_records(self) -> int:
        """Total records over all shards."""
        return sum(s.records for s in self.shards)

    @property
    def dataset_version(self) -> int:
        """The dataset version this manifest is (``extra.dataset_version``: each append adds
        one; 1 for a dataset never appended to). Not :attr:`version`, the format's."""
        value = self.extra.get(DATASET_VERSION_KEY, 1)
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= 1
        return int(value) if ok else 1

    def sidecar_file(self, kind: Literal["groups.npy", "order.npy"]) -> str:
        """The file of the ``kind`` sidecar (``extra.sidecars`` names a version's own, e.g.
        ``groups.v2.npy``; by default the file is named ``kind``)."""
        named = self.extra.get(SIDECARS_KEY)
        if isinstance(named, Mapping) and isinstance(named.get(kind), str):
            return str(named[kind])
        return kind

    def to_json(self) -> dict[str, Any]:
        """The JSON document written to ``shardfeed.json``."""
        return {
            "format": S.FORMAT_NAME,
            "version": self.version,
            "mode": self.mode,
            "root": self.root,
            "group_key": self.group_key,
            "order_key": self.order_key,
            "records": self.num_records,
            "schema": None if self.schema is None else self.schema.to_json(),
            "shards": [s.to_json() for s in self.shards],
            "extra": dict(self.extra),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], *, where: str = "manifest") -> Manifest:
        """Parse a manifest document; raises :class:`FormatError` naming ``where`` and the
        field (every field is checked first: :func:`manifest_check.check_document`)."""
        manifest_check.check_document(data, where=where)
        version = data["version"]
        try:
            shards = [
                ShardInfo(path=s["path"], records=int(s["records"]), bytes=int(s["bytes"]),
                          crc32c=s.get("crc32c"), records_hash=s.get("records_hash"))
                for s in data["shards"]
            ]
            schema_data = data.get("schema")
            schema = None if schema_data is None else Schema.from_json(schema_data)
            manifest = cls(
                shards=shards, schema=schema, mode=data.get("mode") or "embedded",
                root=data.get("root"), group_key=data.get("group_key"),
                order_key=data.get("order_key"), version=version,
                extra=data.get("extra") or {},
            )
        except SchemaError as exc:
            raise FormatError(f"file '{where}', field {exc}; {manifest_check.REBUILD}") from None
        except (KeyError, TypeError, ValueError) as exc:
            raise FormatError(
                f"file '{where}' is a malformed manifest ({type(exc).__name__}: {exc}); "
                "re-create it with `shardfeed index` or `shardfeed pack --resume`"
            ) from None
        return manifest

    def save(self, url: str | os.PathLike[str]) -> None:
        """Write the manifest atomically (temp name + rename) to ``url``.

        A local absolute ``root`` inside the folder that holds the manifest's folder is
        written relative to the manifest's folder (``..``, ``../photos``, ``images``).
        """
        _fileio.write_bytes_atomic(url, self.to_bytes(url))

    def to_bytes(self, url: str | os.PathLike[str]) -> bytes:
        """The bytes :meth:`save` writes at ``url`` (its ``root`` made portable there)."""
        data = self.to_json()
        data["root"] = portable_root(self.root, os.fspath(url))
        return (json.dumps(data, indent=1, sort_keys=False) + "\n").encode("utf-8")

    @classmethod
    def load(cls, url: str | os.PathLike[str], *, data: bytes | None = None) -> Manifest:
        """Read a manifest file (a path or URL to ``shardfeed.json``; ``data``: its bytes,
        where already read).

        A relative ``root`` is resolved against the manifest's folder where it is now, so
        ``root`` is always usable as it is (and saving elsewhere stores it right again).
        """
        where = os.fspath(url)
        if data is None:
            data = _fileio.read_bytes(url, max_bytes=S.MAX_MANIFEST_BYTES)
        document = manifest_check.parse_document(data, where=where)
        manifest = cls.from_json(document, where=where)
        root = manifest.root
        if root is not None and not is_remote(root) and not os.path.isabs(root):
            manifest = dataclasses.replace(manifest, root=resolve(dataset_dir(where), root))
        return manifest


def load(url: str | os.PathLike[str]) -> Manifest:
    """Read a manifest file (a path or URL to ``shardfeed.json``)."""
    return Manifest.load(url)


def save(manifest: Manifest, url: str | os.PathLike[str]) -> None:
    """Write ``manifest`` atomically to ``url``."""
    manifest.save(url)


def dataset_dir(manifest_url: str | os.PathLike[str]) -> str:
    """The folder a manifest lives in (shard paths are relative to it)."""
    text = os.fspath(manifest_url)
    if is_remote(text):
        return posixpath.dirname(text)
    return os.path.dirname(os.path.abspath(text.removeprefix("file://")))


def portable_root(root: str | None, manifest_url: str) -> str | None:
    """``root`` as a manifest at ``manifest_url`` stores it: relative to the manifest's folder
    when both are local and the root lies inside the folder that holds the manifest's folder
    (not the file-system root), else unchanged."""
    if root is None or is_remote(root) or is_remote(manifest_url) or not os.path.isabs(root):
        return root
    if root.startswith("file://") or manifest_url.startswith("file://"):
        return root
    base = dataset_dir(manifest_url)
    near = os.path.dirname(base)
    if near == os.path.dirname(near):  # the dataset folder sits at the file-system root
        near = base
    target = os.path.normpath(root)
    if os.path.commonpath([near, target]) != near:
        return root
    return os.path.relpath(target, base).replace(os.sep, "/")


def resolve(base: str, path: str) -> str:
    """Join a path from the manifest (a shard, a sidecar, the image root) to the manifest's
    folder ``base``; ``..`` steps are applied (``out/../photos`` is ``photos``).

    No check: readers confine what a manifest names with
    :func:`shardfeed.storage.paths.contained` (see :mod:`shardfeed.dataset.opening`)."""
    if is_remote(path) or os.path.isabs(path):
        return path
    if is_remote(base):
        joined = posixpath.join(base, path)
        if ".." not in path.split("/"):
            return joined
        scheme, _, rest = joined.partition("://")
        return f"{scheme}://{posixpath.normpath(rest)}"
    return os.path.normpath(os.path.join(base, path))


def _array_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return buf.getvalue()


def save_sidecars(
    base: str | os.PathLike[str],
    *,
    group_ids: np.ndarray | None = None,
    order_keys: np.ndarray | None = None,
    files: Mapping[str, str] | None = None,
) -> None:
    """Write ``groups.npy`` (int64) and/or ``order.npy`` (float64) into the folder ``base``
    (``files``: another file name for either, e.g. a version's own, see
    :meth:`Manifest.sidecar_file`)."""
    folder = os.fspath(base)
    named = dict(files or {})
    if group_ids is not None:
        _save_sidecar(folder, named.get(S.GROUPS_NAME, S.GROUPS_NAME), group_ids,
                      name="group_ids", kinds="iu", what="integer", dtype=np.int64)
    if order_keys is not None:
        _save_sidecar(folder, named.get(S.ORDER_NAME, S.ORDER_NAME), order_keys,
                      name="order_keys", kinds="iuf", what="numeric", dtype=np.float64)


def _save_sidecar(
    folder: str, filename: str, values: np.ndarray, *, name: str, kinds: str, what: str,
    dtype: type[np.generic],
) -> None:
    """Check ``values`` is 1-D of dtype kind ``kinds`` and write it as ``dtype`` to ``filename``."""
    arr = np.asarray(values)
    if arr.ndim != 1 or arr.dtype.kind not in kinds:
        raise ValueError(
            f"{name} must be a 1-D {what} array, one per record; got {arr.dtype} "
            f"shape {arr.shape}"
        )
    _fileio.write_bytes_atomic(resolve(folder, filename), _array_bytes(arr.astype(dtype)))


def load_sidecars(manifest: Manifest, base: str, *, allow_outside: bool = False
                  ) -> tuple[np.ndarray | None, np.ndarray | None]:
    """The group ids and order keys of ``manifest``'s records (None for a key it does not
    name), from its sidecar files in the dataset folder ``base`` (:func:`load_sidecar`)."""
    records = manifest.num_records
    groups = None if manifest.group_key is None else load_sidecar(
        base, S.GROUPS_NAME, records=records, allow_outside=allow_outside,
        file=manifest.sidecar_file(S.GROUPS_NAME))
    order = None if manifest.order_key is None else load_sidecar(
        base, S.ORDER_NAME, records=records, allow_outside=allow_outside,
        file=manifest.sidecar_file(S.ORDER_NAME))
    return groups, order


def load_sidecar(
    base: str, name: Literal["groups.npy", "order.npy"], *, records: int,
    allow_outside: bool = False, file: str | None = None,
) -> np.ndarray:
    """Load one sidecar (memory-mapped when local) and check its type and that it has one
    value per record (:func:`manifest_check.load_sidecar_array`).

    ``file``: its file name where not ``name`` (:meth:`Manifest.sidecar_file`). A local
    sidecar that is a link leading out of ``base`` is refused
    (:class:`~shardfeed.errors.UnsafePathError`) unless ``allow_outside``.
    """
    url = contained(base, file or name, where=f"the dataset in '{base}'", what="sidecar",
                    allow_outside=allow_outside)
    try:
        data = _fileio.read_bytes(url) if is_remote(url) else None
        return manifest_check.load_sidecar_array(url, name, records=records, data=data)
    except FileNotFoundError:
        raise FormatError(
            f"file '{url}' is missing but the manifest names a "
            f"{'group' if name == S.GROUPS_NAME else 'order'} key; re-run `shardfeed pack "
            "--resume` or `shardfeed index` to rebuild it"
        ) from None
    except OSError as exc:
        raise FormatError(f"file '{url}' cannot be read ({exc}); rebuild it") from None
