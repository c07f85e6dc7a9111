"""A cache of remote bytes on local disk, bounded in bytes, shared by the processes of a machine.

::

    cache_dir/
      index.sqlite3                  one row an entry: key, object URL, size, next use, ready,
                                     the holder of a reservation
      key                            the key of the entries' MACs (see :mod:`.cache_folder`)
      locks/  tmp/                   one lock file and temp folder a process using the cache
                                     (see :mod:`.cache_holders`)
      data/3f/3f9a...-17-40960.rec   one file an entry (see :mod:`.cache_entries`): the
                                     format, a MAC of its key, length and bytes, the bytes

An entry is an immutable value under a key that names what it holds (see :func:`~shardfeed.storage.cache_entries.entry_key`:
the object's URL, its size and version (checksum, or what the store says changes: ETag,
generation, modification time), and the record's number and offset), so a rewritten object
never hits an old entry; old entries are evicted like any other.

Which entries stay is decided by each entry's *next use*, a number the caller gives (the
Loader gives the global position of the next batch that reads it: its order is known in
advance). When an entry does not fit, the entries used last (largest next use) are evicted,
but only those used later than the newcomer: if none is, the newcomer is not kept at all.
With the true next uses this is Bélády's optimal policy. An entry whose next use has passed
(``< now``), or that was put without one (:data:`UNKNOWN_USE`), goes first, oldest first.

Safety: several processes (ranks, workers, runs) may share one folder. The index is SQLite
in WAL mode: every decision (admit, evict) is one transaction, so the total stays within
``max_bytes`` whoever writes. An entry is *reserved* before its bytes arrive and *ready*
after, and only ready entries are read; a reservation counts in the total (so does the
temp file its bytes are written to, in the writer's temp folder, before being renamed in).
Every read checks that the file is the entry of the key read, whole and made with the
cache's key (its MAC): a damaged, forged or swapped file is removed and reported as a miss
(the caller fetches the bytes again). What the cache trusts (the users who can write its
folder) and refuses (a folder others can write, links): :mod:`.cache_folder`.

A reservation names its holder, a lock file its process keeps locked (never a pid, see
:mod:`.cache_holders`). A holder found dead (its lock free: the process ended, however) has
its reservations dropped and its temp files removed, by whoever finds it: a process opening
the cache, or one waiting for its records. A holder alive but not filling (stopped) is
waited for until the waiter's deadline only; then the waiter fetches the records itself,
and no one waits for that holder again until it fills an entry. Entries of an older format
are dropped (with every file of theirs, temp files too) when a folder is first opened by
this one. The folder must be on a local file system (SQLite's and flock's locks).

A cache that cannot write (a full disk, a quota, a folder that went read-only) steps aside:
it says so once (a RuntimeWarning naming the folder and the error), keeps nothing more for
the rest of this process's use of it, and reads what it holds while that works; everything
else is read from storage. Nothing it could not write is ever read back as whole.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sqlite3
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from shardfeed.errors import StorageError
from shardfeed.storage.cache_entries import PRIVATE, EntryFiles
from shardfeed.storage.cache_folder import (
    INDEX_NAME,
    check_folder,
    check_index_files,
    create_index,
    load_key,
)
from shardfeed.storage.cache_holders import Holder, alive, dead_holders, sweep, temp_bytes
from shardfeed.storage.process_state import PROCESS

UNKNOWN_USE = 1 << 62
"""The next use of an entry put without one: evicted before any entry with a known use."""

ENTRY_FORMAT = 3
"""The entries' layout (see :mod:`.cache_entries`) and the index's (reservations name a
holder); a folder of another is emptied on open."""

_PARAMS = 400  # keys a query at most (SQLite's limit on parameters is 999 or more)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS entries(
    key TEXT PRIMARY KEY, url TEXT NOT NULL, size INTEGER NOT NULL,
    next_use INTEGER NOT NULL, seq INTEGER NOT NULL, ready INTEGER NOT NULL,
    pid INTEGER NOT NULL, holder TEXT NOT NULL DEFAULT '');
CREATE INDEX IF NOT EXISTS by_use ON entries(next_use DESC, seq);
CREATE TABLE IF NOT EXISTS stalled(holder TEXT PRIMARY KEY);
CREATE TABLE IF NOT EXISTS meta(name TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT OR IGNORE INTO meta VALUES ('total', 0), ('seq', 0), ('max_bytes', 0), ('format', 0);
"""

_FULL = (errno.ENOSPC, errno.EDQUOT)


WAIT_POLL_SECONDS = 0.02
"""How often :meth:`DiskCache.await_entries` looks for an entry another fetch is writing: a
small share of a request's latency to object storage (20-100 ms), a few index reads a second."""


@dataclass(slots=True)
class CacheCounters:
    """What one process's :class:`DiskCache` did since opening."""

    hits: int = 0
    misses: int = 0
    corrupt: int = 0
    admitted: int = 0
    bypassed: int = 0
    evicted: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    stepped_aside: int = 0  # 1 once the cache could not write (see the module docstring)

    def hit_rate(self) -> float:
        looked = self.hits + self.misses
        return self.hits / looked if looked else 0.0


@dataclass(frozen=True, slots=True)
class CacheSummary:
    """What a cache folder holds: entries and bytes in all, and a row an object."""

    path: str
    entries: int
    bytes: int
    max_bytes: int
    reserved: int
    objects: list[tuple[str, int, int]] = field(default_factory=list)  # url, entries, bytes
    temp_bytes: int = 0  # temp files now (entries being written; counted by their reservations)


def wal_mode(conn: sqlite3.Connection, *, seconds: float) -> None:
    """Put the index in WAL mode (a no-op once it is). Several processes opening a new cache
    folder at once each ask for it; SQLite answers "database is locked" at once, without
    waiting, to all but one of the connections that would otherwise deadlock, so each tries
    again, a few milliseconds apart, for up to ``seconds``."""
    end = time.monotonic() + seconds
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= end:
                raise
            time.sleep(0.005)


class DiskCache:
    """The cache in folder ``path``, holding at most ``max_bytes`` of entries. Thread-safe.

    ``max_bytes=None`` opens a folder to look at or clear (``shardfeed cache``): the bound is
    the one its users set last. ``trust_folder``: open a folder that another user owns or
    other users can write (refused otherwise, see :mod:`.cache_folder`).

    Memory: one SQLite connection (its page cache, a few MiB). Disk: ``max_bytes`` of entries
    plus a 44-byte header and the file system's rounding an entry, and the index (about 170
    bytes an entry). Descriptors: a lock file and a temp folder while it writes.
    """

    def __init__(self, path: str | os.PathLike[str], *, max_bytes: int | None,
                 trust_folder: bool = False) -> None:
        if max_bytes is not None and (isinstance(max_bytes, bool)
                                      or not isinstance(max_bytes, int) or max_bytes < 0):
            raise ValueError(f"cache_bytes must be an int >= 0, got {max_bytes!r}")
        if not isinstance(trust_folder, bool):
            raise TypeError(f"trust_cache_dir must be True or False, got {trust_folder!r}")
        text = os.fspath(path)
        if "://" in text:
            raise ValueError(
                f"cache_dir must be a local folder (the cache holds what object storage "
                f"serves), got {text!r}")
        self.path = Path(text)
        self._bound = max_bytes
        self._trusted = trust_folder
        self.max_bytes = max_bytes or 0
        self.counters = CacheCounters()
        self.aside: str | None = None
        """Why the cache stepped aside (None: it has not; see the module docstring)."""
        self._lock = threading.Lock()
        self._aside_lock = threading.Lock()
        self._holder_lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._parents_conn: sqlite3.Connection | None = None  # see _after_fork
        self._owner: Holder | None = None  # this process's holder, made when it first writes
        self._closed = False
        self._modes = PRIVATE
        self._files = EntryFiles(self.path / "data", secret=None)
        PROCESS.at_fork(self, DiskCache._after_fork)
        try:
            self._modes = check_folder(self.path, trusted=trust_folder)
            self._files = EntryFiles(self.path / "data", secret=load_key(self.path, self._modes),
                                     modes=self._modes)
            self._files.prepare()
            self._db()
            self._drop_other_formats()
            self._drop_dead_holders()
        except (OSError, sqlite3.Error) as exc:
            if not _is_full(exc):
                raise StorageError(
                    f"cannot open the cache folder '{self.path}': {exc}; give a writable "
                    "local folder as cache_dir, or remove a damaged one (shardfeed cache "
                    "--clear)") from exc
            self._step_aside(exc)

    @classmethod
    def existing(cls, path: str | os.PathLike[str], *, trust_folder: bool = False) -> DiskCache:
        """The cache in folder ``path`` opened to look at or clear (its bound left as its
        users set it); FileNotFoundError when the folder is not a cache."""
        try:
            os.lstat(os.path.join(os.fspath(path), INDEX_NAME))  # a link there: refused later
        except FileNotFoundError:
            raise FileNotFoundError(
                f"'{os.fspath(path)}' is not a shardfeed cache folder (no {INDEX_NAME}); give "
                "the cache_dir a Dataset was opened with") from None
        return cls(path, max_bytes=None, trust_folder=trust_folder)

    # -- connection -----------------------------------------------------------------------

    def _db(self) -> sqlite3.Connection:
        """This process's connection (a forked child opens its own). The index's files are
        checked before and after SQLite opens them: never a link (see :mod:`.cache_folder`)."""
        if self._conn is None:
            check_index_files(self.path)
            try:
                create_index(self.path, self._modes)
            except OSError as exc:  # as SQLite would fail to: callers step aside on it
                raise sqlite3.OperationalError(f"cannot create the index: {exc}") from exc
            conn = sqlite3.connect(self.path / INDEX_NAME, timeout=60.0,
                                   isolation_level=None, check_same_thread=False)
            try:
                wal_mode(conn, seconds=60.0)
                conn.execute("PRAGMA synchronous=NORMAL")
                conn.executescript(_SCHEMA)
                check_index_files(self.path)  # what SQLite opened was what was checked
                if self._bound is None:  # opened to look at: the bound its users set last
                    self.max_bytes = conn.execute(
                        "SELECT value FROM meta WHERE name='max_bytes'").fetchone()[0]
                else:
                    conn.execute("UPDATE meta SET value=? WHERE name='max_bytes'",
                                 (self._bound,))
            except BaseException:
                conn.close()
                raise
            self._conn, self._parents_conn = conn, None
        return self._conn

    def _holder(self) -> Holder:
        """This process's holder of reservations (made when first needed; OSError when its
        lock file or temp folder cannot be made)."""
        with self._holder_lock:
            owner = self._owner
            if owner is None:
                owner = self._owner = Holder(self.path, self._modes)
            return owner

    def _after_fork(self) -> None:
        """In a forked child: let go of the parent's holder (the parent keeps it locked: the
        child shares its lock file's open description, and closing the child's copies leaves
        the lock held); the child makes holders of its own when it writes. The parent's
        connection is set aside unused, and dropped when the child opens its own or closes."""
        owner, self._owner = self._owner, None
        if owner is not None:
            owner.release(remove=False)
        self._parents_conn, self._conn = self._conn, None

    def _step_aside(self, exc: BaseException) -> None:
        """Keep nothing more (the bytes are read from storage); say why, once."""
        with self._aside_lock:
            if self.aside is not None:
                return
            self.aside = str(exc)
            self.counters.stepped_aside = 1
        what = "is on a full disk" if _is_full(exc) else "cannot be written"
        warnings.warn(
            f"the disk cache '{self.path}' {what} ({exc}); it keeps nothing more in this "
            "process and records are read from storage. Free space there, or give a smaller "
            "cache_bytes or another cache_dir", RuntimeWarning, stacklevel=3)

    def _drop_dead_holders(self) -> None:
        """Drop the reservations, temp files and lock files of holders that died (and
        reservations that name no holder: forged, or an older shardfeed's)."""
        db = self._db()
        holders = {h for (h,) in db.execute(
            "SELECT DISTINCT holder FROM entries WHERE ready=0")}
        dead = {h for h in holders if not alive(self.path, h)} | dead_holders(self.path)
        if dead:
            with self._lock:
                self._transaction(partial(self._drop_holders, sorted(dead)), raising=True)

    def _drop_other_formats(self) -> None:
        """Empty a folder whose entries another format wrote (they would all be damaged),
        with every file left in its entry folders (temp files of killed writers too)."""
        db = self._db()
        (found,) = db.execute("SELECT value FROM meta WHERE name='format'").fetchone()
        if found == ENTRY_FORMAT:
            return

        def body() -> list[str]:
            (now,) = db.execute("SELECT value FROM meta WHERE name='format'").fetchone()
            if now == ENTRY_FORMAT:  # another process did it meanwhile
                return []
            self._delete_all()
            columns = {row[1] for row in db.execute("PRAGMA table_info(entries)")}
            if "holder" not in columns:
                db.execute("ALTER TABLE entries ADD COLUMN holder TEXT NOT NULL DEFAULT ''")
            db.execute("DELETE FROM stalled")
            self._files.remove_all()
            db.execute("UPDATE meta SET value=? WHERE name='format'", (ENTRY_FORMAT,))
            return []

        with self._lock:
            self._transaction(body, raising=True)

    def _drop_holders(self, holders: Sequence[str]) -> list[str]:
        """Drop the reservations of dead ``holders`` and remove their temp folders and lock
        files; the keys dropped (a file renamed in before its holder died goes too)."""
        db = self._db()
        keys: list[str] = []
        for lo in range(0, len(holders), _PARAMS):
            part = list(holders[lo : lo + _PARAMS])
            marks = ",".join("?" * len(part))
            rows = db.execute(f"SELECT key, size FROM entries WHERE ready=0 AND holder IN "
                              f"({marks})", part).fetchall()
            self._delete(rows)
            db.execute(f"DELETE FROM stalled WHERE holder IN ({marks})", part)
            keys += [k for k, _ in rows]
        sweep(self.path, holders)  # under the index's write lock: one sweeper at a time
        return keys

    def _transaction(self, body: Callable[[], list[str]], *, raising: bool = False,
                     even_aside: bool = False) -> list[str] | None:
        """Run ``body()`` in one write transaction and unlink the files of the entries it
        removed (returned) before committing: while the transaction holds the write lock no
        process can reserve those keys again, so a file written for a new reservation is
        never removed by an old eviction.

        None when the cache has stepped aside, or steps aside now because the transaction
        failed on the folder or the index (``raising``: the error is raised instead;
        ``even_aside``: tried all the same, so that a cache that stepped aside still gives up
        what it reserved when it can)."""
        if self.aside is not None and not (raising or even_aside):
            return None
        try:
            db = self._db()
            db.execute("BEGIN IMMEDIATE")
            try:
                doomed = body()
                for key in doomed:
                    self._files.remove(key)
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:  # SQLite ends it itself on some errors (a full disk)
                    db.execute("ROLLBACK")
                raise
        except (OSError, sqlite3.Error) as exc:
            if raising:
                raise
            self._step_aside(exc)
            return None
        return list(doomed)

    def _delete(self, rows: Sequence[tuple[str, int]]) -> None:
        if not rows:
            return
        db = self._db()
        freed = 0
        for key, _ in rows:  # an entry another process removed meanwhile frees nothing
            for (size,) in db.execute("DELETE FROM entries WHERE key=? RETURNING size", (key,)):
                freed += size
        db.execute("UPDATE meta SET value=value-? WHERE name='total'", (freed,))

    def _delete_all(self) -> list[str]:
        db = self._db()
        keys = [k for (k,) in db.execute("SELECT key FROM entries")]
        db.execute("DELETE FROM entries")
        db.execute("UPDATE meta SET value=0 WHERE name='total'")
        return keys

    # -- reading --------------------------------------------------------------------------

    def get_many(self, keys: Sequence[str], *, next_use: Sequence[int] | None = None,
                 count: bool = True) -> list[bytes | None]:
        """The bytes of each ready entry of ``keys`` (None: not held, or damaged and now
        removed): :meth:`look_up`, then :meth:`read_entries` of those ready. ``count``: add
        to the hit and miss counters."""
        rows = self.look_up(keys, next_use=next_use)
        ready = [(i, row[0]) for i, row in enumerate(rows) if row is not None and row[1]]
        got = self.read_entries([(keys[i], size) for i, size in ready])
        out: list[bytes | None] = [None] * len(keys)
        for (i, _), data in zip(ready, got):
            out[i] = data
        if count:
            hits = sum(data is not None for data in got)
            self.tally(hits, len(keys) - hits)
        return out

    def look_up(self, keys: Sequence[str], *, next_use: Sequence[int] | None = None
                ) -> list[tuple[int, bool] | None]:
        """``(size, ready)`` of each entry of ``keys`` held or reserved (None: neither, or
        the index cannot be read); with ``next_use``, the entries held are given these next
        uses (unless the cache has stepped aside)."""
        with self._lock:
            try:
                rows = self._rows(keys)
            except sqlite3.Error as exc:
                rows = {}
                failed: sqlite3.Error | None = exc
            else:
                failed = None
            out = [rows.get(key) for key in keys]
            if next_use is not None and failed is None:
                uses = [(int(next_use[i]), key) for i, key in enumerate(keys) if key in rows]
                if uses:
                    self._transaction(lambda: self._after_read([], uses))
        if failed is not None:
            self._step_aside(failed)
        return out

    def tally(self, hits: int, misses: int) -> None:
        """Add to the hit and miss counters."""
        with self._lock:
            self.counters.hits += hits
            self.counters.misses += misses

    def read_entries(self, entries: Sequence[tuple[str, int]]) -> list[bytes | None]:
        """The bytes of ready entries ``(key, size)`` (as :meth:`look_up` gave them), checked
        to be these keys' entries and against their CRC32C; None where the file is gone
        (evicted by another process meanwhile), damaged or another's (then removed, and
        counted as corrupt). Runs on any thread, on several at once (the files are read
        outside the index's lock)."""
        found = [self._read_file(key, size) for key, size in entries]
        out = [data for data, _ in found]
        bad = [entry for entry, data in zip(entries, out) if data is None]
        with self._lock:
            c = self.counters
            c.corrupt += sum(damaged for _, damaged in found)
            c.bytes_read += sum(len(v) for v in out if v is not None)
            if bad:
                self._transaction(lambda: self._after_read(bad, []))
        return out

    def await_entries(self, entries: Sequence[tuple[str, int]], *, seconds: float,
                      poll_seconds: float = WAIT_POLL_SECONDS,
                      stop: Callable[[], bool] = lambda: False) -> list[bytes | None]:
        """The bytes of entries ``(key, size)`` that another fetch (of this process or
        another sharing the folder) is writing in: looked for every ``poll_seconds`` until
        each is ready, for at most ``seconds`` (the read's deadline). None for an entry that
        is not ready by then, that was dropped (its fetch failed, or it was evicted), whose
        holder has died (its reservations are dropped here, its temp files removed) or let
        an earlier wait pass its deadline: the caller fetches those itself. ``stop()`` true
        ends the wait at the next look (the reader closing: Ctrl-C is not held up).

        So processes of one machine sharing the folder fetch a record once between them; a
        fetch never waits on another for longer than its own deadline, a dead process's
        work is taken over at once, and a stopped one's (SIGSTOP, a debugger) holds each
        waiter up once: its holder is then marked stalled, and no one waits for it until it
        fills an entry again.
        """
        out: dict[str, bytes | None] = {}
        waiting = dict(entries)
        holders: dict[str, str] = {}  # key waited for -> its holder
        end = time.monotonic() + seconds
        while waiting and self.aside is None:
            with self._lock:
                try:
                    rows = self._reservations(list(waiting))
                    stalled = self._stalled({h for ready, h in rows.values() if not ready})
                except sqlite3.Error as exc:
                    failed: sqlite3.Error | None = exc
                    rows, stalled = {}, set()
                else:
                    failed = None
            if failed is not None:
                self._step_aside(failed)
                break
            ready = [(key, waiting[key]) for key, (done, _) in rows.items() if done]
            for key, data in zip((k for k, _ in ready), self.read_entries(ready)):
                out[key] = data
                del waiting[key]
            for key in [k for k in waiting if k not in rows]:  # dropped: fetched by the caller
                del waiting[key]
            holders = {key: rows[key][1] for key in waiting}
            dead = {h for h in set(holders.values()) - stalled if not alive(self.path, h)}
            if dead:
                with self._lock:
                    self._transaction(partial(self._drop_holders, sorted(dead)))
            for key in [k for k, h in holders.items() if h in dead or h in stalled]:
                del waiting[key]
            left = end - time.monotonic()
            if not waiting or left <= 0 or stop():
                break
            time.sleep(min(poll_seconds, left))
        if waiting and self.aside is None and not stop():  # the deadline passed
            late = sorted({holders[key] for key in waiting if key in holders})
            with self._lock:
                self._transaction(partial(self._mark_stalled, late))
        return [out.get(key) for key, _ in entries]

    def _stalled(self, holders: set[str]) -> set[str]:
        """Those of ``holders`` that let a wait pass its deadline and filled nothing since."""
        if not holders:
            return set()
        marks = ",".join("?" * len(holders))  # a few holders: one query
        found = self._db().execute(f"SELECT holder FROM stalled WHERE holder IN ({marks})",
                                   sorted(holders))
        return {h for (h,) in found}

    def _mark_stalled(self, holders: list[str]) -> list[str]:
        self._db().executemany("INSERT OR IGNORE INTO stalled VALUES (?)",
                               [(h,) for h in holders])
        return []

    def _reservations(self, keys: Sequence[str]) -> dict[str, tuple[bool, str]]:
        """``key -> (ready, holder)`` of the entries of ``keys`` held or reserved."""
        return {row[0]: (bool(row[1]), str(row[2]))
                for row in self._select("key, ready, holder", keys)}

    def _rows(self, keys: Sequence[str]) -> dict[str, tuple[int, bool]]:
        """``key -> (size, ready)`` of the entries of ``keys`` held or reserved."""
        return {row[0]: (int(row[1]), bool(row[2]))
                for row in self._select("key, size, ready", keys)}

    def _select(self, columns: str, keys: Sequence[str]) -> Iterator[tuple[Any, ...]]:
        """``columns`` of the entries of ``keys``, a bounded number of keys a query."""
        db = self._db()
        for lo in range(0, len(keys), _PARAMS):
            part = list(keys[lo : lo + _PARAMS])
            marks = ",".join("?" * len(part))
            yield from db.execute(f"SELECT {columns} FROM entries WHERE key IN ({marks})", part)

    def _read_file(self, key: str, size: int) -> tuple[bytes | None, bool]:
        """The entry's bytes (None when its file is gone, evicted by another process
        meanwhile, damaged or another entry's), and whether it was damaged."""
        try:
            return self._files.read(key, size)
        except OSError as exc:  # the disk failed under the read: a miss, and no more writes
            self._step_aside(exc)
            return None, False

    def _after_read(self, bad: list[tuple[str, int]], uses: list[tuple[int, str]]) -> list[str]:
        self._delete(bad)
        if uses:
            self._db().executemany("UPDATE entries SET next_use=? WHERE key=?", uses)
        return [k for k, _ in bad]

    # -- writing --------------------------------------------------------------------------

    def reserve(self, entries: Sequence[tuple[str, str, int, int]], *, now: int) -> list[bool]:
        """Decide, in order, which of ``(key, url, size, next_use)`` to keep; True: reserved,
        to be :meth:`fill`-ed (or :meth:`abandon`-ed). False: not kept (later than everything
        held, larger than the cache, already held: then its next use is updated, or the
        cache has stepped aside).

        Entries whose next use is before ``now`` count as used last.
        """
        if self._closed or self.aside is not None:
            return [False] * len(entries)
        try:
            holder = self._holder().token
        except OSError as exc:
            self._step_aside(exc)
            return [False] * len(entries)
        with self._lock:
            result: list[bool] = []
            doomed = self._transaction(lambda: self._admit(entries, now, result, holder))
            if doomed is None:
                return [False] * len(entries)
            c = self.counters
            c.evicted += len(doomed)
            c.admitted += sum(result)
            c.bypassed += len(result) - sum(result)
        return result

    def _admit(self, entries: Sequence[tuple[str, str, int, int]], now: int,
               result: list[bool], holder: str) -> list[str]:
        db = self._db()
        db.execute("UPDATE entries SET next_use=? WHERE next_use<?", (UNKNOWN_USE, now))
        total = db.execute("SELECT value FROM meta WHERE name='total'").fetchone()[0]
        seq = db.execute("SELECT value FROM meta WHERE name='seq'").fetchone()[0]
        doomed: list[str] = []
        pid = os.getpid()  # for whoever reads the index; liveness is the holder's lock
        for key, url, size, use in entries:
            use = UNKNOWN_USE if use < now else min(int(use), UNKNOWN_USE)
            if db.execute("UPDATE entries SET next_use=? WHERE key=?", (use, key)).rowcount:
                result.append(False)
                continue
            need = total + size - self.max_bytes
            victims: list[tuple[str, int]] = []
            if need > 0 and size <= self.max_bytes:
                freed = 0
                for vkey, vsize in db.execute(
                        "SELECT key, size FROM entries WHERE next_use>? "
                        "ORDER BY next_use DESC, seq", (use,)):
                    victims.append((vkey, vsize))
                    freed += vsize
                    if freed >= need:
                        break
                if freed < need:
                    victims = []
            if size > self.max_bytes or (need > 0 and not victims):
                result.append(False)
                continue
            self._delete(victims)
            doomed += [k for k, _ in victims]
            total -= sum(s for _, s in victims)
            seq += 1
            db.execute("INSERT INTO entries (key, url, size, next_use, seq, ready, pid, holder) "
                       "VALUES (?,?,?,?,?,0,?,?)", (key, url, size, use, seq, pid, holder))
            total += size
            result.append(True)
        db.execute("UPDATE meta SET value=? WHERE name='total'", (total,))
        db.execute("UPDATE meta SET value=? WHERE name='seq'", (seq,))
        return doomed

    def fill(self, key: str, data: bytes) -> bool:
        """Write the bytes of reserved entry ``key`` and make it ready; whether it is kept
        (False when it was evicted meanwhile). When the file or the index cannot be written (a
        full disk) the cache steps aside and the reservation is given up: nothing is raised.
        After :meth:`close`, nothing is kept."""
        if self.aside is not None or self._closed:
            self.abandon([key])
            return False
        try:
            holder = self._write(key, data)
        except OSError as exc:
            if not self._closed:
                self._step_aside(exc)
            self.abandon([key])
            return False
        with self._lock:
            kept = [False]

            def body() -> list[str]:
                db = self._db()
                kept[0] = bool(db.execute("UPDATE entries SET ready=1 WHERE key=? AND ready=0",
                                          (key,)).rowcount) or db.execute(
                    "SELECT 1 FROM entries WHERE key=?", (key,)).fetchone() is not None
                if not kept[0]:  # evicted while its bytes were on their way: its file goes
                    return [key]
                db.execute("DELETE FROM stalled WHERE holder=?", (holder,))  # it moves again
                return []

            if self._transaction(body) is None:  # the index failed: the cache stepped aside
                with contextlib.suppress(OSError):
                    self._files.remove(key)
            elif kept[0]:
                self.counters.bytes_written += len(data)
        if not kept[0]:
            self.abandon([key])
        return kept[0]

    def _write(self, key: str, data: bytes) -> str:
        """Write entry ``key``'s file through this process's temp folder; its holder. A temp
        folder swept meanwhile (its lock file was removed by hand, say) is made again once."""
        for attempt in range(2):
            holder = self._holder()
            try:
                self._files.write(key, data, temp=holder.temp)
            except FileNotFoundError:
                if attempt or self._closed:
                    raise
                with self._holder_lock:
                    if self._owner is holder:
                        self._owner = None
                holder.release(remove=True)
                continue
            return holder.token
        raise AssertionError("unreachable")

    def abandon(self, keys: Sequence[str]) -> None:
        """Drop reservations that will not be filled (their fetch failed). Where the index
        cannot be written, they stay until the process ends (then the next opening drops
        them)."""
        if not keys:
            return
        with self._lock:
            def body() -> list[str]:
                db = self._db()
                rows: list[tuple[str, int]] = []
                for key in keys:
                    rows += db.execute("SELECT key, size FROM entries WHERE key=? AND ready=0",
                                       (key,)).fetchall()
                self._delete(rows)
                return []
            self._transaction(body, even_aside=True)

    def put_many(self, items: Sequence[tuple[str, str, bytes, int]], *, now: int = 0) -> int:
        """Reserve and fill ``(key, url, data, next_use)`` items; the number kept."""
        kept = self.reserve([(k, u, len(d), n) for k, u, d, n in items], now=now)
        return sum(self.fill(key, data) for (key, _, data, _), ok in zip(items, kept) if ok)

    # -- the whole folder -----------------------------------------------------------------

    def summary(self, *, objects: int = 20) -> CacheSummary:
        """What the folder holds now (all processes' entries), the largest objects first."""
        with self._lock:
            db = self._db()
            entries, ready_bytes = db.execute(
                "SELECT COUNT(*), COALESCE(SUM(size), 0) FROM entries WHERE ready=1").fetchone()
            reserved = db.execute("SELECT COUNT(*) FROM entries WHERE ready=0").fetchone()[0]
            rows = db.execute(
                "SELECT url, COUNT(*), SUM(size) FROM entries WHERE ready=1 GROUP BY url "
                "ORDER BY SUM(size) DESC LIMIT ?", (objects,)).fetchall()
        return CacheSummary(str(self.path), int(entries), int(ready_bytes), self.max_bytes,
                            int(reserved), [(u, int(n), int(b)) for u, n, b in rows],
                            temp_bytes=temp_bytes(self.path))

    def held(self, objects: Sequence[str]) -> list[tuple[int, int]]:
        """The entries and payload bytes ready under each object key of ``objects`` (what a
        dataset's shards have cached here)."""
        out: list[tuple[int, int]] = []
        with self._lock:
            db = self._db()
            for obj in objects:
                # entry keys are "<obj>-<record>-<offset>": the keys from "<obj>-" up to
                # "<obj>." ('.' follows '-'), a range of the primary key's index
                n, size = db.execute(
                    "SELECT COUNT(*), COALESCE(SUM(size), 0) FROM entries "
                    "WHERE key >= ? AND key < ? AND ready=1", (f"{obj}-", f"{obj}.")).fetchone()
                out.append((int(n), int(size)))
        return out

    def verify(self) -> list[str]:
        """Read every ready entry; remove the damaged ones (and those another entry's file
        took the place of); their keys."""
        with self._lock:
            rows = self._db().execute("SELECT key, size FROM entries WHERE ready=1").fetchall()
        bad = [(k, s) for k, s in rows if self._files.read(k, s)[0] is None]
        with self._lock:
            self._transaction(lambda: self._after_read(bad, []), raising=True)
        return [k for k, _ in bad]

    def clear(self) -> None:
        """Remove every entry (of every process) and its file."""
        with self._lock:
            self._transaction(self._delete_all, raising=True)

    def close(self) -> None:
        """Give up this process's reservations (others need not wait for them), remove its
        lock file and temp folder, close its connection. Idempotent; what it holds can still
        be read after, nothing more is kept."""
        with self._lock:
            self._closed = True
            owner = self._owner
            if owner is not None and self._conn is not None:
                self._transaction(partial(self._drop_holders, [owner.token]))
            if owner is not None:
                with self._holder_lock:
                    self._owner = None
                owner.release(remove=True)
            if self._conn is not None:
                self._conn.close()
            self._conn = self._parents_conn = None

    def __getstate__(self) -> dict[str, object]:
        return {"path": self.path, "max_bytes": self.max_bytes, "trust_folder": self._trusted}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__init__(state["path"], max_bytes=state["max_bytes"],  # type: ignore[misc]
                      trust_folder=state["trust_folder"])

    def __repr__(self) -> str:
        return f"DiskCache({str(self.path)!r}, max_bytes={self.max_bytes})"


def _is_full(exc: BaseException) -> bool:
    """True for a full disk or quota (ENOSPC, EDQUOT; SQLite's SQLITE_FULL)."""
    if isinstance(exc, OSError):
        return exc.errno in _FULL
    if isinstance(exc.__cause__, OSError):  # the index could not be made (see _db)
        return exc.__cause__.errno in _FULL
    return getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL


__all__ = [
    "ENTRY_FORMAT",
    "UNKNOWN_USE",
    "CacheCounters",
    "CacheSummary",
    "DiskCache",
]
