"""Which version of a file or object is read, and whether it is still the one there.

A reader that keeps reading an object after it was rewritten must not hand back old bytes
as if nothing happened. Two kinds of version:

* **An object's** (:class:`ObjectVersion`): what its store says changes when it is
  rewritten, from a listing, a HEAD or the answer to a GET: ETag, generation, version id or
  a checksum of the content, else its modification time (``Last-Modified``, to the second).
  A version that is only a modification time less than :data:`WEAK_SECONDS` before it was
  read is *weak*: a rewrite within the same second would keep it, so nothing may be kept
  under it (the rule HTTP caches follow, RFC 9110 section 8.8.2.2).
* **A local file's** (:class:`LocalFiles`): the file a path names (device and inode), its
  size and modification time, from ``stat`` when a reader opened it. A file replaced by
  another (a rename over it, as shardfeed, editors and most tools write) keeps its old bytes
  for a reader that holds it open or mapped; :meth:`LocalFiles.check` finds that.

A mismatch is a :class:`~shardfeed.errors.ShardChangedError` (:func:`changed_error`).

Determinism: none needed. State: the versions pinned. Memory: a few hundred bytes a file.
"""

from __future__ import annotations

import datetime as _dt
import email.utils
import os
import stat as _stat
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from shardfeed.errors import ShardChangedError
from shardfeed.storage.failures import redact

__all__ = ["WEAK_SECONDS", "LocalFiles", "ObjectVersion", "changed_error", "object_version",
           "obstore_version"]

WEAK_SECONDS = 60.0
"""A version that is only a modification time names one content only once it is this old
when read (RFC 9110 section 8.8.2.2: clocks differ, and a second holds many writes)."""

SETTLED_SECONDS = 2.0
"""A folder last changed this long before it was looked at is *settled*: any later change
gets another modification time, whatever the file system's timestamp granularity (1 ns to
2 s). An unsettled folder has each of its files looked at on every check."""

_IDENTITY = MappingProxyType({
    "ETag": "etag", "etag": "etag", "generation": "generation", "VersionId": "version_id",
    "version_id": "version_id", "md5Hash": "md5", "Content-MD5": "md5", "crc32c": "crc32c",
    "Digest": "digest"})
"""fsspec's names (as ``storage.files.version_of`` reads them) of what names the content."""

_MODIFIED = ("LastModified", "Last-Modified", "last_modified", "updated", "mtime", "created")


@dataclass(frozen=True, slots=True)
class ObjectVersion:
    """One version of an object as its store names it.

    ``fields``: ``(name, value)`` pairs: ``etag``, ``generation``, ``version_id``, ``md5``,
    ``crc32c``, ``digest`` (what names the content), else only ``modified`` (seconds since
    1970, whole). ``weak``: only a modification time, less than :data:`WEAK_SECONDS` old
    when read (see the module docstring).
    """

    fields: tuple[tuple[str, str], ...]
    weak: bool = False

    @property
    def text(self) -> str:
        """``name=value;...``: for messages and cache keys."""
        return ";".join(f"{name}={value}" for name, value in self.fields)

    def get(self, name: str) -> str | None:
        return dict(self.fields).get(name)

    @property
    def etag(self) -> str | None:
        """The ETag as the store gave it (quoted), for an ``If-Match`` header."""
        return self.get("etag")

    @property
    def modified(self) -> int | None:
        value = self.get("modified")
        return None if value is None else int(value)

    def differs(self, other: ObjectVersion) -> bool:
        """Whether ``other`` names another content: a field both give differs. Versions
        with no field in common are not told apart (a store that says different things at
        different times). ETags are compared where both are of one form: a listing and a
        HEAD may come from different APIs of one store, which name a content differently
        (GCS's JSON API gives ``CKih16Gj...``, its XML API the quoted MD5)."""
        mine, theirs = dict(self.fields), dict(other.fields)
        for name in mine.keys() & theirs.keys():
            a, b = mine[name], theirs[name]
            if name == "etag":
                a, b = _tag(a), _tag(b)
                if a[:1] != b[:1] and '"' in (a[:1] + b[:1]):  # quoted, bare: not comparable
                    continue
            if a != b:
                return True
        return False

    def __str__(self) -> str:
        return self.text


def _tag(etag: str) -> str:
    """An ETag without its weakness mark: ``"x"`` (quoted, as HTTP sends it) or ``x``."""
    return etag.strip().removeprefix("W/")


def _seconds(value: object) -> int | None:
    """Whole seconds since 1970 of a modification time (a datetime, an ISO or HTTP date
    string, or a number); None when it cannot be read."""
    if isinstance(value, _dt.datetime):
        when = value if value.tzinfo is not None else value.replace(tzinfo=_dt.timezone.utc)
        return int(when.timestamp())
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, str) and value:
        try:
            return int(email.utils.parsedate_to_datetime(value).timestamp())
        except (TypeError, ValueError, IndexError):
            pass
        try:
            return _seconds(_dt.datetime.fromisoformat(value.replace("Z", "+00:00")))
        except ValueError:
            return None
    return None


def _version(identity: list[tuple[str, str]], modified: object,
             read_at: float | None) -> ObjectVersion | None:
    if identity:
        return ObjectVersion(tuple(identity))
    seconds = _seconds(modified)
    if seconds is None:
        return None
    now = time.time() if read_at is None else read_at
    return ObjectVersion((("modified", str(seconds)),), weak=now - seconds < WEAK_SECONDS)


def object_version(info: Mapping[str, object], *, read_at: float | None = None
                   ) -> ObjectVersion | None:
    """The version an fsspec ``info()`` or listing entry names (None: none), read at
    ``read_at`` (``time.time()``; now when None)."""
    identity: dict[str, str] = {}
    for key, name in _IDENTITY.items():
        value = info.get(key)
        if value not in (None, "") and name not in identity:
            identity[name] = str(value)
    modified = next((info[k] for k in _MODIFIED if info.get(k) not in (None, "")), None)
    return _version(sorted(identity.items()), modified, read_at)


def obstore_version(meta: Mapping[str, object], *, read_at: float | None = None
                    ) -> ObjectVersion | None:
    """The version an obstore ``ObjectMeta`` (a HEAD, a GET's answer) names."""
    identity = [(name, str(meta[key])) for key, name in (("e_tag", "etag"),
                                                         ("version", "version_id"))
                if meta.get(key) not in (None, "")]
    return _version(sorted(identity), written(meta), read_at)


def written(meta: Mapping[str, object]) -> object:
    """An obstore ``ObjectMeta``'s modification time; None where the server gave none
    (obstore then says 1970-01-01, which names no version)."""
    value = meta.get("last_modified")
    if isinstance(value, _dt.datetime) and value.timestamp() == 0:
        return None
    return value


def changed_error(url: str, opened: object, found: object | None, *,
                  gone: bool = False) -> ShardChangedError:
    """The error for a shard that changed since a reader opened it: ``found`` is what is
    there now (None: unknown, the store refused the version asked); ``gone``: removed. Its
    message has the secrets of ``url`` redacted; its ``path`` is ``url`` as given."""
    now = ("it is gone" if gone else "the store refuses that version now" if found is None
           else f"it is now {found}")
    return ShardChangedError(redact(
        f"shard '{url}' changed since this Dataset opened it (it was {opened}; {now}), so "
        "its bytes are no longer those its index and the records read so far describe; "
        "open the Dataset again to read the new version (after `shardfeed index` if its "
        "records changed)"), path=url, opened=str(opened),
        found=None if found is None else str(found))


def _identity(info: os.stat_result) -> tuple[int, int, int, int]:
    return info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns


def _describe(ident: tuple[int, int, int, int]) -> str:
    _, ino, size, mtime_ns = ident
    when = _dt.datetime.fromtimestamp(mtime_ns / 1e9, tz=_dt.timezone.utc)
    return f"inode {ino}, {size} bytes, modified {when.isoformat()}"


class LocalFiles:
    """Local files as they were when a reader opened them, and a cheap check that each path
    still names the same file. Thread-safe.

    ::

        opened:  stat each file (device, inode, size, mtime)     stat each folder once
        check :  stat each folder (one call a folder, not a file)
                   unchanged and settled -> done
                   changed or recent     -> stat each of its files: any differs -> raise

    A file is replaced only through its folder (a rename over it, or a removal and a new
    file), which changes the folder's modification time: one ``stat`` a folder tells that
    none of its files was replaced. A path that is a symbolic link has its target's folder
    watched too. A file written over in place (the same inode) is read as it is at that
    moment (never old bytes; a record being written fails its CRC check), and reported as
    changed when its folder's change has its files looked at.

    Cost: one ``stat`` a folder a check (a few microseconds); a file's ``stat`` each where
    its folder changed in the last :data:`SETTLED_SECONDS`.
    """

    def __init__(self, paths: Sequence[str]) -> None:
        self.paths = [p.removeprefix("file://") for p in paths]
        self._pinned = [_identity(os.stat(p)) for p in self.paths]
        number: dict[str, int] = {}  # folder -> its number
        members: list[list[int]] = []
        self._folders_of: list[tuple[int, ...]] = []
        for k, path in enumerate(self.paths):
            where = {os.path.dirname(os.path.abspath(path))}
            if _stat.S_ISLNK(os.lstat(path).st_mode):
                where.add(os.path.dirname(os.path.realpath(path)))
            for folder in where:
                if folder not in number:
                    number[folder] = len(members)
                    members.append([])
                members[number[folder]].append(k)
            self._folders_of.append(tuple(number[f] for f in where))
        self._folders = list(number)
        self._members = [tuple(m) for m in members]
        self._seen: list[tuple[int, ...] | None] = [None] * len(self._folders)
        self._lock = threading.Lock()
        for i in range(len(self._folders)):  # what they were: their files were just pinned
            self._look(i, check_files=False)

    @property
    def folders(self) -> int:
        """The folders watched."""
        return len(self._folders)

    def check(self, files: Iterable[int] | None = None) -> None:
        """Raise ShardChangedError if one of ``files`` (numbers into ``paths``; None: every
        one) is no longer the file pinned, or any file of a folder found changed."""
        if files is None or len(self._folders) == 1:
            folders: Iterable[int] = range(len(self._folders))
        else:
            folders = {i for k in files for i in self._folders_of[int(k)]}
        for i in folders:
            self._look(i, check_files=True)

    def _look(self, i: int, *, check_files: bool) -> None:
        folder = self._folders[i]
        try:
            info = os.stat(folder)
        except OSError:
            info = None
        key = None if info is None else (info.st_dev, info.st_ino, info.st_mtime_ns,
                                         info.st_ctime_ns)
        seen = self._seen[i]
        if key is not None and seen is not None and seen[:4] == key and seen[4]:
            return  # unchanged since seen settled: none of its files was replaced
        if check_files:
            for k in self._members[i]:
                self.check_file(k)
        if key is not None:
            settled = time.time_ns() - max(key[2], key[3]) > SETTLED_SECONDS * 1e9
            with self._lock:
                self._seen[i] = (*key, int(settled))

    def check_file(self, k: int) -> None:
        """Raise ShardChangedError if ``paths[k]`` is not the file pinned (one ``stat``)."""
        path = self.paths[k]
        try:
            now = _identity(os.stat(path))
        except FileNotFoundError:
            raise changed_error(path, _describe(self._pinned[k]), None, gone=True) from None
        except OSError as exc:
            raise changed_error(path, _describe(self._pinned[k]),
                                f"not readable ({exc.strerror})") from None
        if now != self._pinned[k]:
            raise changed_error(path, _describe(self._pinned[k]), _describe(now))
