"""Who holds the reservations of a disk cache folder, and whether they still live.

::

    locks/3f9a0c17e1d2b4a8.lock   one a cache opened by a process: locked (flock) while it is
                                  open; the kernel drops the lock when the process ends,
                                  however it ends (exit, SIGKILL, out of memory, a container
                                  stopped)
    tmp/3f9a0c17e1d2b4a8/         its entries being written, renamed into data/ when whole

A reservation names its *holder* (16 random hex digits, drawn when a process opens the
cache), never a pid: pids repeat across containers (every job may be pid 1 in its own), are
reused, and a process cannot tell its own pid in a row from another's. A holder lives while
its lock file is locked: another process tries the lock (never waiting for it); if it gets
it, the holder is dead, and its reservations, temp files and lock file are removed. A lock
file appears under its name only once locked (it is made under a hidden name, locked, then
renamed), so a holder being born is never taken for dead; hidden ones whose maker died
before naming them are removed after :data:`NEWBORN_SECONDS`.

A live holder that does not fill what it reserved (a process stopped by SIGSTOP or a
debugger, a hung mount) is not dead: its reservations and temp files stay, counted in the
cache's size, until it fills them or ends; those waiting for it give up at their deadline
and fetch the records themselves (see :meth:`~shardfeed.storage.disk_cache.DiskCache.await_entries`).

Determinism: none needed. State: this process's lock file and temp folder (a forked child
makes its own). Memory: none.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import secrets
import stat
import time
import weakref
from collections.abc import Iterable
from pathlib import Path

from shardfeed.storage.cache_folder import (
    CLOEXEC,
    DIRECTORY,
    NOFOLLOW,
    NONBLOCK,
    FolderModes,
    open_folder,
    open_root,
    remove_tree,
)

LOCKS = "locks"
TEMP = "tmp"
NEWBORN_SECONDS = 60.0
"""A hidden lock file left unlocked this long: its process died between making and naming it."""

_TOKEN = re.compile(r"[0-9a-f]{16}")


def is_token(text: object) -> bool:
    """Whether ``text`` can name a holder (a row's holder is data: never a path)."""
    return isinstance(text, str) and _TOKEN.fullmatch(text) is not None


class Holder:
    """This process's mark on the cache folder ``path``: its lock file, locked while it is
    open, and its temp folder (:attr:`temp`, an open folder descriptor). A holder dropped
    without :meth:`release` (its cache never closed) closes both when collected: its lock
    goes, and others take it for dead."""

    def __init__(self, path: Path, modes: FolderModes) -> None:
        self.path = path
        self.token = secrets.token_hex(8)
        self._fds = [-1, -1]  # the lock file, the temp folder
        self._close = weakref.finalize(self, _close_all, self._fds)
        root = open_root(path)
        try:
            self._fds[0] = _locked_file(root, self.token, modes)
            temps = open_folder(root, TEMP, modes, create=True)
            try:
                self._fds[1] = open_folder(temps, self.token, modes, create=True)
            finally:
                os.close(temps)
        except BaseException:
            self.release(remove=True)
            raise
        finally:
            os.close(root)

    @property
    def temp(self) -> int:
        """The temp folder, open (-1 once released)."""
        return self._fds[1]

    def release(self, *, remove: bool) -> None:
        """Let go: with ``remove``, its temp folder and lock file are removed first (this
        process is done with the cache); without, only this process's descriptors are
        closed (a forked child's copies: the parent holds on). Idempotent."""
        if remove and self._fds[0] >= 0:
            sweep(self.path, [self.token])
        self._close()


def _close_all(fds: list[int]) -> None:
    for n, fd in enumerate(fds):
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)
        fds[n] = -1


def _locked_file(root: int, token: str, modes: FolderModes) -> int:
    """Make ``locks/<token>.lock``, locked before it has its name; its descriptor."""
    locks = open_folder(root, LOCKS, modes, create=True)
    try:
        hidden = f".{token}.new"
        fd = os.open(hidden, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW | CLOEXEC,
                     modes.file, dir_fd=locks)
        try:
            os.fchmod(fd, modes.file)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.rename(hidden, f"{token}.lock", src_dir_fd=locks, dst_dir_fd=locks)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(hidden, dir_fd=locks)
            raise
        return fd
    finally:
        os.close(locks)


def alive(path: Path, token: str) -> bool:
    """Whether holder ``token`` of the cache folder ``path`` lives: its lock file is locked.
    False for what cannot be a holder, or has no lock file (a row forged, or written by an
    older shardfeed). Never waits."""
    if not is_token(token):
        return False
    try:
        fd = os.open(path / LOCKS / f"{token}.lock",
                     os.O_RDONLY | NOFOLLOW | CLOEXEC | NONBLOCK)
    except OSError:  # gone, or something the cache did not make (a link): no holder there
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:  # a file system without flock: taken for alive (waits end at deadlines)
        return True
    finally:
        os.close(fd)  # a lock taken here goes with it
    return False


def dead_holders(path: Path) -> set[str]:
    """Holders whose lock file or temp folder is in ``path`` but that do not live."""
    found = {n[: -len(".lock")] for n in _names(path / LOCKS) if n.endswith(".lock")}
    found.update(_names(path / TEMP))
    return {token for token in found if is_token(token) and not alive(path, token)}


def sweep(path: Path, tokens: Iterable[str]) -> None:
    """Remove the temp folders (every temp file in them) and lock files of holders
    ``tokens`` (dead ones, or this process's own on closing), and hidden lock files whose
    maker died before naming them. Links are removed, never followed."""
    try:
        root = open_root(path)
    except OSError:
        return
    try:
        tokens = [token for token in tokens if is_token(token)]
        for token in tokens:
            _remove_folder(root, TEMP, token)
        try:
            locks = os.open(LOCKS, os.O_RDONLY | DIRECTORY | NOFOLLOW | CLOEXEC, dir_fd=root)
        except OSError:  # none, or not the cache's (a link): nothing of the cache's there
            return
        try:
            for token in tokens:
                with contextlib.suppress(OSError):
                    os.unlink(f"{token}.lock", dir_fd=locks)
            _remove_stillborn(locks)
        finally:
            os.close(locks)
    finally:
        os.close(root)


def _remove_folder(root: int, parent: str, name: str) -> None:
    """Remove ``parent/name`` (a holder's temp folder, or whatever took its place)."""
    try:
        up = os.open(parent, os.O_RDONLY | DIRECTORY | NOFOLLOW | CLOEXEC, dir_fd=root)
    except OSError:
        return
    try:
        remove_tree(up, name)
    finally:
        os.close(up)


def _remove_stillborn(locks: int) -> None:
    """Remove the hidden lock files of the folder open as ``locks`` whose maker died before
    naming them (unlocked, older than :data:`NEWBORN_SECONDS`)."""
    now = time.time()
    for name in os.listdir(locks):
        if not (name.startswith(".") and name.endswith(".new")):
            continue
        with contextlib.suppress(OSError):
            if now - os.stat(name, dir_fd=locks, follow_symlinks=False).st_mtime < \
                    NEWBORN_SECONDS:
                continue
            fd = os.open(name, os.O_RDONLY | NOFOLLOW | CLOEXEC | NONBLOCK, dir_fd=locks)
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                os.unlink(name, dir_fd=locks)
            finally:
                os.close(fd)


def temp_bytes(path: Path) -> int:
    """The bytes of the temp files in ``path`` now (entries being written, or left by a
    holder that died and is not yet swept)."""
    total = 0
    for token in _names(path / TEMP):
        folder = path / TEMP / token
        for name in _names(folder):
            with contextlib.suppress(OSError):
                found = os.lstat(folder / name)
                if stat.S_ISREG(found.st_mode):
                    total += found.st_size
    return total


def _names(folder: Path) -> list[str]:
    """The names in ``folder`` (none when it is missing, a link or not a folder)."""
    try:
        fd = os.open(folder, os.O_RDONLY | DIRECTORY | NOFOLLOW | CLOEXEC)
    except OSError:
        return []
    try:
        return os.listdir(fd)
    finally:
        os.close(fd)


__all__ = ["LOCKS", "NEWBORN_SECONDS", "TEMP", "Holder", "alive", "dead_holders", "is_token",
           "sweep", "temp_bytes"]
