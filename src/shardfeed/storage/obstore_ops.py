"""Every whole-object operation of ``storage.files`` on obstore's stores (s3, gs, az, http):
existence, listing, glob, versions, writes (plain, create-only, if-match), uploads
(multipart where large), rename, removal. With :mod:`~shardfeed.storage.obstore_backend`'s
reads, obstore does all the project asks of those URLs: no second client (s3fs, gcsfs).

Each operation is one call under the current :class:`~shardfeed.storage.retry.RetryPolicy`
(its deadline, longer by a second a MiB sent for writes), in the bucket's region, judged as
every obstore call is (see ``obstore_backend._judged``); a failure is a StorageError naming
the URL (a missing object's raised from a FileNotFoundError).

Object stores have no folders: a "folder" is a prefix that at least one object lies under.
``listdir`` of a prefix with nothing under it raises as a missing file does (an object's own
URL lists as nothing); ``makedirs`` needs nothing.

Determinism: none needed. State: none (the stores are ``obstore_stores``'). Memory: one
listing page at a time while listing; a write's data (uploads stream from the file).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any
from urllib.parse import urlsplit

from shardfeed.errors import StorageError
from shardfeed.storage.backends import Backend
from shardfeed.storage.obstore_backend import ObstoreSource, _read_bytes, _size, store_call
from shardfeed.storage.obstore_stores import _module, serves
from shardfeed.storage.versions import written

Options = Mapping[str, Any] | None

__all__ = ["OBSTORE", "OBSTORE_HTTP", "OPERATIONS", "WriteConflict"]


class WriteConflict(Exception):
    """A conditional write refused: the object exists (create-only) or is another version
    than the one named (if-match). Not retried."""

    advice = ("another writer got there first: read the object again and decide, or write "
              "without the condition")


def _root(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def _prefix(path: str) -> str:
    return path.rstrip("/") + "/" if path.strip("/") else ""


def _pages(store: Any, prefix: str) -> Iterator[dict[str, Any]]:
    for page in _module().list(store, prefix or None, chunk_size=1000):
        yield from page


def exists(url: str, options: Options) -> bool:
    """Whether an object is at ``url``, or any object lies under it (a folder)."""
    def check(store: Any, path: str) -> bool:
        obstore = _module()
        try:
            obstore.head(store, path)
            return True
        except (FileNotFoundError, obstore.exceptions.NotFoundError):
            pass
        listed = obstore.list_with_delimiter(store, _prefix(path) or None)
        return bool(listed["objects"] or listed["common_prefixes"])

    return store_call(url, options, "check", check)


def listdir(url: str, options: Options) -> list[str]:
    """Sorted names of the objects and sub-prefixes directly under ``url``; [] for an
    object's own URL; a prefix with nothing under it raises from FileNotFoundError."""
    def run(store: Any, path: str) -> list[str]:
        obstore = _module()
        prefix = _prefix(path)
        listed = obstore.list_with_delimiter(store, prefix or None)
        names = {p.rstrip("/").rsplit("/", 1)[-1] for p in listed["common_prefixes"]}
        names |= {o["path"].rsplit("/", 1)[-1] for o in listed["objects"]}
        names.discard("")
        if not names:
            obstore.head(store, path)  # an object lists as nothing; else: not found
        return sorted(names)

    return store_call(url, options, "list", run)


def infos(url: str, options: Options) -> list[dict[str, Any]]:
    """The objects directly under the folder ``url``, as listing entries (``name``,
    ``size``, ``ETag``, ``LastModified``: the words ``storage.files.version_of`` reads)."""
    root = _root(url)

    def run(store: Any, path: str) -> list[dict[str, Any]]:
        listed = _module().list_with_delimiter(store, _prefix(path) or None)
        return [{"name": f"{root}/{o['path']}", "size": o["size"], "type": "file",
                 **({"ETag": o["e_tag"]} if o.get("e_tag") else {}),
                 **({"VersionId": o["version"]} if o.get("version") else {}),
                 **({"LastModified": written(o)} if written(o) is not None else {})}
                for o in listed["objects"]]

    return store_call(url, options, "list", run)


def info(url: str, options: Options) -> dict[str, Any]:
    """One object's size and version (a HEAD), in the words of :func:`infos`."""
    def run(store: Any, path: str) -> dict[str, Any]:
        meta = _module().head(store, path)
        return {"name": url, "size": meta["size"], "type": "file",
                **({"ETag": meta["e_tag"]} if meta.get("e_tag") else {}),
                **({"VersionId": meta["version"]} if meta.get("version") else {}),
                **({"LastModified": written(meta)} if written(meta) is not None else {})}

    return store_call(url, options, "get the version of", run)


_MAGIC = re.compile(r"[*?\[]")


def glob(pattern: str, options: Options) -> list[str]:
    """Sorted URLs of the objects matching ``pattern`` (``*`` and ``?`` within a name,
    ``**`` across folders, ``[...]``): one listing from the longest prefix without a
    wildcard."""
    root = _root(pattern)
    path = urlsplit(pattern).path.lstrip("/")
    magic = _MAGIC.search(path)
    fixed = path if magic is None else path[:magic.start()]
    listed_from = fixed.rsplit("/", 1)[0] + "/" if "/" in fixed else ""
    rule = _glob_rule(path)

    def run(store: Any, _path: str) -> list[str]:
        return sorted(f"{root}/{o['path']}" for o in _pages(store, listed_from)
                      if rule.fullmatch(o["path"]))

    return store_call(pattern, options, "list", run)


def _glob_rule(pattern: str) -> re.Pattern[str]:
    """A regular expression of a glob: ``**/`` any folders (none included), ``**`` anything,
    ``*`` / ``?`` / ``[...]`` within one name."""
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        else:
            j = i
            while j < len(pattern) and not pattern.startswith("**", j):
                j += 1
            out.append(_segment(pattern[i:j]))
            i = j
    return re.compile("".join(out))


def _segment(text: str) -> str:
    """``*``, ``?`` and ``[...]`` of a glob without ``**``, none crossing a ``/``."""
    out, i = [], 0
    while i < len(text):
        c = text[i]
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            close = text.find("]", i + 2 if text[i + 1:i + 2] in ("!", "]") else i + 1)
            if close < 0:
                out.append(re.escape(c))
            else:
                body = text[i + 1:close].replace("\\", "\\\\")
                out.append("[" + ("^" + body[1:] if body.startswith("!") else body) + "]")
                i = close
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def write(url: str, data: bytes, options: Options, *, mode: Any = None) -> None:
    """``data`` as the whole object (one PUT: readers see the old or the new one);
    ``mode``: ``"create"`` (only if absent) or ``{"e_tag": ...}`` (only over that version),
    refused with :class:`WriteConflict`."""
    def run(store: Any, path: str) -> None:
        errors = _module().exceptions
        try:
            _module().put(store, path, data, mode=mode)
        except (errors.AlreadyExistsError, errors.PreconditionError) as exc:
            raise WriteConflict(str(exc).split("\n", 1)[0][:300]) from None

    store_call(url, options, "write", run, send_bytes=len(data))


def upload(local_path: str, url: str, options: Options) -> None:
    """The local file as the object (a multipart upload where large: the object appears
    whole, when complete)."""
    size = Path(local_path).stat().st_size
    store_call(url, options, "upload to",
          lambda store, path: _module().put(store, path, Path(local_path)), send_bytes=size)


def rename(src: str, dst: str, options: Options) -> None:
    """Copy then delete (``dst`` appears whole, ``src`` goes after); same bucket only."""
    if _root(src) != _root(dst):
        raise StorageError(f"cannot rename '{src}' to '{dst}': they are in different buckets; "
                           "copy it, then remove the source")
    target = urlsplit(dst).path.lstrip("/")
    store_call(src, options, "rename", lambda store, path: _module().rename(store, path, target))


def remove(url: str, options: Options, *, missing_ok: bool) -> None:
    """Delete one object (a missing one raises from FileNotFoundError unless
    ``missing_ok``)."""
    def run(store: Any, path: str) -> None:
        if not missing_ok:
            _module().head(store, path)
        _module().delete(store, path)

    store_call(url, options, "remove", run)


def remove_tree(url: str, options: Options) -> None:
    """Delete every object under the prefix ``url`` (nothing there: nothing done)."""
    def run(store: Any, path: str) -> None:
        paths = [o["path"] for o in _pages(store, _prefix(path))]
        for start in range(0, len(paths), 1000):
            _module().delete(store, paths[start:start + 1000])

    store_call(url, options, "remove", run)


OPERATIONS: Mapping[str, Callable[..., Any]] = MappingProxyType({
    "exists": exists, "listdir": listdir, "infos": infos, "info": info, "glob": glob,
    "write": write, "upload": upload, "rename": rename, "remove": remove,
    "remove_tree": remove_tree})
"""The operations by the name ``storage.files`` asks for (see ``Backend.operations``)."""

OBSTORE = Backend(
    "obstore", open=ObstoreSource, read_bytes=_read_bytes, size=_size,
    options=("deadline_seconds", "coalesce_gap_bytes", "max_request_bytes", "storage_options",
             "max_concurrency", "retries", "backoff_seconds", "max_backoff_seconds"),
    serves=serves, operations=OPERATIONS)
"""The backend of s3://, gs://, az:// (and http(s):// with ``use_obstore``): every operation
of ``storage.files`` through obstore. Of RemoteSource's options it takes those it honours
(``max_concurrency``: a Dataset's shards read at once); ``cache`` is refused."""

OBSTORE_HTTP = Backend(
    "obstore", open=ObstoreSource, read_bytes=_read_bytes, size=_size, options=OBSTORE.options,
    serves=serves, operations=MappingProxyType({
        k: v for k, v in OPERATIONS.items() if k not in ("listdir", "glob", "infos", "exists")}))
"""The backend of http(s)://: obstore's, but a web server's listings (HTML index pages) are
fsspec's to read; obstore lists by WebDAV only, which few servers answer."""
