"""obstore (Rust ``object_store``) as the backend of s3://, gs://, az:// and http(s):// URLs.

The reader of ``s3://``, ``gs://`` and ``az://`` URLs where obstore is installed (``pip
install 'shardfeed[s3]'`` or ``[obstore]``), unless ``SHARDFEED_OBSTORE=0`` (in every
process, workers included: fsspec reads them then); :func:`use_obstore` registers it for the
process, ``http(s)://`` included. It reads the URLs whose options it has a counterpart of
(:func:`serves`; others, e.g. ``requester_pays``, go to fsspec). Credentials come from the
options, from the environment as obstore reads it, and otherwise from botocore's chain as
s3fs reads it (``AWS_PROFILE`` or ``profile=``, ``~/.aws``, SSO), with that profile's
region. A bucket in another region than the one given (or us-east-1) is refused by S3; its
region is then asked of the server, once a bucket, and the reads go there::

    from shardfeed.storage.obstore_backend import use_obstore

    use_obstore()                      # s3://, gs://, az://, http(s):// through obstore
    ds = shardfeed.Dataset("s3://bucket/dataset")

Ranged reads of an object are one ``get_ranges`` call (the ranges merged where their holes
are small, as :mod:`~shardfeed.storage.ranges` merges them, then fetched concurrently by
obstore's runtime, outside the GIL; ``coalesce_gap_bytes=-1`` keeps touching ranges apart,
one request each); sizes are one HEAD, remembered; whole objects one GET.
Credentials and the endpoint come from the environment as obstore reads them
(``AWS_ACCESS_KEY_ID``, ``AWS_ENDPOINT_URL``, ...), and from ``storage_options`` (given, or
registered with ``set_storage_options`` and the ``FSSPEC_*`` variables as for fsspec) in
s3fs's words (``key``, ``secret``, ``token``, ``anon``, ``endpoint_url``,
``client_kwargs={"endpoint_url": ..., "region_name": ...}``, ``config_kwargs``' timeouts)
or obstore's (``obstore_config={...}``).

Deadlines, retries and Ctrl-C, as everywhere in the storage layer: obstore makes one attempt
a call (connect and idle-read timeouts of a quarter of the deadline, at most 5 s / 15 s, so
that a stalled attempt fails in time for a retry; the whole request is bounded by the
deadline only). The storage layer's :class:`~shardfeed.storage.retry.Retrier` runs it on a
daemon thread and retries transient failures (no answer, HTTP 5xx and 429) under the
source's ``retries``, backoff and one ``deadline_seconds`` a call, counting them in
``stats()``; a wrong configuration or region, a refused credentials request and a whole
object answered for a range are not retried. Ctrl-C and ``close()`` end the wait at once; a
failure is a :class:`~shardfeed.errors.StorageError` naming the URL (a missing object's
raised from a ``FileNotFoundError``).

Determinism: the bytes of a range do not depend on merging or concurrency. State: the
remembered size; one store a bucket and options, kept for the process. Memory: the ranges in
flight.
"""

from __future__ import annotations

import math
import os
import re
import threading
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

from shardfeed.errors import StorageError
from shardfeed.storage.backends import Backend, register_backend
from shardfeed.storage.calls import current_policy
from shardfeed.storage.inflight import CallGroup
from shardfeed.storage.options import storage_options_for
from shardfeed.storage.ranges import (
    DEFAULT_COALESCE_GAP_BYTES,
    DEFAULT_MAX_REQUEST_BYTES,
    check_range,
    coalesce_ranges,
    split_answers,
)
from shardfeed.storage.retry import DEFAULT_DEADLINE_SECONDS, Retrier, RetryPolicy

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["OBSTORE", "SCHEMES", "ObstoreSource", "installed", "serves", "use_obstore"]

T = TypeVar("T")
SCHEMES = ("s3", "gs", "az", "http", "https")
_STORES: dict[tuple[str, str, str, str], Any] = {}
_STORES_LOCK = threading.Lock()
_USED = False
"""A store was made in this process (obstore's runtime may run)."""
_FORKED_AFTER_USE = False
"""This process was forked from one that had used obstore: obstore's runtime threads did not
follow the fork, and a call here would wait for them for ever. fsspec reads instead."""


def _forked() -> None:
    global _FORKED_AFTER_USE, _STORES_LOCK, _REGIONS_LOCK
    _FORKED_AFTER_USE = _FORKED_AFTER_USE or _USED
    _STORES.clear()
    _PROBES.clear()
    _STORES_LOCK, _REGIONS_LOCK = threading.Lock(), threading.Lock()  # none held in the child


os.register_at_fork(after_in_child=_forked)
_REGIONS: dict[tuple[str, str], str] = {}
"""``(endpoint, bucket) -> region``: buckets found in another region than the one asked."""
_REGIONS_LOCK = threading.Lock()
_PROBES: dict[tuple[str, str], threading.Lock] = {}
_REGION_WORDS = frozenset({"region", "aws_region", "aws_default_region", "default_region"})
_ENDPOINT_WORDS = frozenset({"endpoint", "endpoint_url", "aws_endpoint", "aws_endpoint_url"})
_CA_VARIABLES = ("AWS_CA_BUNDLE", "SSL_CERT_FILE")
"""Files of certificate authorities to trust (botocore reads the first, Python's ssl the
second; obstore neither): given to obstore as more roots."""


def _certificates(paths: Sequence[str]) -> bytes:
    """The PEM certificates of the files ``paths`` (named by :data:`_CA_VARIABLES`)."""
    out = []
    for path in dict.fromkeys(paths):
        try:
            with open(path, "rb") as file:
                out.append(file.read())
        except OSError as exc:
            names = " or ".join(_CA_VARIABLES)
            raise StorageError(f"cannot read the certificate authorities of '{path}' ({names}): "
                               f"{exc}; point it at a PEM file, or unset it") from exc
    return b"\n".join(out)


def _endpoint(config: Mapping[str, Any]) -> str:
    """The endpoint a store of ``config`` (see :func:`_config`) sends requests to; "" for
    the cloud's own."""
    return str(config.get("endpoint") or os.environ.get("AWS_ENDPOINT_URL", ""))


def _module() -> Any:
    try:
        import obstore
    except ImportError as exc:
        raise StorageError(
            "the obstore backend needs obstore: pip install 'shardfeed[obstore]'"
        ) from exc
    return obstore


_INSTALLED: bool | None = None


def installed() -> bool:
    """Whether obstore can be imported (looked up once)."""
    global _INSTALLED
    if _INSTALLED is None:
        try:
            _module()
            _INSTALLED = True
        except StorageError:
            _INSTALLED = False
    return _INSTALLED


# s3fs's words obstore is given (see _config); config_kwargs' botocore timeouts bound the
# attempt's, its retries are the storage layer's anyway, and its connection pool's size has
# no counterpart to set (obstore keeps the connections it opens, as many as in flight)
_WORDS = frozenset({"key", "secret", "token", "anon", "profile", "endpoint_url",
                    "client_kwargs", "config_kwargs", "obstore_config"})
_CLIENT_WORDS = frozenset({"endpoint_url", "region_name"})
_CONFIG_WORDS = frozenset({"retries", "connect_timeout", "read_timeout",
                           "max_pool_connections"})


def _options(url: str, storage_options: Mapping[str, Any] | None) -> dict[str, Any]:
    """fsspec's configuration for the protocol (``FSSPEC_S3_*`` variables), the registered
    options, then ``storage_options``: what s3fs would be given."""
    merged: dict[str, Any] = {}
    try:
        from fsspec.config import conf

        merged.update(conf.get(urlsplit(url).scheme, {}))
    except ImportError:
        pass
    merged.update(storage_options_for(url, storage_options))
    return merged


def serves(url: str, storage_options: Mapping[str, Any] | None) -> bool:
    """Whether every option for ``url`` has an obstore counterpart (else fsspec reads it, so
    that no option is dropped: ``requester_pays``, ``s3_additional_kwargs``, ...), and
    obstore can run in this process (see :func:`_forked`)."""
    if _FORKED_AFTER_USE:
        return False
    options = {k: v for k, v in _options(url, storage_options).items() if v is not None}
    if urlsplit(url).scheme != "s3":  # s3fs's words only map to S3: others in obstore's own
        return set(options) <= {"obstore_config"}
    return (set(options) <= _WORDS
            and set(options.get("client_kwargs") or {}) <= _CLIENT_WORDS
            and set(options.get("config_kwargs") or {}) <= _CONFIG_WORDS)


def _botocore_chain(profile: str | None) -> tuple[Callable[[], dict[str, Any]] | None,
                                                 str | None]:
    """A credential provider for obstore from botocore's chain, and the region its
    configuration names: what s3fs reads (``AWS_PROFILE`` or ``profile``, ``~/.aws``
    files, SSO, credential processes, roles); ``(None, None)`` without botocore, and no
    provider where the chain finds no credentials (obstore's own chain is left to try)."""
    try:
        import botocore.credentials
        import botocore.exceptions
        import botocore.session
    except ImportError:
        return None, None
    try:
        session = botocore.session.Session(profile=profile)
        credentials = session.get_credentials()
        region = session.get_config_variable("region")
    except botocore.exceptions.BotoCoreError as exc:
        raise StorageError(f"cannot read the AWS credentials for obstore: {exc}; check "
                           "AWS_PROFILE and ~/.aws, or give key and secret") from exc
    if credentials is None:
        return None, region
    # refreshed by botocore when due; obstore asks again before the expiry said
    expires = isinstance(credentials, botocore.credentials.RefreshableCredentials)

    def provide() -> dict[str, Any]:
        frozen = credentials.get_frozen_credentials()
        return {"access_key_id": frozen.access_key, "secret_access_key": frozen.secret_key,
                "token": frozen.token,
                "expires_at": datetime.now(timezone.utc) + _REASK if expires else None}

    return provide, region


_REASK = timedelta(minutes=5)
"""How long obstore keeps refreshable credentials before asking botocore again."""
_ENV_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_WEB_IDENTITY_TOKEN_FILE",
             "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI")
"""Credential sources obstore reads itself."""


def _config(options: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, float]]:
    """obstore's configuration from s3fs-style options (and ``obstore_config``), and the
    attempt timeouts they ask for (``connect_timeout``, ``read_timeout``)."""
    options = dict(options)
    config: dict[str, Any] = dict(options.pop("obstore_config", {}) or {})
    words = {"key": "access_key_id", "secret": "secret_access_key", "token": "session_token"}
    for theirs, ours in words.items():
        if options.get(theirs) is not None:
            config.setdefault(ours, options[theirs])
    if options.get("anon"):
        config.setdefault("skip_signature", True)
    for word in [w for w in config if w.lower() in _ENDPOINT_WORDS and w != "endpoint"]:
        config.setdefault("endpoint", config.pop(word))  # one name for it (see _endpoint)
    client = dict(options.get("client_kwargs") or {})
    endpoint = client.get("endpoint_url") or options.get("endpoint_url")
    if endpoint:
        config.setdefault("endpoint", endpoint)
    if client.get("region_name"):
        config.setdefault("region", client["region_name"])
    asked = options.get("config_kwargs") or {}
    timeouts = {name: float(asked[name]) for name in ("connect_timeout", "read_timeout")
                if isinstance(asked.get(name), (int, float))}
    return config, timeouts


def _attempt_seconds(deadline_seconds: float, asked: Mapping[str, float]
                     ) -> tuple[float, float]:
    """(connect, idle read) timeouts of one attempt: a quarter of the deadline, at most
    5 s / 15 s (or the ``connect_timeout`` / ``read_timeout`` asked, if shorter), so that a
    stalled attempt fails in time for a retry (as s3fs's are set). The whole request is
    bounded by the deadline only: a large range on a slow link is not cut short."""
    quarter = deadline_seconds / 4
    return (min(5.0, quarter, asked.get("connect_timeout", math.inf)),
            min(15.0, quarter, asked.get("read_timeout", math.inf)))


def _store(url: str, storage_options: Mapping[str, Any] | None,
           deadline_seconds: float) -> tuple[Any, str]:
    """The store of ``url``'s bucket (made once a bucket, configuration and timeouts) and
    the object path."""
    global _USED
    parts = urlsplit(url)
    options = _options(url, storage_options)
    config, asked = _config(options)
    endpoint = _endpoint(config)
    if parts.scheme == "s3" and endpoint and "endpoint" not in config:
        config["endpoint"] = endpoint
    signed = {"access_key_id", "skip_signature", "credential_provider"} & set(config)
    # AWS_PROFILE, ~/.aws, SSO: obstore does not read them; botocore's chain does
    chain = (parts.scheme == "s3" and not signed
             and not any(os.environ.get(k) for k in _ENV_KEYS))
    profile = options.get("profile") or None
    learnt = _REGIONS.get((endpoint, parts.netloc)) if parts.scheme == "s3" else None
    if learnt is not None:  # the bucket's own region, as S3 named it (see _learn_region)
        for word in [w for w in config if w.lower() in _REGION_WORDS]:
            del config[word]
        config["region"] = learnt
    connect, idle = _attempt_seconds(deadline_seconds, asked)
    # one attempt a call: the storage layer retries transient failures itself, under the
    # one deadline of each call (and counts them)
    # (the whole request's limit a second past the deadline: the deadline decides, and names
    # itself, and an abandoned attempt ends soon after)
    client: dict[str, Any] = {"timeout": timedelta(seconds=deadline_seconds + 1),
                              "connect_timeout": timedelta(seconds=connect),
                              "read_timeout": timedelta(seconds=idle)}
    if endpoint.startswith("http://") or parts.scheme == "http":
        client["allow_http"] = True
    authorities = [os.environ[n] for n in _CA_VARIABLES if os.environ.get(n)]
    key = (parts.scheme, parts.netloc, repr(sorted(config.items())),
           repr(sorted(client.items())) + f" roots {authorities}"
           + (f" chain {profile or os.environ.get('AWS_PROFILE')}" if chain else ""))
    with _STORES_LOCK:
        store = _STORES.get(key)
        if store is None:
            from obstore.store import from_url

            if authorities:  # added to obstore's roots, as botocore and ssl trust them
                client["root_certificate"] = _certificates(authorities)

            provider = None
            if chain:  # once a store: botocore reads its files (and may ask a server)
                provider, region = _botocore_chain(profile)
                if region and "region" not in config and not os.environ.get("AWS_REGION") \
                        and not os.environ.get("AWS_DEFAULT_REGION"):
                    config["region"] = region
            try:
                store = from_url(  # type: ignore[call-overload]  # obstore's TypedDicts
                    f"{parts.scheme}://{parts.netloc}", config=config or None,
                    client_options=client, credential_provider=provider,
                    retry_config={"max_retries": 0,
                                  "retry_timeout": timedelta(seconds=deadline_seconds)})
            except (_module().exceptions.BaseError, ValueError, TypeError) as exc:
                raise StorageError(
                    f"cannot open '{url}' with obstore: {_first_line(exc)}; check its "
                    "storage options, or read it through s3fs (SHARDFEED_OBSTORE=0)") from exc
            _STORES[key] = store
            _USED = True
    return store, parts.path.lstrip("/")


def _learn_region(url: str, storage_options: Mapping[str, Any] | None,
                  deadline_seconds: float) -> str:
    """The region of ``url``'s bucket, asked of the server (once a bucket and endpoint) after
    a request signed for another region was refused; later stores of the bucket use it.

    S3 names a bucket's region in the ``x-amz-bucket-region`` header of its answer to a HEAD
    of the bucket, signed or not, whatever the status (200, 301 or 403): botocore's redirect
    reads the same header. Raises :class:`ObstoreRefused` where the answer names none."""
    import urllib.error
    import urllib.request

    parts = urlsplit(url)
    config, _ = _config(_options(url, storage_options))
    endpoint = _endpoint(config)
    with _REGIONS_LOCK:  # one question at a time a bucket; other buckets do not wait
        lock = _PROBES.setdefault((endpoint, parts.netloc), threading.Lock())
    with lock:
        known = _REGIONS.get((endpoint, parts.netloc))
        if known is not None:
            return known
        probe = f"{(endpoint or 'https://s3.amazonaws.com').rstrip('/')}/{parts.netloc}"
        opener = urllib.request.build_opener(_NoRedirect)
        try:
            with opener.open(urllib.request.Request(probe, method="HEAD"),
                             timeout=min(10.0, deadline_seconds / 2)) as answer:
                region = answer.headers.get("x-amz-bucket-region")
        except urllib.error.HTTPError as exc:  # 301 and 403 name the region too
            region = exc.headers.get("x-amz-bucket-region")
        except OSError as exc:
            raise ObstoreRefused(
                f"the bucket '{parts.netloc}' is in another region than the one asked, and "
                f"asking {probe} for its region failed ({exc}); give the region: "
                "storage_options={'client_kwargs': {'region_name': ...}} or AWS_REGION"
            ) from None
        if not region:
            raise ObstoreRefused(
                f"the bucket '{parts.netloc}' is in another region than the one asked, and "
                f"the server did not name it (no x-amz-bucket-region from {probe}); give the "
                "region: storage_options={'client_kwargs': {'region_name': ...}} or AWS_REGION")
        _REGIONS[(endpoint, parts.netloc)] = str(region)
        return str(region)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is an answer to read (its headers name the region), not one to follow."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def _in_region(url: str, storage_options: Mapping[str, Any] | None, deadline_seconds: float,
               op: Callable[[Any, str], T], *,
               opened: Callable[[], tuple[Any, str]] | None = None,
               moved: Callable[[Any, str], None] | None = None) -> Callable[[], T]:
    """One attempt at ``op(store, path)`` with the store of ``url`` (``opened()``, else
    looked up), judged (see :func:`_judged`); refused for the bucket's region, the region is
    learnt and the request sent again once, to the store of that region (given to
    ``moved``)."""

    def attempt() -> T:
        store, path = opened() if opened is not None else _store(url, storage_options,
                                                                  deadline_seconds)
        try:
            return _judged(lambda: op(store, path))()
        except WrongRegion:
            _learn_region(url, storage_options, deadline_seconds)
            store, path = _store(url, storage_options, deadline_seconds)
            if moved is not None:
                moved(store, path)
            try:
                return _judged(lambda: op(store, path))()
            except WrongRegion as exc:
                raise ObstoreRefused(
                    f"{exc}, in the bucket's own region too; check the endpoint") from None

    return attempt


class WrongRegion(Exception):
    """The server refused a request signed for another region than the bucket's (S3's 301
    without a Location): the region is learnt and the request sent again."""


class ServerAnswer(Exception):
    """An obstore call the server answered with an error status (``status``: the HTTP code;
    5xx and 429 are retried, the others are not)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class RangeIgnored(Exception):
    """The server answered a ranged GET with the whole object: not retried (it would answer
    the same), and not read (it could be far larger than the range)."""

    advice = ("the server ignores Range requests; serve the shards from a store that "
              "honours them, or read them through fsspec (SHARDFEED_OBSTORE=0; it reads such "
              "answers whole and cuts the range from them)")


class ObstoreRefused(Exception):
    """A failure of obstore that is not the server's silence (a wrong region or
    configuration, a credentials request that failed): not retried."""

    advice = ("check the storage options, the credentials and the bucket's region, or read "
              "through fsspec (SHARDFEED_OBSTORE=0)")


# what obstore says when no answer came, or a short one: worth another attempt
_NO_ANSWER = ("error sending request", "timed out", "timeout", "connection", "Connection",
              "error decoding response body", "end of file", "IncompleteBody", "broken pipe",
              ", got ")

# S3's answers to a request signed for another region than the bucket's
_WRONG_REGION = ("incorrectly configured region", "AuthorizationHeaderMalformed")
_RETRY_TIMEOUT = re.compile(r"retry_timeout: [^,\n]*")
_STATUS = re.compile(r"status code: (\d{3})")
_METADATA_SERVICE = "169.254.169.254"
"""Where obstore asks for credentials when it has none (an EC2 instance's metadata)."""


def _first_line(exc: BaseException) -> str:
    """obstore's message without its debug dump (the request and retry state)."""
    text = str(exc).split("\n", 1)[0].split("Debug source:", 1)[0].strip()
    return text[:300] or type(exc).__name__


def _judged(fn: Callable[[], T]) -> Callable[[], T]:
    """``fn`` with obstore's failures as the storage layer judges them: a missing object a
    FileNotFoundError, refused access a PermissionError, an error status a
    :class:`ServerAnswer`, a whole object for a range :class:`RangeIgnored`, no answer
    (refused, reset, timed out) a ConnectionError."""
    errors = _module().exceptions

    def attempt() -> T:
        try:
            return fn()
        except (FileNotFoundError, errors.NotFoundError) as exc:
            raise FileNotFoundError(_first_line(exc)) from None
        except (errors.PermissionDeniedError, errors.UnauthenticatedError) as exc:
            raise PermissionError(_first_line(exc)) from None
        except errors.GenericError as exc:
            # (every debug dump names the retry_timeout: not a sign of no answer)
            text, line = _RETRY_TIMEOUT.sub("", str(exc)), _first_line(exc)
            if "non-partial response" in text:  # a 200 with the whole object for a range
                raise RangeIgnored(line) from None
            if any(word in text for word in _WRONG_REGION):
                raise WrongRegion(line) from None
            if "InvalidCertificate" in text:  # not the server's silence: not retried
                raise ObstoreRefused(
                    f"the server's TLS certificate is not trusted ({line}); for a private "
                    "certificate authority set AWS_CA_BUNDLE to a PEM file of it") from None
            if _METADATA_SERVICE in text:  # no credentials anywhere else: asked the instance
                raise ObstoreRefused(  # metadata service, which answered no or not at all
                    "no AWS credentials found (none in the storage options, the environment, "
                    f"AWS_PROFILE or ~/.aws, and the instance metadata service gave none): "
                    f"{line}") from None
            status = _STATUS.search(text)
            if status is not None:
                code = int(status.group(1))
                raise ServerAnswer(f"the server answered HTTP {code}: {line}", code) from None
            if any(word in text for word in _NO_ANSWER):
                raise ConnectionError(line) from None
            raise ObstoreRefused(line) from None
        except errors.BaseError as exc:  # configuration, path, precondition: not retried
            raise ObstoreRefused(_first_line(exc)) from None

    return attempt


class ObstoreSource:
    """Random access to one object through obstore (see the module docstring). Thread-safe."""

    def __init__(self, url: str, *, deadline_seconds: float = DEFAULT_DEADLINE_SECONDS,
                 retries: int | None = None, backoff_seconds: float = 0.1,
                 max_backoff_seconds: float = 10.0,
                 coalesce_gap_bytes: int = DEFAULT_COALESCE_GAP_BYTES,
                 max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
                 storage_options: Mapping[str, Any] | None = None, **_ignored: Any) -> None:
        self.url = url
        self.policy = RetryPolicy(retries=retries, backoff_seconds=backoff_seconds,
                                  max_backoff_seconds=max_backoff_seconds,
                                  deadline_seconds=deadline_seconds)
        self.deadline_seconds = self.policy.deadline_seconds
        self.coalesce_gap_bytes = int(coalesce_gap_bytes)
        self.max_request_bytes = int(max_request_bytes)
        self._obstore = _module()
        self._storage_options = storage_options
        self._options = {"deadline_seconds": deadline_seconds, "retries": retries,
                         "backoff_seconds": backoff_seconds,
                         "max_backoff_seconds": max_backoff_seconds,
                         "coalesce_gap_bytes": coalesce_gap_bytes,
                         "max_request_bytes": max_request_bytes,
                         "storage_options": storage_options}
        self._fsspec: Any = None  # in a process forked after obstore ran (see _forked)
        self._store: Any = None
        self._path = ""
        if not _FORKED_AFTER_USE:
            self._store, self._path = _store(url, storage_options, self.deadline_seconds)
        self._retrier = Retrier(self.policy, key=url)
        self._calls = CallGroup()
        self._size: int | None = None
        self._lock = threading.Lock()
        self.requests = 0
        self.bytes_fetched = 0

    def _call(self, action: str, op: Callable[[Any, str], T]) -> T:
        """``op(store, path)`` under the retry policy, in the bucket's region."""
        attempt = _in_region(self.url, self._storage_options, self.deadline_seconds, op,
                             opened=self._opened, moved=self._moved)
        return self._retrier.call(attempt, url=self.url, action=action, group=self._calls)

    def _opened(self) -> tuple[Any, str]:
        return self._store, self._path

    def _moved(self, store: Any, path: str) -> None:
        self._store, self._path = store, path

    def _stand_in(self) -> Any:
        """fsspec's reader of the URL, in a process forked after obstore ran; else None."""
        if not _FORKED_AFTER_USE:
            return None
        with self._lock:
            if self._fsspec is None:
                self._fsspec = _fsspec_source(self.url, self._options)
        return self._fsspec

    def stats(self) -> dict[str, int]:
        """``requests`` (ranges asked of the store), ``bytes_fetched``, ``retries``, as
        RemoteSource counts them."""
        stand_in = self._stand_in()
        if stand_in is not None:
            return dict(stand_in.stats())
        with self._lock:
            return {"requests": self.requests, "bytes_fetched": self.bytes_fetched,
                    "retries": self._retrier.retries_done}

    def size(self) -> int:
        """The object's size: one HEAD, remembered."""
        stand_in = self._stand_in()
        if stand_in is not None:
            return int(stand_in.size())
        if self._size is None:
            meta = self._call("get the size of", self._obstore.head)
            self._size = int(meta["size"])
        return self._size

    def read(self, offset: int, length: int) -> bytes:
        return self.read_ranges([(offset, length)])[0]

    def read_ranges(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        stand_in = self._stand_in()
        if stand_in is not None:
            return list(stand_in.read_ranges(ranges))
        for offset, length in ranges:
            check_range(offset, length)
        plan = coalesce_ranges(ranges, gap_bytes=self.coalesce_gap_bytes,
                               max_request_bytes=self.max_request_bytes)
        if not plan:  # nothing asked, or only empty ranges
            return [b""] * len(ranges)
        action = f"read bytes {plan[0].start}..{plan[-1].end} of"
        if self.coalesce_gap_bytes < 0:  # obstore would merge touching ranges: one call each

            def each(store: Any, path: str) -> list[Any]:
                return [self._obstore.get_range(store, path, start=r.start, end=r.end)
                        for r in plan]
            blobs = self._call(action, each)
        else:
            blobs = self._call(action, lambda store, path: self._obstore.get_ranges(
                store, path, starts=[r.start for r in plan], ends=[r.end for r in plan],
                coalesce=0))
        with self._lock:
            self.requests += len(plan)
            self.bytes_fetched += sum(len(b) for b in blobs)
        return split_answers(ranges, plan, blobs)

    def close(self) -> None:
        """Idempotent; a read waiting in another thread ends at once with a StorageError."""
        self._calls.cancel_all()
        if self._fsspec is not None:
            self._fsspec.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ObstoreSource({self.url!r})"


def _read_bytes(url: str, storage_options: Mapping[str, Any] | None) -> bytes:
    """The whole object, under the current policy (a Dataset opens its manifest and indexes
    within its own ``deadline_seconds``)."""
    obstore = _module()
    policy = current_policy()
    if _FORKED_AFTER_USE:
        with _fsspec_source(url, {"storage_options": storage_options,
                                  "deadline_seconds": policy.deadline_seconds,
                                  "retries": policy.retries,
                                  "backoff_seconds": policy.backoff_seconds,
                                  "max_backoff_seconds": policy.max_backoff_seconds}) as source:
            return bytes(source.read(0, source.size()))
    _store(url, storage_options, policy.deadline_seconds)  # a wrong configuration: at once
    return Retrier(policy, key=url).call(
        _in_region(url, storage_options, policy.deadline_seconds,
                   lambda store, path: bytes(obstore.get(store, path).bytes())),
        url=url, action="read")


def _fsspec_source(url: str, options: Mapping[str, Any]) -> Any:
    """fsspec's reader of ``url`` with ``options`` (a RemoteSource's), for a process forked
    after obstore ran; a StorageError that says what to do where fsspec cannot read it."""
    from shardfeed.storage.remote import RemoteSource

    if "obstore_config" in (storage_options_for(url, options.get("storage_options")) or {}):
        raise StorageError(
            f"cannot read '{url}' in this process: it was forked from one that read through "
            "obstore (whose threads do not follow a fork), and its storage options are "
            "obstore's (obstore_config), which fsspec cannot read; start worker processes "
            "with the 'spawn' or 'forkserver' method, or open the dataset in the worker")
    return RemoteSource(url, **options)


def _size(url: str, storage_options: Mapping[str, Any] | None) -> int:
    policy = current_policy()
    return ObstoreSource(url, storage_options=storage_options, retries=policy.retries,
                         backoff_seconds=policy.backoff_seconds,
                         max_backoff_seconds=policy.max_backoff_seconds,
                         deadline_seconds=policy.deadline_seconds).size()


OBSTORE = Backend(
    "obstore", open=ObstoreSource, read_bytes=_read_bytes, size=_size,
    options=("deadline_seconds", "coalesce_gap_bytes", "max_request_bytes", "storage_options",
             "max_concurrency", "retries", "backoff_seconds", "max_backoff_seconds", "cache"),
    serves=serves)
"""The backend (the options of RemoteSource are taken, those obstore has no use for ignored,
so a Dataset's ``source_options`` work with either)."""


def use_obstore(schemes: Sequence[str] = SCHEMES) -> None:
    """Read URLs of ``schemes`` through obstore from now on, in this process."""
    _module()
    register_backend(schemes, OBSTORE)
