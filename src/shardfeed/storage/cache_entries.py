"""The disk cache's keys (an object's URL, size and version; a record's number and offset in
it) and its entries' files: one file an entry, bound to the key it is kept under.

::

    data/3f/3f9a...-17-40960.rec   b"SFC2" · 16-byte digest of the key · CRC32C · length · bytes

An entry's file is served only when all four hold: the magic (the format's version), the
digest of the key it is read under, the length and the CRC32C of the bytes. A file copied,
renamed or linked to another entry's name holds another key's digest: it is damaged, not
another record. Files of an older format (another magic) are damaged too, never misread.

Only the cache's own files are read: each entry is opened through the ``data`` folder, its
two-letter folder and its name, none of which may be a symbolic link (``O_NOFOLLOW`` at each
step), and must be a regular file. A planted link or FIFO is
reported as damaged, removed, and never followed. Entries are written under a temporary name
(created exclusively, never through a link) and renamed over the final one.

Determinism: an entry's file is a pure function of its key and its bytes. Memory: one
entry's bytes while it is read or written. Thread-safe: every call opens its own files.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import struct
from collections.abc import Sequence
from pathlib import Path

import google_crc32c

MAGIC = b"SFC2"
"""The entry format: ``SFC1`` entries (no key digest) are read as damaged, and removed."""

HEADER = struct.Struct("<4s16sIQ")  # magic, digest of the key, CRC32C of the data, its length
_DIGEST_BYTES = 16

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # a planted FIFO must not block the open
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)


Version = int | str | None
"""What names an object's bytes beside its URL and size: the manifest's CRC32C (an int), or
what the store says changes when the object is rewritten (a str: ETag, generation, ...)."""


def object_key(url: str, size: int, version: Version) -> str:
    """The key of one object's bytes: its URL, size and version (see :data:`Version`)."""
    text = f"{url}\0{size}\0{type(version).__name__}:{version}"
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def object_keys(urls: Sequence[str], sizes: Sequence[int],
                versions: Sequence[Version], remote: Sequence[bool]) -> list[str]:
    """The key of each object of ``urls`` (``""`` where ``remote`` is False, or where the
    version is None: nothing says when its bytes change, so they are never cached)."""
    return [object_key(u, sizes[k], versions[k]) if remote[k] and versions[k] is not None
            else "" for k, u in enumerate(urls)]


def entry_key(obj: str, part: int, offset: int) -> str:
    """The key of part ``part`` (a record number), at byte ``offset``, of the object keyed
    ``obj``."""
    return f"{obj}-{part}-{offset}"


def key_digest(key: str) -> bytes:
    """The 16 bytes an entry's header holds of its key."""
    return hashlib.blake2b(key.encode(), digest_size=_DIGEST_BYTES).digest()


def entry_name(key: str) -> tuple[str, str]:
    """The folder (under ``data``) and file name of entry ``key``."""
    return key[:2], f"{key}.rec"


class EntryFiles:
    """The entry files under folder ``data`` (see :meth:`prepare`)."""

    def __init__(self, data: Path) -> None:
        self.data = data

    def prepare(self) -> None:
        """Create the ``data`` folder if missing; OSError when it cannot be, or is a link."""
        os.makedirs(self.data, exist_ok=True)
        os.close(self._root())

    def _root(self) -> int:
        """The ``data`` folder, opened never through a link (ELOOP / ENOTDIR)."""
        return os.open(self.data, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC)

    def _folder(self, name: str, *, create: bool) -> int:
        """The entry folder ``name`` (two letters) under ``data``, opened without following a
        link; created first when ``create``."""
        root = self._root()
        try:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, dir_fd=root)
            return os.open(name, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC, dir_fd=root)
        finally:
            os.close(root)

    def read(self, key: str, size: int) -> tuple[bytes | None, bool]:
        """The bytes of entry ``key`` if its file is sound and is ``key``'s (its header names
        it, its length is ``size``, its CRC32C holds); else None, and whether the file was
        there but damaged, another's, or not a plain file (False: no such file)."""
        folder, name = entry_name(key)
        try:
            sub = self._folder(folder, create=False)
        except FileNotFoundError:
            return None, False
        except OSError:  # a link or a file where the folder should be
            return None, True
        try:
            fd = os.open(name, os.O_RDONLY | _NOFOLLOW | _CLOEXEC | _NONBLOCK, dir_fd=sub)
        except FileNotFoundError:
            return None, False
        except OSError:  # ELOOP: a link; anything else the cache did not write
            return None, True
        finally:
            os.close(sub)
        with open(fd, "rb", buffering=0, closefd=True) as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None, True
            head = f.read(HEADER.size)
            data = f.read(size + 1)  # +1: a file too long is damaged
            while len(data) <= size:  # a read may return less than asked: read on
                more = f.read(size + 1 - len(data))
                if not more:
                    break
                data += more
        if len(head) == HEADER.size:
            magic, digest, crc, length = HEADER.unpack(head)
            if (magic == MAGIC and digest == key_digest(key) and length == size == len(data)
                    and google_crc32c.value(data) == crc):
                return data, False
        return None, True

    def write(self, key: str, data: bytes, *, tag: str) -> None:
        """Write entry ``key`` (under a temporary name ending in ``tag``, then renamed).
        Raises OSError (ENOSPC on a full disk); nothing is left under either name then."""
        folder, name = entry_name(key)
        tmp = f"{name}.tmp-{tag}"
        head = HEADER.pack(MAGIC, key_digest(key), google_crc32c.value(data), len(data))
        sub = self._folder(folder, create=True)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC,
                         0o666, dir_fd=sub)
            try:
                try:
                    _write_all(fd, head)
                    _write_all(fd, data)
                finally:
                    os.close(fd)
                os.replace(tmp, name, src_dir_fd=sub, dst_dir_fd=sub)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=sub)
                raise
        finally:
            os.close(sub)

    def remove(self, key: str) -> None:
        """Remove entry ``key``'s file (a link there is removed, not what it leads to; so is
        a link or a file that took the place of its folder)."""
        folder, name = entry_name(key)
        try:
            root = self._root()
        except OSError:
            return  # the data folder is gone or was replaced: no file of the cache is there
        try:
            try:
                sub = os.open(folder, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC,
                              dir_fd=root)
            except FileNotFoundError:
                return
            except OSError:
                with contextlib.suppress(OSError):
                    os.unlink(folder, dir_fd=root)
                return
            try:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(name, dir_fd=sub)
            finally:
                os.close(sub)
        finally:
            os.close(root)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


__all__ = ["HEADER", "MAGIC", "EntryFiles", "Version", "entry_key", "entry_name", "key_digest",
           "object_key", "object_keys"]
