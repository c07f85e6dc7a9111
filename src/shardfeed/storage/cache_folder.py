"""What a disk cache folder trusts, and the files it keeps beside its entries.

::

    cache_dir/                    yours (or root's), not writable by other users: else refused
      index.sqlite3[-wal, -shm]   the index (see :mod:`.disk_cache`): regular files, never links
      key                         32 random bytes, 0600 (0640 in a group's folder): the HMAC
                                  key of every entry (see :mod:`.cache_entries`)
      locks/  tmp/                the processes using it (see :mod:`.cache_holders`)
      data/                       the entries

Trust: a cache serves what its folder holds, so it trusts the users who can write the
folder, and no one else. By default that is you alone: a folder owned by another user
(root excepted), or one that other users can write (``o+w``, sticky or not), is refused
with a :class:`~shardfeed.errors.StorageError` saying what to do, unless the user says it is
trusted (``Dataset(..., trust_cache_dir=True)``, ``--trust-cache-dir``): then every user who
can write it is trusted too, except that they cannot make it serve bytes of their own (the
entries' MAC needs the key, which they cannot read unless they share it).

A folder its group can write (``g+w``, e.g. ``chgrp team DIR; chmod 2770 DIR``) is shared
with that group: files are made readable by the group (entries, key, lock files 0640; the
index 0660, as SQLite needs; folders 0770), and each member but the folder's owner passes
``trust_cache_dir=True``. Otherwise files are 0600 and folders 0700, whatever the umask.

Within a trusted folder nothing is followed: the index's files are checked to be regular
files (not links, not hard-linked) before SQLite opens them, and again after; a planted
link is refused with an error naming it, never written through. Entries and the cache's
own folders are opened with ``O_NOFOLLOW`` (see :mod:`.cache_entries`).

Determinism, state, memory: none (files and checks only).
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

from shardfeed.errors import StorageError

INDEX_NAME = "index.sqlite3"
INDEX_FILES = (INDEX_NAME, f"{INDEX_NAME}-wal", f"{INDEX_NAME}-shm", f"{INDEX_NAME}-journal")
"""The index and the files SQLite keeps beside it (created with the index's mode)."""

KEY_NAME = "key"
KEY_BYTES = 32

NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
CLOEXEC = getattr(os, "O_CLOEXEC", 0)
NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # a planted FIFO must not block an open
DIRECTORY = getattr(os, "O_DIRECTORY", 0)

_TRUST_HINT = ("use a folder only you (or your group) can write, or, if you trust every user "
               "who can write this one, pass trust_cache_dir=True (--trust-cache-dir)")


@dataclass(frozen=True, slots=True)
class FolderModes:
    """The modes of what the cache creates: private (0600 / 0700), or a group's (``group``:
    the folder is group-writable)."""

    group: bool

    @property
    def file(self) -> int:
        """Entries, the key, lock files."""
        return 0o640 if self.group else 0o600

    @property
    def index(self) -> int:
        """The index (every user of the cache writes it)."""
        return 0o660 if self.group else 0o600

    @property
    def folder(self) -> int:
        return 0o770 if self.group else 0o700


def check_folder(path: Path, *, trusted: bool) -> FolderModes:
    """Create folder ``path`` (0700) if missing; refuse it (StorageError) when another user
    owns it or other users can write it, unless ``trusted``. Its modes."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        found = os.stat(path)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):  # the caller steps aside
            raise
        raise StorageError(
            f"cannot open the cache folder '{path}': {exc}; give a writable local folder as "
            "cache_dir") from exc
    if not stat.S_ISDIR(found.st_mode):
        raise StorageError(f"the cache folder '{path}' is not a folder; give a folder as "
                           "cache_dir")
    if not trusted:
        me = os.geteuid()
        if found.st_uid not in (me, 0):
            raise StorageError(
                f"the cache folder '{path}' belongs to another user (uid {found.st_uid}): "
                "whoever owns it can plant entries and links there; " + _TRUST_HINT)
        if found.st_mode & stat.S_IWOTH:
            raise StorageError(
                f"the cache folder '{path}' can be written by every user (mode "
                f"{stat.S_IMODE(found.st_mode):o}): anyone could plant entries or links "
                f"there; chmod o-w '{path}', or " + _TRUST_HINT)
    return FolderModes(group=bool(found.st_mode & stat.S_IWGRP))


def check_index_files(path: Path) -> None:
    """StorageError when one of the index's files in folder ``path`` is a link, is linked
    elsewhere, or is not a regular file (never opened through, never written through)."""
    for name in INDEX_FILES:
        where = path / name
        try:
            found = os.lstat(where)
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(found.st_mode):
            what = f"is a symbolic link (to '{os.readlink(where)}')"
        elif not stat.S_ISREG(found.st_mode):
            what = "is not a regular file"
        elif found.st_nlink != 1:
            what = f"has {found.st_nlink} hard links (another file shares it)"
        else:
            continue
        raise StorageError(
            f"the cache's index file '{where}' {what}: the cache never writes through links. "
            "Someone who can write the cache folder put it there; remove it (the cache "
            "starts again empty) and check who can write the folder")


def create_index(path: Path, modes: FolderModes) -> None:
    """Create the index file (empty, the cache's mode) unless it exists, never through a
    link: SQLite gives its WAL and shared-memory files the same mode."""
    try:
        fd = os.open(path / INDEX_NAME, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW
                     | CLOEXEC, modes.index)
    except FileExistsError:
        return
    try:
        os.fchmod(fd, modes.index)
    finally:
        os.close(fd)


def load_key(path: Path, modes: FolderModes) -> bytes:
    """The cache's HMAC key (made now, atomically, when there is none). StorageError when
    the key file is a link, not a regular file, of the wrong size, or readable by users
    outside the cache's (they could forge entries)."""
    where = path / KEY_NAME
    for _ in range(3):  # made by another process meanwhile: read theirs
        try:
            fd = os.open(where, os.O_RDONLY | NOFOLLOW | CLOEXEC | NONBLOCK)
        except FileNotFoundError:
            _make_key(path, modes)
            continue
        except OSError as exc:
            raise _bad_key(where, f"cannot be opened ({exc}); a symbolic link there is "
                                  "never followed") from exc
        with open(fd, "rb", buffering=0, closefd=True) as f:
            found = os.fstat(fd)
            if not stat.S_ISREG(found.st_mode) or found.st_nlink != 1:
                raise _bad_key(where, "is not a regular file of its own")
            if found.st_mode & (stat.S_IRWXO | stat.S_IWGRP):
                raise _bad_key(where, f"can be read or written by other users (mode "
                                      f"{stat.S_IMODE(found.st_mode):o}): anyone could forge "
                                      "entries")
            key = f.read(KEY_BYTES + 1)
        if len(key) != KEY_BYTES:
            raise _bad_key(where, f"holds {len(key)} bytes, not {KEY_BYTES}")
        return key
    raise _bad_key(where, "keeps disappearing")


def _make_key(path: Path, modes: FolderModes) -> None:
    """Write a new key under a name of its own, then link it in as ``key`` (never over one
    another process made meanwhile)."""
    tmp = path / f".key-{secrets.token_hex(8)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW | CLOEXEC, modes.file)
    try:
        try:
            os.fchmod(fd, modes.file)
            os.write(fd, secrets.token_bytes(KEY_BYTES))
            os.fsync(fd)
        finally:
            os.close(fd)
        with contextlib.suppress(FileExistsError):
            os.link(tmp, path / KEY_NAME, follow_symlinks=False)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _bad_key(where: Path, what: str) -> StorageError:
    return StorageError(
        f"the cache's key file '{where}' {what}. Remove it (the cache makes a new key and "
        "fetches its entries again) and check who can write the cache folder")


def open_folder(parent: int, name: str, modes: FolderModes, *, create: bool) -> int:
    """Folder ``name`` under the folder open as ``parent``, opened never through a link
    (OSError: ELOOP / ENOTDIR); made first (with the cache's mode) when ``create``."""
    if create:
        try:
            os.mkdir(name, modes.folder, dir_fd=parent)
        except FileExistsError:
            pass
        else:
            fd = os.open(name, os.O_RDONLY | DIRECTORY | NOFOLLOW | CLOEXEC, dir_fd=parent)
            keep = os.fstat(fd).st_mode & stat.S_ISGID  # a group folder's setgid is inherited
            os.fchmod(fd, modes.folder | keep)
            return fd
    return os.open(name, os.O_RDONLY | DIRECTORY | NOFOLLOW | CLOEXEC, dir_fd=parent)


def remove_tree(parent: int, name: str, *, depth: int = 16) -> None:
    """Remove ``name`` of the folder open as ``parent``, whatever it is: a file or a link
    (the link, not what it leads to), or a folder and everything in it (links in it are
    removed, never followed). Best effort: what cannot be removed stays."""
    try:
        os.unlink(name, dir_fd=parent)
        return
    except FileNotFoundError:
        return
    except OSError:  # a folder (EISDIR, or EPERM on some systems)
        pass
    if depth <= 0:
        return
    with contextlib.suppress(OSError):
        fd = os.open(name, os.O_RDONLY | DIRECTORY | NOFOLLOW | CLOEXEC, dir_fd=parent)
        try:
            for entry in os.listdir(fd):
                remove_tree(fd, entry, depth=depth - 1)
        finally:
            os.close(fd)
        os.rmdir(name, dir_fd=parent)


def open_root(path: Path) -> int:
    """The cache folder itself (the path the user gave; links in it were theirs)."""
    return os.open(path, os.O_RDONLY | DIRECTORY | CLOEXEC)


__all__ = ["INDEX_FILES", "INDEX_NAME", "KEY_NAME", "FolderModes", "check_folder",
           "check_index_files", "create_index", "load_key", "open_folder", "open_root",
           "remove_tree"]
