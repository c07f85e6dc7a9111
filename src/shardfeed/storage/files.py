"""Whole-file operations for local paths and fsspec URLs alike.

Local paths (and ``file://`` URLs) use ``os`` directly and never import fsspec. A URL whose
scheme has a registered backend (:mod:`shardfeed.storage.backends`) is read, sized and
checked by it where it says how; anything else of a ``scheme://`` URL goes through fsspec with the storage options of
:mod:`shardfeed.storage.remote` (``set_storage_options``, ``FSSPEC_<PROTOCOL>_<OPTION>``
environment variables, or ``storage_options=`` here); transient failures are retried with
backoff, permanent ones raise :class:`~shardfeed.errors.StorageError` naming the URL.

Each remote operation has one deadline covering all its attempts, as reads of shards do: the
default :class:`~shardfeed.storage.retry.RetryPolicy` (60 s), or the policy of the
:func:`retry_policy` block it runs in (a Dataset reads its manifest and indexes inside one,
with the deadline of its ``source_options``); writes and uploads get one more second a MiB
sent (:data:`~shardfeed.storage.calls.TRANSFER_BYTES_PER_SECOND`). The caller only waits on
the operation, so Ctrl-C ends the wait at once.

Atomicity: :func:`write_bytes_atomic` and :func:`upload_file_atomic` never leave a
half-written file under the final name. Locally they write a temporary name in the same
folder, fsync and ``os.replace``; on object stores one PUT (or one multipart upload, which
becomes visible only when complete) is atomic per object. :func:`rename` is atomic locally,
a copy then delete on object stores.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import glob as _glob
import os
import posixpath
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from typing import Any, BinaryIO, TypeVar

from shardfeed.errors import StorageError
from shardfeed.storage import is_remote
from shardfeed.storage.backends import backend_for
from shardfeed.storage.cache import ByteCache
from shardfeed.storage.calls import (
    in_thread,
    op,
    remote_call,
    remote_filesystem,
    retry_policy,
    scoped,
    start_cat_whole,
    storage_scope,
)
from shardfeed.storage.daemon_threads import DaemonThreads
from shardfeed.storage.inflight import start_fs_call
from shardfeed.storage.process_state import PROCESS
from shardfeed.storage.ranges import DEFAULT_READ_LIMIT_BYTES, read_limit, too_large
from shardfeed.storage.retry import storage_error

T = TypeVar("T")
PathLike = str | os.PathLike[str]
Options = Mapping[str, Any] | None

__all__ = [
    "DEFAULT_READ_LIMIT_BYTES",
    "create_bytes",
    "exists",
    "glob",
    "is_remote",
    "join",
    "listdir",
    "makedirs",
    "object_infos",
    "read_bytes",
    "read_if_exists",
    "remove",
    "remove_tree",
    "rename",
    "retry_policy",
    "size",
    "storage_scope",
    "upload_file_atomic",
    "version_of",
    "versions",
    "write_bytes_atomic",
]


def _operation(text: str, storage_options: Options, name: str) -> Callable[..., Any] | None:
    """The operation ``name`` of the backend that serves ``text`` (None: fsspec does it)."""
    backend = backend_for(text, storage_options)
    return None if backend is None else backend.operation(name)


def _local(url: PathLike) -> str | None:
    """The local path of ``url``, or None if it is a remote URL."""
    text = os.fspath(url)
    if text.startswith("file://"):
        return text[len("file://"):]
    return None if is_remote(text) else text


@contextlib.contextmanager
def _local_errors(path: str, action: str) -> Iterator[None]:
    try:
        yield
    except FileNotFoundError as exc:
        name = exc.filename or path
        raise StorageError(
            f"cannot {action} '{path}': '{name}' does not exist; check the path"
        ) from exc
    except PermissionError as exc:
        raise StorageError(
            f"cannot {action} '{path}': permission denied; check the file's owner and mode"
        ) from exc
    except OSError as exc:
        raise StorageError(f"cannot {action} '{path}': {exc}") from exc


def read_bytes(
    url: PathLike, *, storage_options: Options = None, cache: ByteCache | None = None,
    max_bytes: int = DEFAULT_READ_LIMIT_BYTES,
) -> bytes:
    """The whole content of a file or object; for object stores one GET (no HEAD first).

    With ``cache``, a cached copy is returned if there is one, and what is read is cached
    (if it fits ``cache.max_item_bytes``). An object larger than ``max_bytes`` raises
    StorageError, refused before its body is read where the store says its size (a local
    file, obstore's stores, HTTP and S3 through fsspec), and never held past ``max_bytes``
    on those.
    """
    text = os.fspath(url)
    if cache is not None:
        hit = cache.get(text)
        if hit is not None:
            return hit
    local = _local(text)
    storage_options = scoped(storage_options)
    if local is not None:
        with _local_errors(local, "read"), open(local, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if size > max_bytes:
                raise storage_error(text, too_large(size, max_bytes), action="read")
            data = handle.read()  # (a read(n) would allocate n bytes first)
    else:
        read = _operation(text, storage_options, "read_bytes")
        with read_limit(max_bytes):
            if read is not None:
                data = read(text, storage_options)
            else:
                data = remote_call(text, storage_options, "read", start_cat_whole)
    if len(data) > max_bytes:  # a file that grew, or a backend that does not bound its reads
        raise storage_error(text, too_large(len(data), max_bytes), action="read")
    if cache is not None:
        cache.put(text, data)
    return data


def read_if_exists(
    url: PathLike, *, storage_options: Options = None, cache: ByteCache | None = None,
    max_bytes: int = DEFAULT_READ_LIMIT_BYTES,
) -> bytes | None:
    """:func:`read_bytes`, or None when ``url`` does not exist: one request either way.

    Use it instead of :func:`exists` then :func:`read_bytes` (two or three requests on an
    object store). Other failures (access denied, a server that stays down) still raise.
    """
    try:
        return read_bytes(url, storage_options=storage_options, cache=cache,
                          max_bytes=max_bytes)
    except StorageError as exc:
        if isinstance(exc.__cause__, FileNotFoundError):
            return None
        raise


def fsync_folder(folder: str) -> None:
    """Make a rename or a new file in a local folder durable (fsync of the folder itself)."""
    # Makes the rename itself durable; not every platform lets a folder be opened.
    try:
        fd = os.open(folder or ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _atomic_local(path: str, fill: Callable[[BinaryIO], None], *,
                  exclusive: bool = False) -> None:
    """Write ``path`` whole through a temporary file: renamed over it, or with
    ``exclusive`` linked to it (FileExistsError if the name exists: nothing written over)."""
    folder, name = os.path.split(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, temp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as handle:
            fill(handle)
            handle.flush()
            # mkstemp creates 0600; give the file the mode a plain open() would, so shared
            # datasets stay readable by the other users of the machine.
            os.fchmod(handle.fileno(), 0o666 & ~_umask())
            os.fsync(handle.fileno())
        if exclusive:
            os.link(temp, path)
            os.remove(temp)
        else:
            os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(temp)
        raise
    fsync_folder(folder)


def _umask() -> int:
    # os.umask can only be read by setting it; read it once, so no other thread's file
    # creation can fall inside the moment it is changed.
    with PROCESS.lock:
        if PROCESS.umask is None:
            PROCESS.umask = os.umask(0o022)
            os.umask(PROCESS.umask)
        return PROCESS.umask


def write_bytes_atomic(
    url: PathLike,
    data: bytes | bytearray | memoryview,
    *,
    storage_options: Options = None,
    cache: ByteCache | None = None,
) -> None:
    """Write ``data`` as the whole content of ``url``; readers see the old or the new file,
    never a part. Creates missing parent folders. Drops ``url`` from ``cache``."""
    text = os.fspath(url)
    if cache is not None:
        cache.discard(text)
    local = _local(text)
    if local is not None:
        def fill(handle: BinaryIO) -> None:
            handle.write(data)

        with _local_errors(local, "write"):
            _atomic_local(local, fill)
        return
    payload = bytes(data)
    storage_options = scoped(storage_options)
    write = _operation(text, storage_options, "write")
    if write is not None:
        write(text, payload, storage_options)
        return
    remote_call(text, storage_options, "write", op("pipe_file", payload),
                send_bytes=len(payload))


def create_bytes(url: PathLike, data: bytes | bytearray | memoryview, *,
                 storage_options: Options = None) -> None:
    """Write ``data`` as the whole content of ``url`` only if nothing has that name yet
    (readers see no file or the whole one): :class:`FileExistsError` otherwise, so of two
    writers of one name exactly one succeeds. Local: a complete temporary file linked to the
    name. Object storage: one PUT with ``If-None-Match: *`` (obstore's backends); a backend
    without conditional writes raises StorageError saying so."""
    text = os.fspath(url)
    local = _local(text)
    if local is not None:
        def fill(handle: BinaryIO) -> None:
            handle.write(data)

        try:
            with _local_errors(local, "create"):
                _atomic_local(local, fill, exclusive=True)
        except StorageError as exc:
            if isinstance(exc.__cause__, FileExistsError):
                raise FileExistsError(f"'{local}' exists") from None
            raise
        return
    storage_options = scoped(storage_options)
    write = _operation(text, storage_options, "write")
    if write is None:
        raise StorageError(
            f"cannot create '{text}' only if it is absent: its storage backend (fsspec) has no "
            "conditional write; use obstore's (the default for s3://, gs:// and az://; unset "
            "SHARDFEED_OBSTORE=0)")
    from shardfeed.storage.obstore_ops import WriteConflict

    try:
        write(text, bytes(data), storage_options, mode="create")
    except (WriteConflict, StorageError) as exc:
        cause: BaseException | None = exc
        while cause is not None and not isinstance(cause, WriteConflict):
            cause = cause.__cause__
        if cause is None:
            raise
        raise FileExistsError(f"'{text}' exists (the store refused a write over it)") from None


def upload_file_atomic(
    local_path: PathLike,
    url: PathLike,
    *,
    storage_options: Options = None,
    cache: ByteCache | None = None,
) -> None:
    """Copy the local file ``local_path`` to ``url`` (local or remote), atomically."""
    source = os.fspath(local_path)
    if is_remote(source):
        raise ValueError(
            f"local_path must be a local file, got the URL {source!r}; download it first"
        )
    source = source.removeprefix("file://")
    if not os.path.isfile(source):
        raise StorageError(f"cannot upload '{source}': it is not an existing local file")
    text = os.fspath(url)
    if cache is not None:
        cache.discard(text)
    local = _local(text)
    if local is not None:
        def copy(handle: BinaryIO) -> None:
            with open(source, "rb") as src:
                shutil.copyfileobj(src, handle, length=1024 * 1024)

        with _local_errors(local, "write"):
            _atomic_local(local, copy)
        return
    storage_options = scoped(storage_options)
    upload = _operation(text, storage_options, "upload")
    if upload is not None:
        upload(source, text, storage_options)
        return
    remote_call(text, storage_options, "upload to",
                lambda fs, p: start_fs_call(fs, "put_file", source, p),
                send_bytes=os.path.getsize(source))


def exists(url: PathLike, *, storage_options: Options = None) -> bool:
    """True if a file, object or folder (prefix) exists at ``url``."""
    text = os.fspath(url)
    local = _local(text)
    if local is not None:
        return os.path.exists(local)
    storage_options = scoped(storage_options)
    check_exists = _operation(text, storage_options, "exists")
    if check_exists is not None:
        return bool(check_exists(text, storage_options))

    def check(fs: Any, path: str) -> Future[Any]:
        fs.invalidate_cache(path)
        return start_fs_call(fs, "exists", path)

    return bool(remote_call(text, storage_options, "check", check))


def size(url: PathLike, *, storage_options: Options = None) -> int:
    """Size in bytes of a file or object (one HEAD for object stores)."""
    text = os.fspath(url)
    local = _local(text)
    if local is not None:
        with _local_errors(local, "get the size of"):
            return os.path.getsize(local)
    storage_options = scoped(storage_options)
    get_size = _operation(text, storage_options, "size")
    if get_size is not None:
        return int(get_size(text, storage_options))

    def get(fs: Any, path: str) -> Future[Any]:
        fs.invalidate_cache(path)
        return start_fs_call(fs, "size", path)

    value = remote_call(text, storage_options, "get the size of", get)
    if value is None:
        raise StorageError(f"'{text}' has no size; is it a folder? give one object's URL")
    return int(value)


_IDENTITY_FIELDS = ("ETag", "etag", "generation", "VersionId", "version_id", "md5Hash",
                    "crc32c", "Content-MD5", "Digest")
"""What stores say names an object's content (S3, GCS, Azure, HTTP), as fsspec reports it."""

_MODIFIED_FIELDS = ("LastModified", "Last-Modified", "last_modified", "updated", "mtime",
                    "created")
"""When the object was last written: its version where no field above is given."""


def version_of(info: Mapping[str, Any]) -> str | None:
    """What changes when the object ``info`` describes (an fsspec ``info()`` or listing
    entry) is rewritten: its identity fields (ETag, generation, version id, MD5, CRC32C),
    else its modification time; None when the store gives neither."""
    for fields in (_IDENTITY_FIELDS, _MODIFIED_FIELDS):
        found = []
        for name in fields:
            value = info.get(name)
            if value not in (None, ""):
                text = value.isoformat() if hasattr(value, "isoformat") else str(value)
                found.append(f"{name}={text}")
        if found:
            return ";".join(found)
    return None


def versions(urls: list[str], *, storage_options: Options = None) -> list[str | None]:
    """What the store says changes when each object of ``urls`` is rewritten (see
    :func:`version_of`; None for a local path, or where the store gives nothing). One listing
    a folder (each folder's entries, fresh), one ``info()`` for an object its listing lacks."""
    return [None if info is None else version_of(info)
            for info in object_infos(urls, storage_options=storage_options)]


def object_infos(urls: list[str], *, storage_options: Options = None
                 ) -> list[Mapping[str, Any] | None]:
    """What the store says of each object of ``urls`` (an fsspec listing entry, else its
    ``info()``; None for a local path): one listing a folder (fresh), one ``info()`` for an
    object its listing lacks or names no version of."""
    storage_options = scoped(storage_options)
    found: list[Mapping[str, Any] | None] = [None] * len(urls)
    folders: dict[str, list[int]] = {}
    for k, url in enumerate(urls):
        if _local(url) is None:
            folders.setdefault(url.rstrip("/").rsplit("/", 1)[0], []).append(k)
    asked: list[int] = []  # objects the listing lacks or names no version of
    for folder, ks in folders.items():
        listed = _listed_infos(folder, storage_options)
        for k in ks:
            entry = listed.get(urls[k].rstrip("/").rsplit("/", 1)[-1])
            if entry is not None and version_of(entry) is not None:
                found[k] = entry
            else:
                asked.append(k)
    # one info() each, INFO_IN_FLIGHT at once (a web server without listings: one HEAD a
    # shard), each under the caller's retry policy
    context = contextvars.copy_context()
    answers = [_INFO_THREADS.submit(functools.partial(
        context.copy().run, _info, urls[k], storage_options)) for k in asked]
    for k, answer in zip(asked, answers):
        found[k] = answer.result()
    return found


INFO_IN_FLIGHT = 16
"""``info()`` calls of :func:`object_infos` in flight at once."""

_INFO_THREADS = DaemonThreads("shardfeed-info", limit=INFO_IN_FLIGHT,
                              why="look-ups of objects' sizes and versions in flight")


def _listed_infos(folder: str, storage_options: Options) -> dict[str, Mapping[str, Any]]:
    """Name -> listing entry of the objects in ``folder`` (empty when it cannot be listed)."""
    listed = _operation(folder, storage_options, "infos")
    if listed is not None:
        try:
            entries = listed(folder, storage_options)
        except StorageError:
            return {}
        return {str(e["name"]).rstrip("/").rsplit("/", 1)[-1]: e for e in entries}

    def run(fs: Any, path: str) -> Future[Any]:
        fs.invalidate_cache(path)
        return start_fs_call(fs, "ls", path, detail=True)

    try:
        entries = remote_call(folder, storage_options, "list", run)
    except StorageError:  # e.g. an HTTP server without listings: one info() each
        return {}
    return {str(e.get("name", "")).rstrip("/").rsplit("/", 1)[-1]: e
            for e in entries if isinstance(e, Mapping)}


def _info(url: str, storage_options: Options) -> Mapping[str, Any] | None:
    info = _operation(url, storage_options, "info")
    if info is not None:
        found: Mapping[str, Any] = info(url, storage_options)
        return found
    def run(fs: Any, path: str) -> Future[Any]:
        fs.invalidate_cache(path)
        return start_fs_call(fs, "info", path)

    info = remote_call(url, storage_options, "get the version of", run)
    return info if isinstance(info, Mapping) else None


def glob(pattern: PathLike, *, storage_options: Options = None) -> list[str]:
    """Sorted paths (or URLs, with their scheme) matching ``pattern`` (``*``, ``?``, ``**``)."""
    text = os.fspath(pattern)
    local = _local(text)
    if local is not None:
        found = sorted(_glob.glob(local, recursive=True))
        return [f"file://{p}" for p in found] if text.startswith("file://") else found
    storage_options = scoped(storage_options)
    matching = _operation(text, storage_options, "glob")
    if matching is not None:
        return sorted(matching(text, storage_options))

    def run(fs: Any, path: str) -> Future[Any]:
        fs.invalidate_cache()
        return start_fs_call(fs, "glob", path)

    found = remote_call(text, storage_options, "list", run)
    fs, _ = remote_filesystem(text, storage_options)
    return sorted(str(fs.unstrip_protocol(p)) for p in found)


def listdir(url: PathLike, *, storage_options: Options = None) -> list[str]:
    """Sorted names (not paths) of the entries in a folder or under a prefix."""
    text = os.fspath(url)
    local = _local(text)
    if local is not None:
        with _local_errors(local, "list"):
            return sorted(os.listdir(local))
    storage_options = scoped(storage_options)
    listing = _operation(text, storage_options, "listdir")
    if listing is not None:
        return sorted(listing(text, storage_options))

    def run(fs: Any, path: str) -> Future[Any]:
        fs.invalidate_cache(path)
        return start_fs_call(fs, "ls", path, detail=False)

    entries = remote_call(text, storage_options, "list", run)
    base = remote_filesystem(text, storage_options)[1].rstrip("/")
    names = set()
    for entry in entries:
        full = str(entry).rstrip("/")
        if full != base:  # some filesystems list a file as itself
            names.add(full.rsplit("/", 1)[-1])
    return sorted(names)


def join(base: PathLike, *names: str) -> str:
    """``base`` and ``names`` joined with the separator of its kind (``/`` for URLs)."""
    text = os.fspath(base)
    if "://" in text:
        parts = [n.strip("/") for n in names if n]
        return posixpath.join(text, *parts) if parts else text
    return os.path.join(text, *names)


def remove(
    url: PathLike,
    *,
    missing_ok: bool = False,
    storage_options: Options = None,
    cache: ByteCache | None = None,
) -> None:
    """Delete one file or object. A missing one is an error unless ``missing_ok``."""
    text = os.fspath(url)
    if cache is not None:
        cache.discard(text)
    local = _local(text)
    if local is not None:
        if missing_ok and not os.path.lexists(local):
            return
        with _local_errors(local, "remove"):
            os.remove(local)
        return
    storage_options = scoped(storage_options)
    removal = _operation(text, storage_options, "remove")
    if removal is not None:
        removal(text, storage_options, missing_ok=missing_ok)
        return

    def run(fs: Any, path: str) -> None:
        fs.invalidate_cache(path)
        if not fs.exists(path):
            if missing_ok:
                return
            raise FileNotFoundError(path)
        fs.rm_file(path)

    remote_call(text, storage_options, "remove", in_thread(run))


def remove_tree(url: PathLike, *, storage_options: Options = None) -> None:
    """Delete a folder and everything in it (object stores: every object under the prefix);
    nothing there is not an error."""
    text = os.fspath(url)
    local = _local(text)
    if local is not None:
        if os.path.isdir(local):
            with _local_errors(local, "remove"):
                shutil.rmtree(local)
        return
    storage_options = scoped(storage_options)
    removal = _operation(text, storage_options, "remove_tree")
    if removal is not None:
        removal(text, storage_options)
        return

    def run(fs: Any, path: str) -> None:
        fs.invalidate_cache(path)
        found = fs.find(path)
        if found:
            fs.rm(found)
        fs.invalidate_cache()

    remote_call(text, storage_options, "remove", in_thread(run))


def rename(
    src: PathLike,
    dst: PathLike,
    *,
    storage_options: Options = None,
    cache: ByteCache | None = None,
) -> None:
    """Move ``src`` to ``dst``, replacing ``dst``. Atomic for local files (``os.replace``);
    a copy then delete on object stores (``dst`` appears whole, ``src`` goes after)."""
    source, target = os.fspath(src), os.fspath(dst)
    if cache is not None:
        cache.discard(source)
        cache.discard(target)
    local_src, local_dst = _local(source), _local(target)
    if (local_src is None) != (local_dst is None):
        raise ValueError(
            f"rename needs both paths local or both remote, got {source!r} and {target!r}; "
            "use upload_file_atomic to copy a local file to object storage"
        )
    if local_src is not None and local_dst is not None:
        with _local_errors(local_src, "rename"):
            os.replace(local_src, local_dst)
        return
    storage_options = scoped(storage_options)
    moving = _operation(source, storage_options, "rename")
    if moving is not None:
        moving(source, target, storage_options)
        return
    from shardfeed.storage.options import filesystem

    _, dst_path = filesystem(target, storage_options)

    def run(fs: Any, path: str) -> None:
        fs.mv(path, dst_path)
        fs.invalidate_cache()

    remote_call(source, storage_options, "rename", in_thread(run))


def makedirs(url: PathLike, *, storage_options: Options = None) -> None:
    """Create a folder and its parents if missing (object stores: the bucket if missing)."""
    text = os.fspath(url)
    local = _local(text)
    if local is not None:
        with _local_errors(local, "create the folder"):
            os.makedirs(local, exist_ok=True)
        return
    storage_options = scoped(storage_options)
    if backend_for(text, storage_options) is not None:
        return  # an object store served by a backend: folders are prefixes, made by writes
    remote_call(text, storage_options, "create the folder", op("makedirs", exist_ok=True))
