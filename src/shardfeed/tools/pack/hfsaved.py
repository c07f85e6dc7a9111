"""A Hugging Face dataset folder (``Dataset.save_to_disk``), opened reading only files inside
it.

::

    saved/
      state.json                  {"_data_files": [{"filename": "data-00000-of-00002.arrow"},
      dataset_info.json            ...], ...}; the features (ClassLabel names)
      data-00000-of-00002.arrow   Arrow IPC streams, read memory-mapped
      data-00001-of-00002.arrow

``datasets.load_from_disk`` joins each ``filename`` of ``state.json`` to the folder and reads
it, wherever it leads: a downloaded folder naming ``../secret.arrow``,
``/home/me/other/data-00000-of-00001.arrow`` or holding a link out would have pack read, and
store, records of another dataset. :func:`load_saved` reads the folder itself: each name must
resolve inside the folder, as written and through symbolic links
(:func:`shardfeed.storage.paths.contained`; the two JSON files too), and the file read is the
one checked. ``save_to_disk`` only ever names files in the folder, so there is no opt-in: a
dataset you trust whose files lie elsewhere is loaded by your own code
(``pack(datasets.load_from_disk(folder), ...)``). The saved format (``set_format``) is not
applied: rows are read as Python values, as from every other table, and no data names a
library to import.

Determinism: rows in the order ``state.json`` lists its data files. Memory: the two JSON files
(at most :data:`MAX_JSON_BYTES` each); the Arrow files are memory-mapped.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from typing import Any

from shardfeed.errors import PackError
from shardfeed.storage.paths import contained
from shardfeed.tools.pack.errors import UnsafeRowPathError

STATE_NAME = "state.json"
INFO_NAME = "dataset_info.json"
MAX_JSON_BYTES = 16 << 20
"""Largest ``state.json`` or ``dataset_info.json`` read (one names ~50 bytes a data file)."""

_RESAVE = ("a folder written by save_to_disk names only files inside it, so this one is "
           "damaged or hostile: download it again or save it again with save_to_disk")
_ADVICE = (f"Data never chooses which local file pack reads; {_RESAVE}. For a dataset you "
           "trust whose files lie elsewhere, load it yourself and pass it: "
           "pack(datasets.load_from_disk(folder), ...)")


def load_saved(folder: str) -> Any:
    """The ``datasets.Dataset`` saved in ``folder`` (``state.json`` and ``dataset_info.json``
    in it), reading only files inside ``folder``.

    Raises:
        ImportError: the ``datasets`` library is not installed (the message names the extra).
        UnsafeRowPathError: ``state.json`` names a data file outside the folder (``..``, an
            absolute path elsewhere, a URL, a symbolic link out), or one of the JSON files is
            a link out; the message names the file, the entry and the path.
        PackError: a JSON file or a data file that cannot be read (too large, not JSON, not a
            regular file, not an Arrow stream, features that disagree), naming the file.
    """
    try:
        import datasets
        import pyarrow as pa
        from datasets.table import MemoryMappedTable, concat_tables
    except ImportError:
        raise ImportError(f"'{folder}' is a Hugging Face dataset (save_to_disk); reading "
                          "it needs datasets: pip install 'shardfeed[hf]'") from None

    state_path = _own_file(folder, STATE_NAME)
    info_path = _own_file(folder, INFO_NAME)
    state_bytes, state = _read_json(state_path)
    _, info_doc = _read_json(info_path)
    files = [contained(folder, name, where=f"'{state_path}' (_data_files[{i}])",
                       what="data file", error=UnsafeRowPathError, advice=_ADVICE)
             for i, name in enumerate(_data_names(state, state_path))]
    tables = []
    for path in files:
        _regular(path, f"the data file '{path}' ('{state_path}' names it)")
        try:
            tables.append(MemoryMappedTable.from_file(path))
        except (OSError, ValueError, pa.ArrowException) as exc:
            raise PackError(f"cannot read the data file '{path}' of '{folder}' "
                            f"({type(exc).__name__}: {str(exc)[:200]}); it is not a complete "
                            f"Arrow stream: {_RESAVE}") from None
    try:
        info = datasets.DatasetInfo.from_dict(info_doc)
        table = concat_tables(tables)
        fingerprint = hashlib.sha256(state_bytes).hexdigest()[:16]
        return datasets.Dataset(table, info=info, fingerprint=fingerprint)
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError,
            pa.ArrowException) as exc:
        raise PackError(f"cannot open the Hugging Face dataset '{folder}': its data files and "
                        f"'{info_path}' disagree or are damaged ({type(exc).__name__}: "
                        f"{str(exc)[:200]}); {_RESAVE}") from None


def _own_file(folder: str, name: str) -> str:
    """``folder/name``, refused when it is a symbolic link out of ``folder``."""
    return contained(folder, name, where=f"the Hugging Face dataset '{folder}'",
                     what="file", error=UnsafeRowPathError, advice=_ADVICE)


def _regular(path: str, what: str) -> None:
    """PackError unless ``path`` is a regular file (a FIFO is never waited on, a device never
    mapped)."""
    try:
        info = os.stat(path)
    except OSError as exc:
        raise PackError(f"cannot read {what}: {exc.strerror or exc}; {_RESAVE}") from None
    if not stat.S_ISREG(info.st_mode):
        raise PackError(f"{what} is not a regular file; {_RESAVE}")


def _read_json(path: str) -> tuple[bytes, Any]:
    """The bytes of the JSON file ``path`` and its value, read only when it is a regular file
    of at most :data:`MAX_JSON_BYTES` (opened without blocking: a FIFO is refused, not
    waited on)."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise PackError(f"cannot read '{path}': {exc.strerror or exc}; {_RESAVE}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise PackError(f"'{path}' is not a regular file; {_RESAVE}")
        if info.st_size > MAX_JSON_BYTES:
            raise PackError(f"'{path}' is {info.st_size} bytes, over the "
                            f"{MAX_JSON_BYTES >> 20} MiB a Hugging Face dataset's JSON file "
                            f"may take; {_RESAVE}")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(MAX_JSON_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_JSON_BYTES:
        raise PackError(f"'{path}' grew past {MAX_JSON_BYTES >> 20} MiB while read; {_RESAVE}")
    try:
        return data, json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        raise PackError(f"'{path}' is not JSON ({type(exc).__name__}: {str(exc)[:120]}); "
                        f"{_RESAVE}") from None


def _data_names(state: Any, state_path: str) -> list[str]:
    """The data file names ``state.json`` lists (``_data_files``: ``{"filename": ...}``)."""
    entries = state.get("_data_files") if isinstance(state, dict) else None
    if not isinstance(entries, list) or not entries:
        raise PackError(f"'{state_path}' lists no data files (_data_files); {_RESAVE}")
    names = []
    for i, entry in enumerate(entries):
        name = entry.get("filename") if isinstance(entry, dict) else None
        if not isinstance(name, str):
            raise PackError(f"'{state_path}': _data_files[{i}] is not "
                            f'{{"filename": "<name>"}}; {_RESAVE}')
        names.append(name)
    return names


__all__ = ["INFO_NAME", "MAX_JSON_BYTES", "STATE_NAME", "load_saved"]
