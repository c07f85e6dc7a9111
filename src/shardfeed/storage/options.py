"""Storage options for fsspec URLs: a process-wide registry and :func:`filesystem`.

Storage options (endpoint, credentials, anonymous access) reach the filesystem in three ways,
later ones overriding earlier ones:

1. fsspec's own configuration: environment variables ``FSSPEC_<PROTOCOL>_<OPTION>`` read when
   fsspec is first imported, e.g. ``FSSPEC_S3_ENDPOINT_URL=http://127.0.0.1:9000``, or a JSON
   file in ``~/.config/fsspec/``. For S3, botocore also honours ``AWS_ENDPOINT_URL`` (and
   ``AWS_ENDPOINT_URL_S3``), ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE``.
2. :func:`set_storage_options` — a process-wide registry keyed by URL prefix::

       set_storage_options("s3://my-bucket/", endpoint_url="http://minio:9000", anon=False)

3. ``storage_options={...}`` given to :class:`~shardfeed.storage.remote.RemoteSource` or a
   ``storage.files`` function.

On top of these, :func:`filesystem` fits the client's own timeouts and retries inside the
deadline of a call (:func:`client_options`), for every setting the user left unset.

State: the registry, kept by :data:`~shardfeed.storage.process_state.SETTINGS`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shardfeed.errors import StorageError
from shardfeed.storage.failures import redact, redacted_exception
from shardfeed.storage.process_state import SETTINGS


def set_storage_options(prefix: str, /, **options: Any) -> None:
    """Use these fsspec ``options`` for every URL that starts with ``prefix``.

    ``prefix`` is a protocol (``"s3://"``) or a longer URL prefix (``"s3://bucket/"``); when
    several match, longer prefixes override shorter ones option by option. Calling again with
    the same prefix replaces its options; no options removes the entry.
    """
    if not isinstance(prefix, str) or "://" not in prefix:
        raise ValueError(
            f"prefix must be a URL prefix such as 's3://' or 's3://bucket/', got {prefix!r}"
        )
    with SETTINGS.lock:
        if options:
            SETTINGS.storage_options[prefix] = dict(options)
        else:
            SETTINGS.storage_options.pop(prefix, None)


def clear_storage_options() -> None:
    """Forget every option set with :func:`set_storage_options`."""
    with SETTINGS.lock:
        SETTINGS.storage_options.clear()


def storage_options_for(
    url: str, storage_options: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The options for ``url``: registered prefixes (shortest first), then ``storage_options``."""
    merged: dict[str, Any] = {}
    with SETTINGS.lock:
        matches = sorted((p for p in SETTINGS.storage_options if url.startswith(p)), key=len)
        for prefix in matches:
            merged.update(SETTINGS.storage_options[prefix])
    if storage_options:
        merged.update(storage_options)
    return merged


_S3_CONNECT_TIMEOUT_SECONDS = 5.0  # s3fs's own defaults, kept for long deadlines
_S3_READ_TIMEOUT_SECONDS = 15.0


def client_options(url: str, options: Mapping[str, Any], *,
                   deadline_seconds: float) -> dict[str, Any]:
    """``options`` with the client's timeouts and retries fitted to ``deadline_seconds``.

    shardfeed retries transient failures itself within the deadline of each call; a client
    that retries on its own (botocore: up to 5 attempts, each waiting up to its read
    timeout) would spend the whole deadline in one attempt. So for ``s3://`` (s3fs), unless
    ``config_kwargs`` already sets them: ``retries={"total_max_attempts": 1}``, and
    ``connect_timeout`` / ``read_timeout`` of a quarter of the deadline, at most s3fs's
    defaults (5 s / 15 s): a connection that stalls fails in time for a retry. Other
    protocols are left as they are (the deadline still bounds every call).
    """
    merged = dict(options)
    protocol = url.split("://", 1)[0].lower()
    if protocol in ("s3", "s3a"):
        config = dict(merged.get("config_kwargs") or {})
        quarter = deadline_seconds / 4
        config.setdefault("connect_timeout", min(_S3_CONNECT_TIMEOUT_SECONDS, quarter))
        config.setdefault("read_timeout", min(_S3_READ_TIMEOUT_SECONDS, quarter))
        config.setdefault("retries", {"total_max_attempts": 1})
        merged["config_kwargs"] = config
    return merged


def filesystem(url: str, storage_options: Mapping[str, Any] | None = None, *,
               deadline_seconds: float | None = None) -> tuple[Any, str]:
    """``(fsspec filesystem, path within it)`` for ``url``, with the options for that URL.

    With ``deadline_seconds``, the client's own timeouts and retries are fitted inside it
    (see :func:`client_options`). fsspec caches filesystem instances, so calling this per
    file is cheap.
    """
    import fsspec.core

    options = storage_options_for(url, storage_options)
    if deadline_seconds is not None:
        options = client_options(url, options, deadline_seconds=deadline_seconds)
    try:
        fs, path = fsspec.core.url_to_fs(url, **options)
    except ImportError as exc:
        raise StorageError(redact(
            f"cannot open '{url}' through fsspec: its package for this protocol is missing "
            f"({exc}). s3://, gs:// and az:// are read by obstore (pip install "
            "'shardfeed[s3]'); fsspec reads them with SHARDFEED_OBSTORE=0 and in a worker "
            "process forked after obstore ran (its threads do not follow a fork): start such "
            "workers with the 'spawn' or 'forkserver' method, or pip install "
            "'shardfeed[s3fs]'")) from redacted_exception(exc)
    except ValueError as exc:
        raise StorageError(redact(f"cannot open '{url}': {exc}")) from redacted_exception(exc)
    return fs, str(path)


__all__ = [
    "clear_storage_options",
    "client_options",
    "filesystem",
    "set_storage_options",
    "storage_options_for",
]
