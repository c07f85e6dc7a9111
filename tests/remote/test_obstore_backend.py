"""obstore as the backend of s3:// (``storage.obstore_backend.use_obstore``), against moto on
127.0.0.1 as a user runs it: the same records as local files, the Loader with read-ahead and a
disk cache (no record request in later epochs), a missing object, a stalled server within
the deadline, and a close from another thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("obstore")

from shardfeed import Dataset, Loader, StorageError
from shardfeed.storage import open_source
from shardfeed.storage.backends import backend_for, unregister_backend
from shardfeed.storage.obstore_backend import SCHEMES, ObstoreSource, use_obstore

OPTIONS = {"batch_size": 8, "shuffle": True, "seed": 3, "transform": None, "num_threads": 2}


@pytest.fixture
def obstore_s3(s3_server: Any) -> Iterator[Any]:
    use_obstore()
    try:
        yield s3_server
    finally:
        unregister_backend(SCHEMES)


def data_gets(server: Any) -> int:
    return sum(1 for r in server.requests("GET") if r.path.endswith(".tfrecord"))


def _stream(loader: Loader) -> list[tuple[list[int], list[bytes]]]:
    return [(b["index"].tolist(), list(b["name"])) for b in loader]


def test_records_and_batches_are_those_of_local_files(
    obstore_s3: Any, records_dataset: Callable[[int, int], Path], tmp_path: Path
) -> None:
    folder = records_dataset(240, 4)
    url = obstore_s3.upload_folder(folder)
    assert backend_for(url).name == "obstore"  # type: ignore[union-attr]
    with Dataset(str(folder)) as local, Loader(local, **OPTIONS) as loader:
        want = [_stream(loader) for _ in range(2)]
    with Dataset(url, cache_dir=tmp_path / "cache") as ds, Loader(ds, **OPTIONS) as loader:
        first = _stream(loader)
        assert data_gets(obstore_s3) > 0
        obstore_s3.clear_log()
        second = _stream(loader)
    assert [first, second] == want
    assert data_gets(obstore_s3) == 0  # the later epoch reads the cache


def test_a_missing_object_is_a_storage_error_naming_it(obstore_s3: Any, tmp_path: Path
                                                       ) -> None:
    url = obstore_s3.upload_folder(tmp_path)  # an empty prefix
    source = open_source(f"{url}/nothing.tfrecord")
    assert isinstance(source, ObstoreSource)
    with pytest.raises(StorageError, match="nothing.tfrecord.*does not exist") as info:
        source.size()
    assert isinstance(info.value.__cause__, FileNotFoundError)


def test_a_stalled_server_ends_within_the_deadline_and_close_ends_a_wait_at_once(
    obstore_s3: Any, records_dataset: Callable[[int, int], Path]
) -> None:
    url = obstore_s3.upload_folder(records_dataset(40, 1))
    name = f"{url}/" + next(p.name for p in records_dataset(40, 1).iterdir()
                            if p.name.endswith(".tfrecord"))
    source = open_source(name, deadline_seconds=2)
    with obstore_s3.stall_gets(".tfrecord"):
        began = time.monotonic()
        with pytest.raises(StorageError, match=r"within deadline_seconds=2 "):
            source.read(0, 100)
        assert time.monotonic() - began < 2 + 3
        other = open_source(name, deadline_seconds=60)
        failed: list[BaseException] = []

        def read() -> None:
            try:
                other.read(0, 100)
            except BaseException as exc:  # noqa: BLE001 - what the reader got
                failed.append(exc)

        reader = threading.Thread(target=read)
        reader.start()
        time.sleep(0.3)
        began = time.monotonic()
        other.close()
        reader.join(5)
        assert not reader.is_alive() and time.monotonic() - began < 1.5
        assert failed and "closed" in str(failed[0])


def test_a_server_away_is_retried_counted_and_bounded_by_retries(
    obstore_s3: Any, records_dataset: Callable[[int, int], Path]
) -> None:
    """The server goes away: with the default options the read waits it out and the retries
    show in ``stats()``; with ``retries=0`` the first refusal ends the read, naming it."""
    folder = records_dataset(40, 1)
    url = obstore_s3.upload_folder(folder)
    name = f"{url}/" + next(p.name for p in folder.iterdir() if p.name.endswith(".tfrecord"))
    want = (folder / name.rsplit("/", 1)[1]).read_bytes()[:100]
    patient = open_source(name, backoff_seconds=0.05, max_backoff_seconds=0.2)
    strict = open_source(name, retries=0)
    obstore_s3.stop()
    with pytest.raises(StorageError, match=r"cannot read bytes 0\.\.100 of .*tfrecord"):
        strict.read(0, 100)
    assert strict.stats()["retries"] == 0
    restart = obstore_s3.start_when(lambda: patient.stats()["retries"] > 0)
    assert patient.read(0, 100) == want
    restart.join(timeout=30)
    assert patient.stats()["retries"] > 0


@pytest.mark.parametrize("how", ["AWS_PROFILE", "profile="])
def test_a_named_aws_profile_gives_the_credentials_and_region(
    obstore_s3: Any, records_dataset: Callable[[int, int], Path], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, how: str,
) -> None:
    """A user whose credentials are in ~/.aws (a profile, as SSO and ``aws configure``
    leave them) reads through obstore as through s3fs: obstore does not read those files,
    botocore's chain does."""
    from shardfeed.storage.remote import set_storage_options

    folder = records_dataset(40, 2)
    url = obstore_s3.upload_folder(folder)
    (tmp_path / "credentials").write_text(
        "[reader]\naws_access_key_id = profile-key\naws_secret_access_key = profile-secret\n")
    (tmp_path / "config").write_text("[profile reader]\nregion = us-east-1\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    options: dict[str, Any] = {"client_kwargs": {"endpoint_url": obstore_s3.endpoint_url}}
    if how == "AWS_PROFILE":
        monkeypatch.setenv("AWS_PROFILE", "reader")
    else:
        options["profile"] = "reader"
    set_storage_options("s3://", **options)
    try:
        assert backend_for(url).name == "obstore"  # type: ignore[union-attr]
        with Dataset(str(folder)) as local, Loader(local, **OPTIONS) as loader:
            want = _stream(loader)
        obstore_s3.clear_log()
        with Dataset(url) as ds, Loader(ds, **OPTIONS) as loader:
            assert _stream(loader) == want
        signed = [r.authorization for r in obstore_s3.requests("GET")]
        assert signed and all("Credential=profile-key/" in a for a in signed), signed[:2]
    finally:
        set_storage_options("s3://", **obstore_s3.storage_options())


def test_no_credentials_anywhere_is_said_at_once(
    obstore_s3: Any, records_dataset: Callable[[int, int], Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Not a server's error, not retried until the deadline: the user is told that no
    credentials were found."""
    from shardfeed.storage.remote import set_storage_options

    url = obstore_s3.upload_folder(records_dataset(8, 1))
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    set_storage_options("s3://", client_kwargs={"endpoint_url": obstore_s3.endpoint_url})
    try:
        began = time.monotonic()
        with pytest.raises(StorageError) as info:
            Dataset(url, source_options={"deadline_seconds": 20})
        message = str(info.value)
        assert "no AWS credentials found" in message and "AWS_PROFILE" in message, message
        assert "1 attempt" in message or "attempt" not in message, message  # not retried
        assert time.monotonic() - began < 20
    finally:
        set_storage_options("s3://", **obstore_s3.storage_options())


def _signed_region(request: Any) -> str:
    return request.authorization.split("Credential=", 1)[-1].split("/")[2] \
        if "Credential=" in request.authorization else ""


def test_a_bucket_in_another_region_is_read_there_after_one_question(
    obstore_s3: Any, records_dataset: Callable[[int, int], Path],
) -> None:
    """No region given (or the wrong one): S3 refuses the request and names the bucket's
    region to a HEAD of the bucket; the reads go on there, as s3fs follows S3's redirect."""
    folder = records_dataset(60, 3)
    url = obstore_s3.upload_folder(folder)
    bucket = url.split("/")[2]
    obstore_s3.bucket_regions[bucket] = "eu-west-2"
    try:
        with Dataset(str(folder)) as local, Loader(local, **OPTIONS) as loader:
            want = _stream(loader)
        obstore_s3.clear_log()
        with Dataset(url) as ds, Loader(ds, **OPTIONS) as loader:
            assert _stream(loader) == want
        asked = [r for r in obstore_s3.requests("HEAD") if r.path == f"/{bucket}"]
        assert len(asked) == 1, asked  # one question a bucket, for the process
        regions = [_signed_region(r) for r in obstore_s3.requests("GET")]
        assert regions.count("us-east-1") == 1, regions  # the first request only
        data = [_signed_region(r) for r in obstore_s3.requests("GET")
                if r.path.endswith(".tfrecord")]
        assert data and set(data) == {"eu-west-2"}, data
    finally:
        obstore_s3.bucket_regions.pop(bucket)


def test_a_wrong_region_the_server_does_not_name_is_said_at_once(
    obstore_s3: Any, records_dataset: Callable[[int, int], Path],
) -> None:
    url = obstore_s3.upload_folder(records_dataset(8, 1))
    bucket = url.split("/")[2]
    obstore_s3.bucket_regions[bucket] = "?"
    try:
        began = time.monotonic()
        with pytest.raises(StorageError) as info:
            Dataset(url, source_options={"deadline_seconds": 20})
        message = str(info.value)
        assert bucket in message and "region_name" in message, message
        assert time.monotonic() - began < 10  # not retried until the deadline
    finally:
        obstore_s3.bucket_regions.pop(bucket)


def _read_in_child(ds: Dataset, indices: list[int], out: Any) -> None:
    try:
        out.put([r["name"] for r in ds.read_many(indices)])
    except BaseException as exc:  # noqa: BLE001 - shown by the parent
        out.put(f"{type(exc).__name__}: {exc}")


def test_a_process_forked_after_obstore_ran_reads_the_same_records(
    obstore_s3: Any, records_dataset: Callable[[int, int], Path],
) -> None:
    """A Dataset opened (through obstore) before a fork: a worker forked from it (torch's
    DataLoader and multiprocessing on Linux fork by default) reads the same records,
    through fsspec (obstore's threads do not follow a fork: a call there waited for ever)."""
    pytest.importorskip("s3fs")  # fsspec's road to S3
    import multiprocessing

    url = obstore_s3.upload_folder(records_dataset(40, 2))
    indices = [3, 17, 25, 39]
    with Dataset(url, source_options={"deadline_seconds": 10}) as ds:
        want = [r["name"] for r in ds.read_many(indices)]
        context = multiprocessing.get_context("fork")
        out = context.Queue()
        child = context.Process(target=_read_in_child, args=(ds, indices, out))
        child.start()
        try:
            got = out.get(timeout=60)
        finally:
            child.join(timeout=10)
    assert got == want, got
    assert data_gets(obstore_s3) > 0
