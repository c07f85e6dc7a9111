"""Storage backends by URL scheme: how bytes behind one kind of URL are read.

A backend is one module and one registration. It gives ranged reads of an object as a
:class:`~shardfeed.storage.base.ByteSource` (what a Dataset reads its shards with, and every
tool that reads records), and may give whole-object reads, sizes and existence checks (what
a Dataset reads its manifest and indexes with, and ``pack`` checks its outputs with); an
operation it leaves out goes to fsspec::

    from shardfeed.storage.backends import Backend, register_backend

    class MemorySource:                               # a ByteSource
        ...

    register_backend(["mem"], Backend(
        "memory", open=MemorySource, read_bytes=lambda url, options: OBJECTS[url],
        size=lambda url, options: len(OBJECTS[url]),
        exists=lambda url, options: url in OBJECTS,
        options=()))

    shardfeed.Dataset("mem://bucket/ds")              # read through MemorySource

Without a registration, ``s3://``, ``gs://`` and ``az://`` URLs go to
:mod:`~shardfeed.storage.obstore_backend` (where obstore is installed, for the options it
can honour; ``SHARDFEED_OBSTORE=0`` turns it off), other ``scheme://`` URLs (and those) to
:class:`~shardfeed.storage.remote.RemoteSource` (fsspec), and local paths to
:class:`~shardfeed.storage.local.LocalSource`. ``options`` names the
keyword arguments ``open`` takes (a Dataset's ``source_options``): any other is refused with
a TypeError naming the backend, before a request is sent. A backend raises
:class:`~shardfeed.errors.StorageError` naming the URL for a failure of the store (for an
object that does not exist, raised from a ``FileNotFoundError``: an optional file such as a
manifest is then known to be absent), and honours the storage layer's rule of one deadline a
read.

Determinism: the bytes of a URL do not depend on the backend. State: the registry (process
wide, set at import or start-up), kept by
:data:`~shardfeed.storage.process_state.SETTINGS`. Memory: what each backend keeps.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from shardfeed.storage.base import ByteSource
from shardfeed.storage.process_state import SETTINGS

__all__ = ["DEFAULT_OBSTORE_SCHEMES", "Backend", "backend_for", "register_backend", "registered",
           "set_obstore_provider", "unregister_backend"]

Options = Mapping[str, Any] | None


@dataclass(frozen=True)
class Backend:
    """How one kind of URL is read (see the module docstring).

    ``open(url, **options) -> ByteSource``; ``read_bytes(url, storage_options) -> bytes``,
    ``size(url, storage_options) -> int``, ``exists(url, storage_options) -> bool``, each None
    to leave it to fsspec; ``options``: the keyword arguments ``open`` takes; ``serves(url,
    storage_options) -> bool``: False sends the URL to fsspec (options it cannot honour).
    """

    name: str
    open: Callable[..., ByteSource]
    read_bytes: Callable[[str, Options], bytes] | None = None
    size: Callable[[str, Options], int] | None = None
    exists: Callable[[str, Options], bool] | None = None
    options: tuple[str, ...] = field(default=())
    serves: Callable[[str, Options], bool] | None = None
    """Whether it can read ``url`` with these ``storage_options`` (None: always); where
    not, the URL goes to fsspec, as without a registration."""
    operations: Mapping[str, Callable[..., Any]] = field(default_factory=dict)
    """The other operations of ``storage.files`` it does, by name (each left out goes to
    fsspec): ``exists(url, so)``, ``listdir(url, so)``, ``glob(pattern, so)``,
    ``infos(folder, so)`` / ``info(url, so)`` (listing entries: ``name``, ``size``, and
    ``ETag`` / ``LastModified`` where the store names a version), ``write(url, data, so)``,
    ``upload(local_path, url, so)``, ``rename(src, dst, so)``, ``remove(url, so, *,
    missing_ok)``, ``remove_tree(url, so)``; ``so`` is the storage options."""

    def operation(self, name: str) -> Callable[..., Any] | None:
        """The operation ``name`` (``read_bytes``, ``size``, ``exists`` or one of
        ``operations``), or None: fsspec's."""
        found = self.operations.get(name)
        if found is None and name in ("read_bytes", "size", "exists"):
            found = getattr(self, name)
        return found

    def opened(self, url: str, options: Mapping[str, Any]) -> ByteSource:
        """``open(url, **options)`` after checking the options are ones it takes."""
        unknown = sorted(set(options) - set(self.options))
        if unknown:
            takes = ", ".join(self.options) or "none"
            raise TypeError(
                f"options {unknown} are not taken by the {self.name} backend of '{url}' "
                f"(it takes: {takes}); drop them"
            )
        return self.open(url, **options)


def _scheme(url: str | os.PathLike[str]) -> str | None:
    text = os.fspath(url)
    return text.split("://", 1)[0].lower() if "://" in text else None


def register_backend(schemes: Iterable[str], backend: Backend) -> None:
    """Read URLs of ``schemes`` (``"s3"``, ``"mem"``; no ``://``) through ``backend`` from
    now on, in this process (process workers import the module that registers it, or
    register it in their start-up). ``file`` and local paths are always local files."""
    if not isinstance(backend, Backend):
        raise TypeError(f"backend must be a storage.backends.Backend, got {backend!r}")
    names = [str(s).lower().removesuffix("://") for s in schemes]
    if not names or any(not n.isascii() or not n or "/" in n for n in names):
        raise ValueError(f"schemes must be names such as 's3' or 'mem', got {list(schemes)!r}")
    if "file" in names:
        raise ValueError("'file' URLs are local files: they cannot go to another backend")
    with SETTINGS.lock:
        for name in names:
            SETTINGS.backends[name] = backend


def unregister_backend(schemes: Iterable[str]) -> None:
    """Send URLs of ``schemes`` back to the default (fsspec)."""
    with SETTINGS.lock:
        for scheme in schemes:
            SETTINGS.backends.pop(str(scheme).lower().removesuffix("://"), None)


DEFAULT_OBSTORE_SCHEMES = ("s3", "gs", "az", "http", "https")
"""Schemes read through obstore without a registration (unless ``SHARDFEED_OBSTORE=0``)."""


def set_obstore_provider(provider: Callable[[str], Backend | None]) -> None:
    """How the obstore backend of a scheme is found (None: not installed); set once by
    ``shardfeed.storage`` at import, which knows its module (this one does not import it)."""
    with SETTINGS.lock:
        SETTINGS.obstore_provider = provider


def obstore_backend(scheme: str) -> Backend | None:
    """The obstore backend of ``scheme`` (None: obstore is not installed)."""
    provider = SETTINGS.obstore_provider
    found: Backend | None = provider(scheme) if provider is not None else None
    return found


def _default_for(scheme: str) -> Backend | None:
    """obstore for the object stores' schemes where it is installed (unless
    ``SHARDFEED_OBSTORE=0``), else None: fsspec."""
    if scheme not in DEFAULT_OBSTORE_SCHEMES or os.environ.get("SHARDFEED_OBSTORE") == "0":
        return None
    return obstore_backend(scheme)


def backend_for(url: str | os.PathLike[str], storage_options: Options = None
                ) -> Backend | None:
    """The backend that reads ``url``: the one registered for its scheme, else obstore for
    ``s3://``, ``gs://`` and ``az://`` (unless ``SHARDFEED_OBSTORE=0``); None for the default
    (fsspec for ``scheme://`` URLs, the local file system for paths). A backend that cannot
    serve the ``storage_options`` (its ``serves``) gives None too."""
    scheme = _scheme(url)
    if scheme is None:
        return None
    with SETTINGS.lock:
        chosen: Backend | None = SETTINGS.backends.get(scheme)
    backend = chosen or _default_for(scheme)
    if backend is None or backend.serves is None:
        return backend
    return backend if backend.serves(os.fspath(url), storage_options) else None


def registered() -> dict[str, str]:
    """``scheme -> backend name`` of every registration."""
    with SETTINGS.lock:
        return {scheme: backend.name for scheme, backend in SETTINGS.backends.items()}
