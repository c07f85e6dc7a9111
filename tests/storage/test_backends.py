"""A storage backend is one module and one registration (``storage.backends``): a Dataset,
a Loader and the tools read a dataset through it, every byte, with nothing of fsspec (which
knows no ``mem://``), and the options it takes are checked by name."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shardfeed
from shardfeed import Dataset, Loader, StorageError
from shardfeed.storage import open_source
from shardfeed.storage.backends import (
    Backend,
    backend_for,
    register_backend,
    registered,
    unregister_backend,
)

OBJECTS: dict[str, bytes] = {}
READS: list[tuple[str, str]] = []  # (what, url)


class MemorySource:
    """Ranged reads of an object held in ``OBJECTS``."""

    def __init__(self, url: str, *, latency_seconds: float = 0.0) -> None:
        if url not in OBJECTS:
            raise StorageError(f"cannot open '{url}': no such object") from FileNotFoundError(url)
        self.url = url

    def size(self) -> int:
        return len(OBJECTS[self.url])

    def read(self, offset: int, length: int) -> bytes:
        READS.append(("range", self.url))
        return OBJECTS[self.url][offset : offset + length]

    def read_ranges(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        return [self.read(offset, length) for offset, length in ranges]

    def close(self) -> None:
        pass


def _whole(url: str, options: Mapping[str, Any] | None) -> bytes:
    READS.append(("whole", url))
    if url not in OBJECTS:
        raise StorageError(f"cannot read '{url}': no such object") from FileNotFoundError(url)
    return OBJECTS[url]


MEMORY = Backend("memory", open=MemorySource, read_bytes=_whole,
                 size=lambda url, options: len(_whole(url, options)),
                 exists=lambda url, options: url in OBJECTS or any(
                     k.startswith(url.rstrip("/") + "/") for k in OBJECTS),
                 options=("latency_seconds",))


@pytest.fixture
def memory(tmp_path: Path) -> Iterator[Path]:
    register_backend(["mem"], MEMORY)
    folder = tmp_path / "ds"
    rng = np.random.default_rng(0)
    shardfeed.pack((rng.integers(0, 256, (120, 8, 8, 1), dtype=np.uint8),
                    np.arange(120, dtype=np.int64)), str(folder), records_per_shard=40)
    OBJECTS.clear()
    READS.clear()
    for path in folder.iterdir():
        OBJECTS[f"mem://bucket/ds/{path.name}"] = path.read_bytes()
    yield folder
    unregister_backend(["mem"])
    OBJECTS.clear()


def test_a_dataset_and_a_loader_read_every_byte_through_the_backend(memory: Path) -> None:
    assert registered()["mem"] == "memory" and backend_for("mem://x/y") is MEMORY
    with Dataset("mem://bucket/ds") as remote, Dataset(str(memory)) as local:
        assert len(remote) == len(local) == 120
        assert remote.read_many(list(range(120))) == local.read_many(list(range(120)))
        with Loader(remote, batch_size=16, seed=2) as a, Loader(local, batch_size=16,
                                                                seed=2) as b:
            for x, y in zip(a, b, strict=True):
                assert x.keys() == y.keys()
                for key in x:
                    np.testing.assert_array_equal(np.asarray(x[key]), np.asarray(y[key]))
    kinds = {what for what, _ in READS}
    assert kinds == {"whole", "range"}  # the manifest and indexes whole, records by range
    assert any(url.endswith("shardfeed.json") for what, url in READS if what == "whole")


def test_the_tools_read_through_it_too(memory: Path) -> None:
    from shardfeed.tools.verify import verify

    report = verify("mem://bucket/ds")
    assert report.ok, report
    assert any(what == "range" for what, _ in READS)


def test_options_a_backend_does_not_take_are_refused_by_name(memory: Path) -> None:
    source = open_source("mem://bucket/ds/shardfeed.json", latency_seconds=0.0)
    assert source.size() == len(OBJECTS["mem://bucket/ds/shardfeed.json"])
    with pytest.raises(TypeError, match=r"not taken by the memory backend.*latency_seconds"):
        open_source("mem://bucket/ds/shardfeed.json", deadline_seconds=5)


def test_a_missing_object_is_a_storage_error_naming_it(memory: Path) -> None:
    with pytest.raises(StorageError, match="mem://bucket/nothing"):
        Dataset("mem://bucket/nothing")


def test_registrations_are_checked() -> None:
    with pytest.raises(ValueError, match="local files"):
        register_backend(["file"], MEMORY)
    with pytest.raises(TypeError, match="Backend"):
        register_backend(["x"], object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="names such as"):
        register_backend(["s3/x"], MEMORY)


def test_obstore_reads_object_stores_for_options_it_can_honour(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("obstore")
    monkeypatch.delenv("SHARDFEED_OBSTORE", raising=False)
    urls = ("s3://bucket/ds/part-000.tfrecord", "gs://bucket/x", "az://container/x")
    for url in urls:
        assert backend_for(url).name == "obstore"  # type: ignore[union-attr]
    monkeypatch.setenv("SHARDFEED_OBSTORE", "0")  # turned off: fsspec
    assert [backend_for(url) for url in urls] == [None, None, None]
    monkeypatch.delenv("SHARDFEED_OBSTORE")
    options = {"key": "k", "secret": "s", "client_kwargs": {"endpoint_url": "http://h:1"},
               "config_kwargs": {"read_timeout": 5}}
    assert backend_for("s3://bucket/x", options) is not None
    # an option without an obstore counterpart is never dropped: s3fs reads the URL
    assert backend_for("s3://bucket/x", {**options, "requester_pays": True}) is None
    assert backend_for("s3://bucket/x", {"client_kwargs": {"verify": False}}) is None
    assert backend_for("gs://bucket/x", {"token": "creds.json"}) is None  # gcsfs's word
    assert backend_for("https://host/ds/x").name == "obstore"  # type: ignore[union-attr]
    assert backend_for("https://host/ds/x?v=2") is None  # a query: fsspec keeps it
