"""The disk cache's keys (an object's URL, size and version; a record's number and offset in
it) and its entries' files: one file an entry, bound to the key it is kept under.

::

    data/3f/3f9a...-17-40960.rec   b"SFC3" · HMAC-SHA256 of key, length and bytes · length · bytes

An entry's file is served only when its magic (the format's version), its length and its
MAC hold: an HMAC-SHA256, under the cache's key (see :mod:`.cache_folder`), of the key it is
read under, the length and the bytes. A file copied, renamed or linked to another entry's
name is another key's: damaged, not another record; a file made without the key (forged
with any digest and CRC one likes, or written under an older format or another folder's
key) is damaged too. Damaged files are removed and their records fetched again.

Only the cache's own files are read: each entry is opened through the ``data`` folder, its
two-letter folder and its name, none of which may be a symbolic link (``ONOFOLLOW`` at each
step), and must be a regular file. A planted link or FIFO is reported as damaged, removed,
and never followed. Entries are written in the writer's temp folder (created exclusively,
never through a link; see :mod:`.cache_holders`) and renamed over the final name.

Determinism: an entry's file is a pure function of the key, its bytes and the cache's key.
Memory: one entry's bytes while it is read or written. Thread-safe: every call opens its own
files. Cost: the MAC reads the bytes once (about 1.5 GB/s a core, the GIL released).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import stat
import struct
import threading
from collections.abc import Sequence
from pathlib import Path

from shardfeed.storage.cache_folder import (
    CLOEXEC,
    DIRECTORY,
    NOFOLLOW,
    NONBLOCK,
    FolderModes,
    open_folder,
    remove_tree,
)

PRIVATE = FolderModes(group=False)

MAGIC = b"SFC3"
"""The entry format: ``SFC1`` (no key digest) and ``SFC2`` (an unkeyed digest and a CRC32C)
entries are read as damaged, and removed."""

HEADER = struct.Struct("<4s32sQ")  # magic, HMAC-SHA256 of key, length and bytes, the length


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


def entry_mac(secret: bytes, key: str, data: bytes | memoryview) -> bytes:
    """The MAC an entry's header holds: HMAC-SHA256 under the cache's ``secret`` of the
    entry's key, the length of its bytes and the bytes."""
    mac = hmac.new(secret, key.encode() + b"\0" + len(data).to_bytes(8, "little"),
                   hashlib.sha256)
    mac.update(data)
    return mac.digest()


def entry_name(key: str) -> tuple[str, str]:
    """The folder (under ``data``) and file name of entry ``key``."""
    return key[:2], f"{key}.rec"


class EntryFiles:
    """The entry files under folder ``data``, made with ``modes`` and authenticated with
    ``secret`` (None: the cache has no key, as when it stepped aside before reading it;
    then nothing is served)."""

    def __init__(self, data: Path, *, secret: bytes | None,
                 modes: FolderModes = PRIVATE) -> None:
        self.data = data
        self.secret = secret
        self.modes = modes

    def prepare(self) -> None:
        """Create the ``data`` folder if missing; OSError when it cannot be, or is a link."""
        parent = os.open(self.data.parent, os.O_RDONLY | CLOEXEC)
        try:
            os.close(open_folder(parent, self.data.name, self.modes, create=True))
        finally:
            os.close(parent)

    def _root(self) -> int:
        """The ``data`` folder, opened never through a link (ELOOP / ENOTDIR)."""
        return os.open(self.data, os.O_RDONLY | DIRECTORY | NOFOLLOW | CLOEXEC)

    def _folder(self, name: str, *, create: bool) -> int:
        """The entry folder ``name`` (two letters) under ``data``, opened without following a
        link; created first when ``create``."""
        root = self._root()
        try:
            return open_folder(root, name, self.modes, create=create)
        finally:
            os.close(root)

    def read(self, key: str, size: int) -> tuple[bytes | None, bool]:
        """The bytes of entry ``key`` if its file is sound and is ``key``'s (its length is
        ``size``, its MAC holds); else None, and whether the file was there but damaged,
        another's, forged, or not a plain file (False: no such file)."""
        folder, name = entry_name(key)
        try:
            sub = self._folder(folder, create=False)
        except FileNotFoundError:
            return None, False
        except OSError:  # a link or a file where the folder should be
            return None, True
        try:
            fd = os.open(name, os.O_RDONLY | NOFOLLOW | CLOEXEC | NONBLOCK, dir_fd=sub)
        except FileNotFoundError:
            return None, False
        except OSError:  # ELOOP: a link; anything else the cache did not write
            return None, True
        finally:
            os.close(sub)
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # a folder, a FIFO, a device
            os.close(fd)
            return None, True
        with open(fd, "rb", buffering=0, closefd=True) as f:
            head = f.read(HEADER.size)
            data = f.read(size + 1)  # +1: a file too long is damaged
            while len(data) <= size:  # a read may return less than asked: read on
                more = f.read(size + 1 - len(data))
                if not more:
                    break
                data += more
        if len(head) == HEADER.size and self.secret is not None:
            magic, mac, length = HEADER.unpack(head)
            if (magic == MAGIC and length == size == len(data)
                    and hmac.compare_digest(mac, entry_mac(self.secret, key, data))):
                return data, False
        return None, True

    def write(self, key: str, data: bytes, *, temp: int) -> None:
        """Write entry ``key``: in the folder open as ``temp`` (the writer's, see
        :mod:`.cache_holders`), then renamed into place. Raises OSError (ENOSPC on a full
        disk; FileNotFoundError when the temp folder was swept); nothing is left under
        either name then."""
        if self.secret is None:
            raise FileNotFoundError("the cache has no key")
        folder, name = entry_name(key)
        tmp = f"{name}.{threading.get_ident()}"
        head = HEADER.pack(MAGIC, entry_mac(self.secret, key, data), len(data))
        sub = self._folder(folder, create=True)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW | CLOEXEC,
                         self.modes.file, dir_fd=temp)
            try:
                try:
                    if self.modes.group:  # the umask may have taken the group's read
                        os.fchmod(fd, self.modes.file)
                    _write_all(fd, head)
                    _write_all(fd, data)
                finally:
                    os.close(fd)
                try:
                    os.replace(tmp, name, src_dir_fd=temp, dst_dir_fd=sub)
                except IsADirectoryError:  # a folder planted at its name: replaced too
                    remove_tree(sub, name)
                    os.replace(tmp, name, src_dir_fd=temp, dst_dir_fd=sub)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=temp)
                raise
        finally:
            os.close(sub)

    def remove(self, key: str) -> None:
        """Remove entry ``key``'s file (a link there is removed, not what it leads to; so is
        a link or a file that took the place of its folder, or a folder that took the
        file's). Never raises: what cannot be removed stays, and is damaged when read."""
        folder, name = entry_name(key)
        try:
            root = self._root()
        except OSError:
            return  # the data folder is gone or was replaced: no file of the cache is there
        try:
            try:
                sub = os.open(folder, os.O_RDONLY | DIRECTORY | NOFOLLOW | CLOEXEC,
                              dir_fd=root)
            except FileNotFoundError:
                return
            except OSError:
                with contextlib.suppress(OSError):
                    os.unlink(folder, dir_fd=root)
                return
            try:
                remove_tree(sub, name)  # a folder planted there too
            finally:
                os.close(sub)
        finally:
            os.close(root)

    def remove_all(self) -> None:
        """Remove every file in the entry folders (entries and temp files of an older
        format, whose rows are gone); links are removed, not followed."""
        try:
            root = self._root()
        except OSError:
            return
        try:
            for folder in os.listdir(root):
                try:
                    sub = os.open(folder, os.O_RDONLY | DIRECTORY | NOFOLLOW | CLOEXEC,
                                  dir_fd=root)
                except OSError:
                    with contextlib.suppress(OSError):
                        os.unlink(folder, dir_fd=root)
                    continue
                try:
                    for name in os.listdir(sub):
                        remove_tree(sub, name)
                finally:
                    os.close(sub)
        finally:
            os.close(root)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


__all__ = ["HEADER", "MAGIC", "EntryFiles", "Version", "entry_key", "entry_mac", "entry_name",
           "object_key", "object_keys"]
