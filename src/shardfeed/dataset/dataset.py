"""Dataset: random access to the records of many TFRecord shards.

Opening resolves the source (:mod:`shardfeed.dataset.opening`), then finds, checks or builds
the shard indexes (:mod:`shardfeed.dataset.tables`); reads go through
:mod:`shardfeed.dataset.reading` and :mod:`shardfeed.dataset.open_shards`.

Determinism: ``ds[i]`` is a pure function of the files. State: none (open file handles and
lazily loaded indexes only). Memory: 8 bytes a record of index (memory-mapped ``.idx.npy``
pages, or arrays when an index was built or parsed from text), 16 bytes a shard, and, per
``read_many`` call, the coalesced byte ranges being decoded.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from shardfeed.dataset.cache_setup import cached_in, open_fetcher
from shardfeed.dataset.data_source import Into
from shardfeed.dataset.fetch_ahead import AHEAD_READ, AheadSession
from shardfeed.dataset.fingerprint import files_fingerprint, manifest_fingerprint
from shardfeed.dataset.open_shards import OpenShards, check_source_options
from shardfeed.dataset.opening import (
    Features,
    SourceArg,
    parse_features,
    referenced_root,
    resolve_version,
    version_with,
)
from shardfeed.dataset.reading import GATHER_FROM, ReadOptions, read_gathered, read_payloads
from shardfeed.dataset.shard_versions import ShardVersions
from shardfeed.dataset.shards import MAX_MAPPED_INDEXES
from shardfeed.dataset.tables import PROGRESS_AFTER_BYTES, table_from_files, table_from_manifest
from shardfeed.errors import SchemaError, location
from shardfeed.format import spec as S
from shardfeed.format.columns import decode_columns, decode_record, feature_names
from shardfeed.format.example import Value, decode_example
from shardfeed.format.manifest import Manifest, ShardInfo, load_sidecars
from shardfeed.format.schema import Schema, infer_schema, schema_as_read
from shardfeed.storage.files import retry_policy, storage_scope
from shardfeed.storage.remote import RemoteOptions

if TYPE_CHECKING:
    from typing_extensions import Self

log = logging.getLogger("shardfeed.dataset")

SCHEMA_SAMPLE_RECORDS = 16
"""Records decoded to infer a schema when there is no manifest."""

Record = dict[str, Value]


@dataclass(frozen=True)
class MappedShards:
    """Every local shard of a Dataset mapped, for a compiled reader (see
    :meth:`Dataset.mapped_shards`): the maps and each shard's record offsets, each shard's
    first record id, the feature names (``exact``: the records hold these and no other),
    whether CRCs are checked, ``count_read(bytes)`` to report what was read (the maps'
    pages are dropped as reads add up) and check that the shards are still the files mapped
    (a ShardChangedError where one was replaced since the Dataset opened), and ``is_open()``,
    False once the Dataset is closed (the maps stay readable while a reader holds them: a
    reader asks first, and leaves a closed Dataset's records to the path that says so)."""

    maps: tuple[Any, ...]
    offsets: tuple[np.ndarray, ...]
    starts: np.ndarray
    names: tuple[str, ...]
    exact: bool
    verify: bool
    count_read: Callable[[int], None]
    is_open: Callable[[], bool]


class Dataset:
    """Random access to the records of TFRecord shards; thread-safe.

    The TFRecord implementation of :class:`~shardfeed.dataset.data_source.DataSource`.

    ``source``: a dataset folder (with ``shardfeed.json``), a manifest path, a folder of
    ``.tfrecord`` files, a glob, a TFRecord path, or a list of TFRecord paths/URLs. Bare
    TFRecord files without an index get one built (written beside the file when it is a
    writable local file, else kept in memory) unless ``build_index=False``.

    ``verify_crc``: check each record's data CRC when read (the length CRC is always
    checked). ``features``: decode only these names, or shape/check them with a mapping of
    :class:`FeatureSpec`. ``root``: folder that referenced image paths are relative to
    (default: the manifest's root, else the dataset folder); pass it when the images moved
    away from the dataset. ``read_options``: coalescing. ``cache_dir``: a local folder that
    keeps the records read from object storage for the next epochs and runs, at most
    ``cache_bytes`` (default: the remote shards' size, at most half the disk's free space);
    shared safely by processes, see :mod:`shardfeed.storage.disk_cache`. A ``cache_dir``
    that another user owns or other users can write is refused (a StorageError) unless
    ``trust_cache_dir=True`` (see :mod:`shardfeed.storage.cache_folder`); a record another
    process is fetching into it is awaited for at most ``deadline_seconds``.
    ``source_options``: options for remote shards, passed to ``open_source(url, **options)``
    (``deadline_seconds``, ``max_concurrency``, ``coalesce_gap_bytes``, ``max_request_bytes``,
    ``retries``, ``backoff_seconds``, ``max_backoff_seconds``, ``storage_options``; see
    :class:`~shardfeed.storage.remote.RemoteOptions`); checked here, unused by local files.
    Its deadline and retries also govern reading the manifest and indexes from object
    storage.
    One ``read_many`` reads its remote shards at the same time (up to ``max_concurrency``
    shards, default 16), local shards one after another.

    A folder whose writing did not finish (an interrupted ``pack``: its plan file, a shard's
    ``.tmp``, fewer ``-of-N`` shards than N without a manifest) raises :class:`FormatError`
    saying how to finish it, however its files are named (folder, glob, list);
    ``allow_partial=True`` reads the complete shards that are there instead.

    ``version``: the dataset version to read (each ``pack --append`` adds one and keeps the
    earlier ones readable; default the newest). A Dataset sent to another process reopens
    the version it read.

    ``allow_outside_paths=True`` opts in to a dataset whose manifest or records name files
    outside it; by default such paths raise :class:`~shardfeed.errors.UnsafePathError`
    (see :mod:`shardfeed.storage.paths`). A ``root`` passed here is trusted.

    ``ds[i]`` and ``ds.read_many(indices)`` return ``{feature: value}`` dicts (see
    :func:`shardfeed.format.example.decode_example`). Errors name the shard, the record
    within it and its byte offset.
    """

    def __init__(
        self,
        source: SourceArg,
        /,
        *,
        verify_crc: bool = True,
        features: Features = None,
        root: str | os.PathLike[str] | None = None,
        build_index: bool = True,
        read_options: ReadOptions | None = None,
        source_options: Mapping[str, Any] | None = None,
        allow_partial: bool = False,
        allow_outside_paths: bool = False,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_bytes: int | None = None,
        trust_cache_dir: bool = False,
        version: int | None = None,
    ) -> None:
        _check_flags(verify_crc=verify_crc, build_index=build_index,
                     allow_partial=allow_partial, allow_outside_paths=allow_outside_paths,
                     trust_cache_dir=trust_cache_dir)
        if read_options is not None and not isinstance(read_options, ReadOptions):
            raise TypeError(
                f"read_options must be a ReadOptions, got {type(read_options).__name__}"
            )
        options = check_source_options(source_options, source=source)
        self._args = (source, verify_crc, features, root, build_index, read_options,
                      source_options, allow_partial, allow_outside_paths, cache_dir,
                      cache_bytes, trust_cache_dir, version)
        self._trust_cache_dir = trust_cache_dir
        self._outside = allow_outside_paths
        self.verify_crc = verify_crc
        self.read_options = read_options or ReadOptions()
        self._spec, self._names = parse_features(features)
        self._column_names: list[str] | None = None  # see _feature_names
        self._record_feature_names: list[str] | None = None  # see _record_names
        self._schema: Schema | None = None
        self._read_schema: Schema | None = None  # see schema
        self._fingerprint: str | None = None
        # manifest, indexes and sidecars on object storage: the deadline of source_options
        self._file_policy = RemoteOptions(**{  # (a registered backend's own options aside)
            k: v for k, v in options.items() if k in RemoteOptions.__dataclass_fields__
        }).policy()

        # ... and its storage options: every read of the Dataset's files, not its shards only
        with retry_policy(self._file_policy), storage_scope(options.get("storage_options")):
            resolved = resolve_version(source, version, allow_partial=allow_partial,
                                       allow_outside_paths=allow_outside_paths)
            self._resolved = resolved
            self._manifest = resolved.manifest
            if resolved.manifest is not None:  # another process reopens this version, even
                # after an append made a newer one
                self._args = (*self._args[:-1], resolved.manifest.dataset_version)
            # many shards: read the indexes rather than map them, to bound open descriptors
            mmap = len(resolved.urls) <= MAX_MAPPED_INDEXES
            if resolved.manifest is not None:
                self._table = table_from_manifest(resolved.urls, resolved.manifest,
                                                  build=build_index, mmap=mmap,
                                                  policy=self._file_policy)
            else:
                self._table = table_from_files(resolved.urls, build=build_index, mmap=mmap)
            # with a disk cache the remote shards' versions key it: listed now, once
            self._versions = ShardVersions(self._table.urls, listed=cache_dir is not None)
            self._shards = OpenShards(self._table, source_options=options,
                                      versions=self._versions)
            self._fetcher = open_fetcher(
                self._table, self._read_shards, cache_dir=cache_dir, cache_bytes=cache_bytes,
                trust_cache_dir=trust_cache_dir,
                wait_seconds=self._file_policy.deadline_seconds, **self._shard_identities(),
                versions=None if cache_dir is None else self._versions.cache_versions(
                    self._shard_identities()["checksums"]))
            self._root = referenced_root(resolved, root,
                                         allow_outside_paths=allow_outside_paths)
            self._group_ids, self._order_keys = self._load_sidecars()
        if self._manifest is not None and self._manifest.schema is not None:
            self._schema = self._manifest.schema
            self._check_names_in_schema(self._schema)

    # --- opening -------------------------------------------------------------------------

    def _load_sidecars(self) -> tuple[np.ndarray | None, np.ndarray | None]:
        m, base = self._manifest, self._resolved.base
        if m is None or base is None:
            return None, None
        return load_sidecars(m, base, allow_outside=self._outside)

    def _check_names_in_schema(self, schema: Schema) -> None:
        if not schema.features:
            return
        wanted = list(self._spec) if self._spec is not None else (self._names or [])
        unknown = [n for n in wanted if n not in schema.features and not (
            self._spec is not None and self._spec[n].default is not None)]
        if unknown:
            raise SchemaError(
                f"features {unknown} are not in this dataset; it has "
                f"{sorted(schema.features)}: fix the names passed as features="
            )

    # --- properties ----------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._table)

    @property
    def num_shards(self) -> int:
        return self._table.num_shards

    @property
    def shard_urls(self) -> list[str]:
        """The shard files, in dataset order."""
        return list(self._table.urls)

    @property
    def root(self) -> str | None:
        """The folder referenced image paths are relative to (None if unknown). With
        ``allow_outside_paths`` an :class:`~shardfeed.storage.paths.UnconfinedRoot`
        (the working directory when unknown): transforms bound to it read record
        paths outside it."""
        return self._root

    @property
    def group_ids(self) -> np.ndarray | None:
        """Group id per record (int64) from the manifest's ``groups.npy``, or None."""
        return self._group_ids

    @property
    def order_keys(self) -> np.ndarray | None:
        """Order key per record (float64) from the manifest's ``order.npy``, or None."""
        return self._order_keys

    @property
    def group_key(self) -> str | None:
        """The feature the manifest names as each record's group id, or None."""
        return None if self._manifest is None else self._manifest.group_key

    @property
    def order_key(self) -> str | None:
        """The feature the manifest names as each record's order key, or None."""
        return None if self._manifest is None else self._manifest.order_key

    @property
    def schema(self) -> Schema:
        """The manifest's schema, or one inferred from the first records (read once), as
        this dataset reads the records: a feature that ``features=`` gives a fixed shape
        has that many values in every record (its ``length``)."""
        if self._read_schema is None:
            self._read_schema = schema_as_read(self._stored_schema(), self._spec)
        return self._read_schema

    def _stored_schema(self) -> Schema:
        """The records' schema as stored: the manifest's, or inferred (once)."""
        if self._schema is None:
            n = min(len(self), SCHEMA_SAMPLE_RECORDS)
            payloads = self.read_payloads(range(n))
            sample = [decode_example(p, where=self._where(i)) for i, p in enumerate(payloads)]
            self._schema = infer_schema(sample)
        return self._schema

    @property
    def manifest(self) -> Manifest:
        """The manifest this dataset was opened from, or one describing the files
        (mode ``tfrecord``, schema inferred) that ``Manifest.save`` can write."""
        if self._manifest is not None:
            return self._manifest
        shards = [
            ShardInfo(path=url, records=int(c), bytes=int(self._table.offsets(k)[-1]))
            for k, (url, c) in enumerate(zip(self._table.urls, self._table.counts.tolist()))
        ]
        return Manifest(shards=shards, schema=self._stored_schema(), mode="tfrecord",
                        root=self._root)

    @property
    def version(self) -> int | None:
        """The dataset version read (``version=`` or the newest; each ``pack --append``
        adds one, see :mod:`shardfeed.tools.pack.append`); None without a manifest."""
        return None if self._manifest is None else self._manifest.dataset_version

    def version_with(self, fingerprint: str) -> int | None:
        """The newest version of this dataset whose fingerprint is ``fingerprint`` (a loader
        state's ``source.dataset``), from the manifests it keeps; None if none is."""
        if self._manifest is None or self._resolved.base is None:
            return None
        if fingerprint == self.fingerprint:
            return self._manifest.dataset_version
        return version_with(self._resolved.base, fingerprint)

    @property
    def fingerprint(self) -> str:
        """A short digest that changes when the records do (computed once, on first use).

        From the manifest's shard list (names, record counts, sizes, CRC32Cs) or, for bare
        TFRecord files, their names and record offsets: see
        :mod:`shardfeed.dataset.fingerprint` (the versions of an appended dataset have their
        own; a compacted version has its previous version's). A loader state carries it, so
        ``restore``
        refuses a state saved on another dataset.
        """
        if self._fingerprint is None:
            if self._manifest is not None:
                self._fingerprint = manifest_fingerprint(self._manifest.shards)
            else:  # every index was loaded at opening
                table = self._table
                self._fingerprint = files_fingerprint(
                    table.urls, [table.offsets(k) for k in range(table.num_shards)]
                )
        return self._fingerprint

    def index_bytes(self) -> int:
        """Bytes of index loaded now (offset arrays, mapped or in memory, + shard table)."""
        return self._table.index_bytes()

    # --- locating ------------------------------------------------------------------------

    def _indices(self, indices: Iterable[int] | np.ndarray) -> np.ndarray:
        arr = np.asarray(indices if isinstance(indices, np.ndarray) else list(indices))
        if arr.size == 0:
            return np.zeros(0, dtype=np.int64)
        if arr.dtype.kind not in "iu" or arr.ndim != 1:
            raise TypeError(
                f"indices must be a 1-D sequence of ints, got dtype {arr.dtype} shape "
                f"{arr.shape}"
            )
        n = len(self)
        if arr.size == 1:  # one record (a sample's, an image's): no reductions
            one = int(arr[0])  # a Python int: an unsigned index past 2**63 stays positive
            if not -n <= one < n:
                raise _out_of_range(one, n)
            return np.array([one if one >= 0 else one + n], dtype=np.int64)
        if arr.dtype.kind == "u" and int(arr.max()) >= n:  # before the cast makes it negative
            raise _out_of_range(int(arr[arr >= n][0]), n)
        arr = arr.astype(np.int64, copy=False)
        lowest = int(arr.min())
        if lowest < -n or int(arr.max()) >= n:
            raise _out_of_range(int(arr[(arr < -n) | (arr >= n)][0]), n)
        return arr if lowest >= 0 else np.where(arr < 0, arr + n, arr)

    def locate(self, i: int) -> tuple[str, int, int]:
        """(shard path, record within the shard, byte offset) of record ``i``."""
        idx = self._indices([int(i)])
        shard, local = self._table.shard_of(idx)
        k, r = int(shard[0]), int(local[0])
        return self._table.urls[k], r, int(self._table.offsets(k)[r])

    def _where(self, i: int) -> str:
        path, rec, off = self.locate(i)
        return location(path, rec, off)

    # --- reading -------------------------------------------------------------------------

    def storage_stats(self) -> dict[str, float]:
        """Requests to object storage since opening, summed over the remote shards read so
        far: ``requests`` (GETs of shard bytes), ``bytes_fetched``, ``retries``, ``seconds``
        (the time those reads took, summed over the threads that waited); with remote
        shards, ``staged_hits`` (records read ahead) and with a disk cache its counters
        (``cache_hits``, ``cache_misses``, ``cache_corrupt``, ...)."""
        stats: dict[str, float] = self._shards.stats()
        if self._fetcher is not None:
            stats.update(self._fetcher.stats())
        return stats

    def cached_in(self, cache_dir: str | os.PathLike[str], *,
                  trust_cache_dir: bool | None = None) -> dict[str, Any]:
        """What the disk cache folder ``cache_dir`` holds of this dataset's records (it may be
        another Dataset's ``cache_dir``; this one need not use it): ``records`` and ``bytes``
        cached in all, and per shard ``url``, ``records``, ``cached``, ``bytes``.
        ``trust_cache_dir`` (default: this Dataset's): look in a folder other users can
        write."""
        trusted = self._trust_cache_dir if trust_cache_dir is None else trust_cache_dir
        _check_flags(trust_cache_dir=trusted)
        return cached_in(self._table, cache_dir, trust_cache_dir=trusted,
                         **self._shard_identities())

    def read_payloads(self, indices: Iterable[int] | np.ndarray) -> list[bytes]:
        """The serialized Examples of records ``indices``, in that order (CRC-checked when
        ``verify_crc``). Reads are sorted and coalesced per shard."""
        return self._read(self._indices(indices))

    def read_many(self, indices: Iterable[int] | np.ndarray) -> list[Record]:
        """Decoded records ``indices``, in that order. Reads are sorted and coalesced per
        shard: neighbouring records come from one read (see :class:`ReadOptions`)."""
        idx = self._indices(indices)
        payloads = self._read(idx)
        return [self._decode(p, i) for p, i in zip(payloads, idx.tolist())]

    def read_columns(self, indices: Iterable[int] | np.ndarray, *,
                     into: Into | None = None) -> dict[str, Any] | None:
        """Records ``indices`` as columns, the values :meth:`read_many` gives gathered one a
        feature (see :func:`shardfeed.format.columns.decode_columns`), or None when they are
        not alike or a feature spec applies: :meth:`read_many` then names what differs.

        ``into(names)``, given the features' names, may map some of them to a writable 2-D
        uint8 array of one row a record: where every record holds exactly one value of the
        row's size there (read from mapped local shards), the values are copied straight into
        the rows and the column is a :class:`~shardfeed.format.columns.FilledColumn` of them;
        otherwise the column is the usual list of bytes.
        """
        if self._spec is not None:
            return None
        idx = self._indices(indices)
        shards = self._shards
        if shards.can_gather and len(idx) >= GATHER_FROM:
            names = self._names if self._names is not None else self._feature_names(idx)
            if names is not None:
                columns = read_gathered(self._table, idx, shards.gather_columns,
                                        verify=self.verify_crc, names=names,
                                        exact=self._names is None, into=into)
                if columns is not None:
                    return columns
        return decode_columns(self._read(idx), names=self._names)

    def _feature_names(self, idx: np.ndarray) -> list[str] | None:
        """The features of the first record read as columns (kept: records read as columns
        are expected alike, which the compiled pass checks)."""
        names = self._column_names
        if names is None:
            names = self._column_names = feature_names(self._read(idx[:1])[0])
        return names

    def __getitem__(self, i: int) -> Record:
        if isinstance(i, (bool, np.bool_)) or not isinstance(i, (int, np.integer)):
            raise TypeError(
                f"Dataset indices are ints, got {type(i).__name__}; use read_many(indices) "
                "for many records"
            )
        return self.read_many([int(i)])[0]

    def __iter__(self) -> Iterator[Record]:
        """Every record in order, read a chunk at a time."""
        chunk = 256
        for start in range(0, len(self), chunk):
            yield from self.read_many(range(start, min(start + chunk, len(self))))

    def _decode(self, payload: bytes, i: int) -> Record:
        if self._spec is not None:
            try:
                return decode_example(payload, spec=self._spec)
            except SchemaError:  # decode again, now naming the place (only on this path)
                return decode_example(payload, spec=self._spec, where=self._where(i))
        # the compiled part first: on 2 cores, a record of a 1566² JPEG (945 KB) 71 µs
        # against the parser's 1,013 (whose copies hold the GIL), a 28² PNG's (700 B) 3.7
        # against 7.8; the parser decides what it does not take, and names a fault
        names = self._names if self._names is not None else self._record_names(payload)
        if names is not None:
            fast = decode_record(payload, names, exact=self._names is None)
            if fast is not None:
                return fast
        try:
            record = decode_example(payload)
        except SchemaError:
            raise SchemaError(
                f"{self._where(i)}: payload is not a tf.train.Example; the shard holds other "
                "records, or the record is damaged (run `shardfeed verify`)"
            ) from None
        if self._names is None:
            return record
        missing = [n for n in self._names if n not in record]
        if missing:
            raise SchemaError(
                f"{self._where(i)}: features {missing} are missing (the record has "
                f"{sorted(record)}); to read records without them, give each a default, "
                f"e.g. features={{{missing[0]!r}: FeatureSpec('float', shape=(), "
                "default=0.0)} with its kind and shape, or leave it out of features="
            )
        return {n: record[n] for n in self._names}

    def _record_names(self, payload: bytes) -> list[str] | None:
        """The features of the records decoded one at a time by the compiled part: the first
        one's, kept (a record with others is decoded by the parser)."""
        names = self._record_feature_names
        if names is None:
            names = self._record_feature_names = feature_names(payload)
        return names

    def _shard_identities(self) -> dict[str, list[Any]]:
        """Each shard's size and checksum (the disk cache's keys): the manifest's, else the
        end of its last record and none."""
        table = self._table
        if self._manifest is not None:
            shards = self._manifest.shards
            return {"sizes": [s.bytes for s in shards], "checksums": [s.crc32c for s in shards]}
        return {"sizes": [int(table.offsets_view(k)[-1]) for k in range(table.num_shards)],
                "checksums": [None] * table.num_shards}

    @property
    def remote_record_bytes(self) -> float | None:
        """The mean size of a record in the shards on object storage (what the read-ahead
        sizes its chunks by); None when every shard is local."""
        return None if self._fetcher is None else float(self._fetcher.mean_record_bytes)

    def mapped_shards(self, records: np.ndarray) -> MappedShards | None:
        """What a compiled reader needs to read records straight from this dataset's mapped
        local shards (as :meth:`read_columns` does), with the feature names of ``records``
        (the dataset's ``features=``, else the first record's); None where records are not
        read that way here (a shard on object storage, a feature spec, shards that cannot
        stay mapped)."""
        if not self._shards.can_gather or self._spec is not None or self._fetcher is not None:
            return None
        names = self._names or self._feature_names(np.asarray(records[:1], dtype=np.int64))
        if names is None:
            return None
        table = self._table
        every = self._shards._gather_args(np.arange(table.num_shards, dtype=np.int64),
                                          np.zeros(table.num_shards, dtype=np.int64))
        if every is None:
            return None
        return MappedShards(every[0], every[1], np.ascontiguousarray(table.starts, np.int64),
                            tuple(names), self._names is None, self.verify_crc,
                            self._shards._count_mapped, self._shards.is_open)

    def payload_sizes(self, indices: Iterable[int] | np.ndarray) -> np.ndarray:
        """The stored size in bytes of each record's payload (framing left out), int64,
        from the index alone (nothing is read)."""
        idx = self._indices(indices)
        shard, local = self._table.shard_of(idx)
        sizes = np.empty(len(idx), dtype=np.int64)
        for i, (k, r) in enumerate(zip(shard.tolist(), local.tolist())):
            offsets = self._table.offsets_view(k)
            sizes[i] = int(offsets[r + 1]) - int(offsets[r]) - S.FRAMING_BYTES
        return sizes

    def read_ahead(self) -> AheadSession | None:
        """A session that fetches records before they are read (the Loader's look-ahead;
        see :mod:`shardfeed.dataset.fetch_ahead`), or None when every shard is local.
        With a disk cache, the remote shards' versions are listed again first (one listing
        a folder): a shard rewritten since the Dataset opened raises ShardChangedError
        before a record of its old bytes is served from the cache."""
        if self._fetcher is None:
            return None
        if self._fetcher.cache is not None:
            self._versions.check_listed()
        return self._fetcher.session()

    def _read(self, idx: np.ndarray) -> list[bytes]:
        if self._fetcher is not None:
            return self._fetcher.read(idx)
        return self._read_shards(idx)

    def _read_shards(self, idx: np.ndarray, ahead: bool = False) -> list[bytes]:
        shards = self._shards
        options = AHEAD_READ if ahead else self.read_options
        payloads = read_payloads(self._table, idx, read=shards.read_ranges, options=options,
                                 verify=self.verify_crc,
                                 run_all=shards.run_all if shards.remote else None,
                                 gather=shards.gather if shards.can_gather else None)
        # read, then checked: a local shard replaced before the read raises (its descriptor
        # and map keep the old file); one stat a folder of local shards
        self._versions.check_local(lambda: self._table.shard_of(idx)[0])
        return payloads

    # --- lifetime ------------------------------------------------------------------------

    def close(self) -> None:
        """Close every open shard and stop the reader threads. Idempotent."""
        if self._fetcher is not None:
            self._fetcher.close()
        self._shards.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __reduce__(self) -> tuple[Any, ...]:
        # reopen from the same arguments in another process (indexes are mapped, not copied)
        return (_reopen, self._args)

    def __repr__(self) -> str:
        return f"Dataset({len(self)} records in {self.num_shards} shards)"


def _check_flags(**flags: object) -> None:
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be True or False, got {value!r}")


def _reopen(source: SourceArg, verify_crc: bool, features: Features,
            root: str | os.PathLike[str] | None, build_index: bool,
            read_options: ReadOptions | None,
            source_options: Mapping[str, Any] | None = None,
            allow_partial: bool = False, allow_outside_paths: bool = False,
            cache_dir: str | os.PathLike[str] | None = None,
            cache_bytes: int | None = None, trust_cache_dir: bool = False,
            version: int | None = None) -> Dataset:
    return Dataset(source, verify_crc=verify_crc, features=features, root=root,
                   build_index=build_index, read_options=read_options,
                   source_options=source_options, allow_partial=allow_partial,
                   allow_outside_paths=allow_outside_paths, cache_dir=cache_dir,
                   cache_bytes=cache_bytes, trust_cache_dir=trust_cache_dir, version=version)


__all__ = ["PROGRESS_AFTER_BYTES", "SCHEMA_SAMPLE_RECORDS", "Dataset", "Record"]


def _out_of_range(index: int, records: int) -> IndexError:
    """The error of a record index outside a dataset of ``records`` records."""
    return IndexError(f"record index {index} is out of range for a dataset of {records} records")
