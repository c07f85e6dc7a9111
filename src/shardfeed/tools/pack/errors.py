"""Failures of pack's output folder, in words: a full disk, a read-only or unwritable folder.

A raw ``OSError`` (or the StorageError of a write) from inside the output folder becomes one
PackError that names the folder (and the file, if it is not the folder itself) and says what
to do; after a full disk, that is to free space and ``--resume``. Errors of input files pass
through unchanged. :class:`UnsafeRowPathError`: a path in packed data that pack does not
read.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator

from shardfeed.errors import PackError, StorageError, UnsafePathError
from shardfeed.format import spec
from shardfeed.tools.pack.ledger import PLAN_NAME


class UnsafeRowPathError(UnsafePathError, PackError):
    """A path in the data being packed that is not read: an image path (a Parquet column, a
    Hugging Face dataset, a row of a generator) when no root was named or the path leads out
    of it, or a data file a Hugging Face folder's ``state.json`` names outside the folder.
    Both a :class:`PackError` and an :class:`UnsafePathError`."""


@contextlib.contextmanager
def output_errors(out: str) -> Iterator[None]:
    """Turn a failure to write into ``out`` (a full disk, a read-only or unwritable folder)
    into one PackError naming the folder and what to do."""
    from shardfeed.format.writer import describe_os_error

    try:
        yield
    except (OSError, StorageError) as exc:
        cause = exc if isinstance(exc, OSError) else exc.__cause__
        if not isinstance(cause, OSError) or cause.errno not in _FOLDER_ERRNOS:
            raise
        where = cause.filename if isinstance(cause.filename, str) else None
        if where is not None and not _inside(where, out):
            raise  # an input file, not the output folder
        again = ""
        if cause.errno in (errno.ENOSPC, errno.EDQUOT) and os.path.exists(
            os.path.join(out, PLAN_NAME)
        ):
            again = (", then run the same command with --resume (resume=True): the complete "
                     "shards written so far are kept")
        if isinstance(exc, StorageError) and again:
            raise PackError(f"{exc}{again}") from exc  # the writer's message names the file
        reason = describe_os_error(cause)
        if where is not None and _same(where, out) and not os.path.isdir(out):
            raise PackError(
                f"cannot create the output folder '{out}': "
                f"{reason.replace('the folder', 'its parent folder')}"
            ) from exc
        at = "" if where is None or _same(where, out) else f" ('{_final_name(where)}')"
        raise PackError(
            f"cannot write into the output folder '{out}'{at}: {reason}{again}"
        ) from exc


_FOLDER_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM})


def _same(a: str, b: str) -> bool:
    return os.path.abspath(a) == os.path.abspath(b)


def _final_name(path: str) -> str:
    """The file a temporary file of pack's naming stands for (``.NAME.XXXX.tmp``,
    ``NAME.tmp``), else ``path``."""
    folder, name = os.path.split(path)
    if not name.endswith(spec.TEMP_SUFFIX):
        return path
    name = name.removesuffix(spec.TEMP_SUFFIX)
    if name.startswith("."):
        name = name[1:].rpartition(".")[0] or name
    return os.path.join(folder, name)


def _inside(path: str, folder: str) -> bool:
    path, folder = os.path.abspath(path), os.path.abspath(folder)
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)
