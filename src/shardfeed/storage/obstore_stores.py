"""The obstore store of a URL: its configuration from s3fs's words (or obstore's own), its
credentials, its bucket's region and the certificate authorities to trust; one store a
bucket and configuration, kept for the process, and none in a process forked after obstore
ran (see :func:`forked_after_use`). What reads through the stores, and how failures are
judged: :mod:`~shardfeed.storage.obstore_backend`.

Credentials come from the options, from the environment as obstore reads it, and otherwise
from botocore's chain as s3fs reads it (``AWS_PROFILE`` or ``profile=``, ``~/.aws``, SSO),
with that profile's region. A bucket in another region than the one given (or us-east-1) is
refused by S3; its region is then asked of the server (:func:`_learn_region`), once a
bucket. The certificate authorities of ``AWS_CA_BUNDLE`` and ``SSL_CERT_FILE`` are trusted
beside the usual roots.

State: the stores and the regions learnt, kept by
:data:`~shardfeed.storage.process_state.PROCESS` (a forked child starts with no stores).
Memory: one client a store.
"""

from __future__ import annotations

import math
import os
import re
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta, timezone
from types import MappingProxyType
from typing import Any
from urllib.parse import urlsplit

from shardfeed.errors import StorageError
from shardfeed.storage.failures import redact
from shardfeed.storage.options import storage_options_for
from shardfeed.storage.process_state import PROCESS
from shardfeed.storage.redirect_guard import redirect_guard

__all__ = ["ObstoreRefused", "forked_after_use", "installed", "is_panic", "is_region",
           "serves"]


def _module() -> Any:
    try:
        import obstore
    except ImportError as exc:
        raise StorageError(
            "the obstore backend needs obstore: pip install 'shardfeed[obstore]'"
        ) from exc
    return obstore


def installed() -> bool:
    """Whether obstore can be imported (looked up once)."""
    if PROCESS.obstore_installed is None:
        try:
            _module()
            PROCESS.obstore_installed = True
        except StorageError:
            PROCESS.obstore_installed = False
    return PROCESS.obstore_installed


def is_panic(exc: BaseException) -> bool:
    """Whether ``exc`` is pyo3's PanicException (obstore's Rust code failed an assertion):
    a BaseException, not an Exception."""
    return type(exc).__name__ == "PanicException"


def _first_line(exc: BaseException) -> str:
    """obstore's message without its debug dump (the request and retry state)."""
    text = str(exc).split("\n", 1)[0].split("Debug source:", 1)[0].strip()
    return redact(text)[:300] or type(exc).__name__


class ObstoreRefused(Exception):
    """A failure of obstore that is not the server's silence (a wrong region or
    configuration, a credentials request that failed): not retried."""

    advice = ("check the storage options, the credentials and the bucket's region, or read "
              "through fsspec (SHARDFEED_OBSTORE=0)")


def forked_after_use() -> bool:
    """Whether this process was forked from one that had used obstore: obstore's runtime
    threads did not follow the fork, and a call here would wait for them for ever, so fsspec
    reads instead (see :mod:`~shardfeed.storage.process_state` for the fork rule)."""
    return PROCESS.forked_after_obstore


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
    that no option is dropped: ``requester_pays``, ``s3_additional_kwargs``, ...), ``url``
    has no query (obstore would drop it, and read another object), and obstore can run in
    this process (see :func:`forked_after_use`)."""
    if PROCESS.forked_after_obstore:
        return False
    if urlsplit(url).query:  # a query names the object too (presigned URLs, version ids),
        return False         # and obstore's paths cannot carry one: fsspec reads it whole
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


# -- what obstore is never given ------------------------------------------------------------
# obstore panics (pyo3's PanicException: a BaseException, which neither ``except Exception``
# nor on_error="skip" catches) when it signs a request whose endpoint is not a URL, or whose
# region or credentials cannot be sent in a header. So they are checked before a store is
# made, the ones it reads from the environment too, and a panic that still happens is a
# StorageError (see ``obstore_backend._judged``).

_REGION_TEXT = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_HEADER_TEXT = re.compile(r"[\x21-\x7e]{1,16384}")
_CREDENTIAL_WORDS = frozenset({"access_key_id", "aws_access_key_id", "secret_access_key",
                               "aws_secret_access_key", "session_token", "aws_session_token",
                               "token", "aws_token"})
_ENV_CHECKED = MappingProxyType({
    "AWS_ENDPOINT_URL": "endpoint", "AWS_ENDPOINT": "endpoint",
    "AWS_ENDPOINT_URL_S3": "endpoint", "AWS_REGION": "region", "AWS_DEFAULT_REGION": "region",
    "AWS_ACCESS_KEY_ID": "access_key_id", "AWS_SECRET_ACCESS_KEY": "secret_access_key",
    "AWS_SESSION_TOKEN": "session_token"})


def is_region(text: object) -> bool:
    """Whether ``text`` can be a bucket's region (letters, digits, ``-``, ``_``, ``.``)."""
    return isinstance(text, str) and _REGION_TEXT.fullmatch(text) is not None


def _endpoint_ok(value: object) -> bool:
    if not isinstance(value, str) or any(ord(c) <= 32 or ord(c) == 127 for c in value):
        return False
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def _refuse_unsendable(url: str, config: Mapping[str, Any], scheme: str) -> None:
    """StorageError for an endpoint, region or credential obstore would panic on (the
    options' and, for S3, the environment's), naming the option, never a secret's value."""
    found = [(word, value, f"the storage option {word!r}") for word, value in config.items()]
    if scheme == "s3":
        found += [(word, os.environ[name], f"the environment variable {name}")
                  for name, word in _ENV_CHECKED.items() if os.environ.get(name)]
    for word, value, where in found:
        low = word.lower()
        if low in _ENDPOINT_WORDS and not _endpoint_ok(value):
            raise StorageError(
                f"cannot open '{url}': {where} is {redact(repr(value)):.120}, not an http:// "
                "or https:// "
                "URL with a host; give it whole, e.g. 'http://127.0.0.1:9000'")
        if low in _REGION_WORDS and not is_region(value):
            raise StorageError(
                f"cannot open '{url}': {where} is {value!r:.60}, which is not a region name "
                "(letters, digits, '-', '_', '.'); e.g. 'us-east-1'")
        if low in _CREDENTIAL_WORDS and not (isinstance(value, str)
                                             and _HEADER_TEXT.fullmatch(value)):
            raise StorageError(
                f"cannot open '{url}': {where} holds characters no HTTP header can carry "
                "(spaces, line breaks or other control characters); check how it was copied")


def _store(url: str, storage_options: Mapping[str, Any] | None,
           deadline_seconds: float) -> tuple[Any, str]:
    """The store of ``url``'s bucket (made once a bucket, configuration and timeouts) and
    the object path."""
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
    with PROCESS.lock:
        learnt = PROCESS.regions.get((endpoint, parts.netloc)) if parts.scheme == "s3" else None
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
    _refuse_unsendable(url, config, parts.scheme)
    client.update(redirect_guard(parts.scheme, parts.netloc, endpoint, config))
    authorities = [os.environ[n] for n in _CA_VARIABLES if os.environ.get(n)]
    key = (parts.scheme, parts.netloc, repr(sorted(config.items())),
           repr(sorted(client.items())) + f" roots {authorities}"
           + (f" chain {profile or os.environ.get('AWS_PROFILE')}" if chain else ""))

    def make() -> Any:
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
        except BaseException as exc:
            if not isinstance(exc, (_module().exceptions.BaseError, ValueError,
                                    TypeError)) and not is_panic(exc):
                raise
            raise StorageError(
                f"cannot open '{url}' with obstore: {_first_line(exc)}; check its "
                "storage options, or read it through s3fs (SHARDFEED_OBSTORE=0)") from exc
        with PROCESS.lock:
            PROCESS.obstore_used = True
        return store

    return PROCESS.once(PROCESS.stores, key, make), parts.path.lstrip("/")


def _learn_region(url: str, storage_options: Mapping[str, Any] | None,
                  deadline_seconds: float) -> str:
    """The region of ``url``'s bucket, asked of the server (once a bucket and endpoint, one
    question at a time: other buckets do not wait) after a request signed for another region
    was refused; later stores of the bucket use it.

    S3 names a bucket's region in the ``x-amz-bucket-region`` header of its answer to a HEAD
    of the bucket, signed or not, whatever the status (200, 301 or 403): botocore's redirect
    reads the same header. Raises :class:`ObstoreRefused` where the answer names none."""
    parts = urlsplit(url)
    config, _ = _config(_options(url, storage_options))
    endpoint = _endpoint(config)
    return PROCESS.once(PROCESS.regions, (endpoint, parts.netloc),
                        lambda: _ask_region(endpoint, parts.netloc, deadline_seconds))


def _ask_region(endpoint: str, bucket: str, deadline_seconds: float) -> str:
    """The region the server names for ``bucket`` (see :func:`_learn_region`)."""
    import urllib.error
    import urllib.request

    probe = f"{(endpoint or 'https://s3.amazonaws.com').rstrip('/')}/{bucket}"
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(urllib.request.Request(probe, method="HEAD"),
                         timeout=min(10.0, deadline_seconds / 2)) as answer:
            region = answer.headers.get("x-amz-bucket-region")
    except urllib.error.HTTPError as exc:  # 301 and 403 name the region too
        region = exc.headers.get("x-amz-bucket-region")
    except OSError as exc:
        raise ObstoreRefused(
            f"the bucket '{bucket}' is in another region than the one asked, and "
            f"asking {probe} for its region failed ({exc}); give the region: "
            "storage_options={'client_kwargs': {'region_name': ...}} or AWS_REGION"
        ) from None
    if not region:
        raise ObstoreRefused(
            f"the bucket '{bucket}' is in another region than the one asked, and "
            f"the server did not name it (no x-amz-bucket-region from {probe}); give the "
            "region: storage_options={'client_kwargs': {'region_name': ...}} or AWS_REGION")
    if not is_region(region):  # never remembered: every store of the bucket would panic
        raise ObstoreRefused(
            f"the bucket '{bucket}' is in another region than the one asked, and "
            f"the server named its region {region!r:.60}, which is not a region name; "
            "give the region: storage_options={'client_kwargs': {'region_name': ...}}")
    return str(region)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is an answer to read (its headers name the region), not one to follow."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None
