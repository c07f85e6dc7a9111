"""DataSource: the protocol every input format implements to feed a Loader.

A *data source* is random access to records: how many there are, the records at some
indices, where a record lives (for error messages), and a fingerprint that changes when the
records do. :class:`~shardfeed.dataset.Dataset` (TFRecord shards) is one implementation; any
object with the members of :class:`DataSource` is another, and gets everything the Loader
does over it: exact shuffle, rank shares, ``Windows``, ``Patches``, threads or processes,
and ``state()`` / ``restore()`` (``docs/extending.md`` has a worked example)::

    class Arrays(shardfeed.DataSourceBase):        # the optional members default to None
        def __init__(self, images, labels, *, version):
            self.images, self.labels, self.version = images, labels, version

        def __len__(self):
            return len(self.images)

        def read_many(self, indices):
            return [{"image": self.images[i], "label": self.labels[i]} for i in indices]

        @property
        def fingerprint(self):                      # a new version when the data changes
            return f"arrays:{self.version}:{len(self.images)}"

    loader = shardfeed.Loader(Arrays(images, labels, version=1), batch_size=32, seed=0)

Members (all declared; :func:`check_data_source` raises TypeError naming a missing one):

==============  ==========================================================================
``__len__``     the number of records
``read_many``   ``indices -> [record dict]`` in the asked order; called from many threads
``locate``      ``index -> (path, record within it, byte offset)``, named in errors
``fingerprint`` a ``str`` that changes when the records do; a saved state is checked
                against it, so a restore on other data is refused
``schema``      a :class:`~shardfeed.format.schema.Schema` (where the image is, its
                encoding, the label key) or None: decode transforms bind to it
``root``        the folder referenced image paths are relative to, or None
``group_ids``   per-record group ids (int64, one per record) for ``Windows``, or None
``order_keys``  per-record order keys (float64 times) for ``Windows``, or None
``group_key``   the feature holding the group id in each record, or None
``order_key``   the feature holding the order key in each record, or None
==============  ==========================================================================

Determinism: ``read_many`` must return the same records for the same indices every time
(the Loader's output is a function of them and of ``(seed, epoch, position)``). State: the
fingerprint only. Memory: whatever the source keeps; the Loader adds its epoch order (4 bytes
a record) and nothing per record.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, cast, runtime_checkable

import numpy as np

from shardfeed.format.schema import Schema

__all__ = ["DATA_SOURCE_MEMBERS", "DataSource", "DataSourceBase", "ReadsAhead", "ReadsColumns",
           "check_data_source"]


class DataSource(Protocol):
    """Random access to records: what a Loader, ``Windows`` and ``Patches`` read through.

    See the module docstring for each member and a worked example.
    """

    def __len__(self) -> int:
        """The number of records."""
        ...

    def read_many(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        """The records at ``indices`` (ints in ``[0, len)``), one dict each, in that order."""
        ...

    def locate(self, index: int) -> tuple[str, int, int]:
        """``(path, record within it, byte offset)`` of record ``index``, for error messages."""
        ...

    @property
    def fingerprint(self) -> str:
        """A short text that changes when the records do (a loader state is checked on it)."""
        ...

    @property
    def schema(self) -> Schema | None:
        """Where the image is and how it is encoded, the label key; None if not described."""
        ...

    @property
    def root(self) -> str | None:
        """The folder referenced image paths are relative to; None if records hold none."""
        ...

    @property
    def group_ids(self) -> np.ndarray | None:
        """One group id a record (a day of a time-lapse), for ``Windows``; or None."""
        ...

    @property
    def order_keys(self) -> np.ndarray | None:
        """One order key a record (a time in seconds), for ``Windows``; or None."""
        ...

    @property
    def group_key(self) -> str | None:
        """The feature that holds a record's group id (never a window's label), or None."""
        ...

    @property
    def order_key(self) -> str | None:
        """The feature that holds a record's order key (never a window's label), or None."""
        ...


Into = Callable[[Sequence[str]], Mapping[str, np.ndarray]]
"""``into(names)``: the features among ``names`` to copy straight into the caller's rows, each
mapped to a writable 2-D uint8 array of one row a record (see :class:`ReadsColumns`)."""


@runtime_checkable
class ReadsColumns(Protocol):
    """A data source that reads many records as columns: the Loader's batch path (a slice's
    records read at once, the transform's batch form writing the rows) instead of a dict a
    record. Declared by having the method; checked with ``isinstance``.

    ``read_columns(indices)`` gives ``{feature: column}`` for the records at ``indices``:
    numeric features as one array of ``(records, *shape)`` (what ``read_many`` gives a record,
    stacked), bytes features as a list of ``bytes``; or None when the records are not alike
    (the Loader then reads them with ``read_many``, which names what differs). It must give
    the values ``read_many`` gives. ``into``, where passed, may be ignored (a source that
    reads bytes features straight into the rows honours it: :class:`~shardfeed.Dataset`).
    """

    def read_columns(self, indices: Sequence[int] | np.ndarray, *,
                     into: Into | None = None) -> dict[str, Any] | None:
        """The records at ``indices`` as columns, or None (see the class docstring)."""
        ...


@runtime_checkable
class ReadsAhead(Protocol):
    """A data source whose records can be fetched before they are read (shards on object
    storage): the Loader opens a session and tells it the records of the batches to come.
    ``read_ahead()`` gives that session
    (:class:`~shardfeed.pipeline.read_ahead.Session`), or None when there is nothing to
    fetch (every shard local)."""

    def read_ahead(self) -> Any:
        """A fetch-ahead session, or None."""
        ...


DATA_SOURCE_MEMBERS = (
    "__len__", "read_many", "locate", "fingerprint", "schema", "root", "group_ids",
    "order_keys", "group_key", "order_key",
)
"""Every member of :class:`DataSource`, in the order they are checked."""


class DataSourceBase(ABC):
    """A :class:`DataSource` with the optional members supplied: subclass it and write
    ``__len__``, ``read_many`` and ``fingerprint`` (a property or a plain attribute).

    Defaults: no schema, root, groups or order keys (set them as attributes or override
    them as properties), and ``locate(i)`` naming the class and the record:
    ``("<Arrays>", i, 0)``. Forgetting one of the three required members raises TypeError
    when the class is instantiated, naming it.
    """

    schema: Schema | None = None
    root: str | None = None
    group_ids: np.ndarray | None = None
    order_keys: np.ndarray | None = None
    group_key: str | None = None
    order_key: str | None = None

    @abstractmethod
    def __len__(self) -> int:
        """The number of records."""

    @abstractmethod
    def read_many(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        """The records at ``indices``, one dict each, in that order."""

    @property
    @abstractmethod
    def fingerprint(self) -> str:
        """A short text that changes when the records do."""

    def locate(self, index: int) -> tuple[str, int, int]:
        """``("<ClassName>", index, 0)``: override it to name a file and offset."""
        return (f"<{type(self).__name__}>", int(index), 0)


_MISSING = object()


def check_data_source(data: object, *, needs: str) -> DataSource:
    """``data`` as a :class:`DataSource`, after checking it declares every member.

    ``needs`` starts the TypeError (``"Windows needs a shardfeed.Dataset or DataSource"``);
    the error names the first missing member, and the fingerprint when it is not a ``str``.
    Members are looked up without running them (a property is not computed here), except
    the fingerprint, which a loader state needs at once.
    """
    for name in DATA_SOURCE_MEMBERS:
        if inspect.getattr_static(data, name, _MISSING) is _MISSING:
            call = "()" if name in ("__len__", "read_many", "locate") else ""
            raise TypeError(
                f"{needs}; {type(data).__name__} has no {name}{call}: a DataSource declares "
                f"{', '.join(DATA_SOURCE_MEMBERS)} (subclass shardfeed.DataSourceBase for "
                "defaults of all but __len__, read_many and fingerprint; see docs/extending.md)"
            )
    fingerprint = getattr(data, "fingerprint", None)
    if not isinstance(fingerprint, str):
        raise TypeError(
            f"{needs}; {type(data).__name__} has no fingerprint (a str that changes when its "
            f"records do, which a loader state is checked against), got {fingerprint!r}"
        )
    return cast(DataSource, data)
