"""Fuzzed server answers (tests/storage/answer_server.py) through the roads a user reads by:
:class:`~shardfeed.storage.obstore_backend.ObstoreSource` on ``s3://``,
:class:`~shardfeed.storage.remote.RemoteSource` on ``http://``, and
:func:`~shardfeed.storage.files.read_bytes` on both.

A seeded generator makes :data:`CASES` hostile answers to ranged GETs, HEADs and whole GETs:
error statuses, redirects to the same or another origin, lengths and ranges that lie, bodies
cut, longer than asked (up to 64 MiB for a 64 KiB range), trickling, garbled chunked
encoding. Each case goes through the two roads whose requests it answers. What may come back:
the object's true bytes (or size), or a :class:`~shardfeed.errors.StorageError`. Never
another exception (a ``PanicException`` included: it is a BaseException), other bytes, an
answer later than the deadline and :data:`SLACK_SECONDS`, more memory than
:func:`_memory_bound` (a 64 KiB read: 8 MiB), nor a session token or signature sent to the
other origin a redirect names.

The suite runs it in a process of its own (test_server_answers.py: its servers, threads and
obstore stores never meet another test's), 80 cases; by hand: ``pytest
tests/storage/fuzz_server_answers.py`` (all 150; one case: ``-k c042``; the ids name the
case, its kind, the road and the answer; ``SHARDFEED_FUZZ_CASES=N`` for another count). A
redirect to another origin goes to another host (127.0.0.2): the guard against credentials
sent after a redirect is by host, not port.
"""

from __future__ import annotations

import os
import random
import resource
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from answer_server import HUGE_BYTES, Answer, AnswerServer, Case, Kind, Length

from shardfeed.errors import StorageError
from shardfeed.storage import files
from shardfeed.storage.remote import RemoteSource
from shardfeed.storage.retry import RetryPolicy

pytest.importorskip("obstore")

from shardfeed.storage.obstore_backend import ObstoreSource

SEED = 20240611
CASES = int(os.environ.get("SHARDFEED_FUZZ_CASES", "150"))
DEADLINE_SECONDS = 3.0
RETRIES = 2
BACKOFF_SECONDS = 0.01
STALL_DEADLINE_SECONDS = 1.5
"""The deadline of a case whose answer stalls (shorter: the whole file stays short)."""
SLACK_SECONDS = 3.0
"""Allowed past the deadline on a loaded machine."""
RANGE_BYTES = 64 << 10
MEMORY_BYTES = 8 << 20
"""The most a 64 KiB read (or a HEAD) may add to the process's resident memory."""
TOKEN = "FUZZ-TOKEN"
SECRETS = ("authorization", "x-amz-security-token")
"""Headers no other origin may be sent."""

# -- the generator ------------------------------------------------------------------------------

_ERRORS = (400, 403, 404, 412, 416, 429, 500, 503)
_REDIRECTS = (301, 302, 307, 308)
_GARBAGE = ("abc", "-1", "1e3", "12 34", "99999999999999999999999", "0x10", "", "+5")
_RANGE_GARBAGE = ("bytes */*", "bytes a-b/c", "bytes 5-1/10", "octets 0-9/10", "bytes 0-/",
                  "", "bytes 0-99999999999999999999/1")
_CHUNK_LINES = (b"zz", b"-5", b"fffffffffffffffffff", b"ok", b"cut", b"10", b"1 ; x", b"")


def _status(rng: random.Random, kind: Kind, turn: int) -> Answer:
    return Answer(status=_ERRORS[turn % len(_ERRORS)], length=rng.choice(("right", "right", "long")))


def _redirect(rng: random.Random, kind: Kind, turn: int) -> Answer:
    return Answer(status=_REDIRECTS[turn % len(_REDIRECTS)], location=rng.choice(
        ("same", "other", "other", "relative", "missing", "refused")))


def _length(rng: random.Random, kind: Kind, turn: int) -> Answer:
    # a whole answer whose length is short, or a HEAD's size, cannot be told from another
    # object's: only the lies a client can see
    choices: dict[Kind, tuple[Length, ...]] = {
        "range": ("short", "long", "garbage", "missing", "huge"),
        "whole": ("long", "garbage", "missing"), "head": ("garbage", "missing")}
    return Answer(length=rng.choice(choices[kind]), garbage=rng.choice(_GARBAGE))


def _content_range(rng: random.Random, kind: Kind, turn: int) -> Answer:
    return Answer(status=206, content_range=rng.choice(
        ("short", "shifted", "garbage", "missing", "total")), garbage=rng.choice(_RANGE_GARBAGE))


def _cut(rng: random.Random, kind: Kind, turn: int) -> Answer:
    if kind == "head":
        return Answer(body="cut_headers")
    return Answer(body=rng.choice(("cut", "cut", "none", "cut_headers")))


def _long_body(rng: random.Random, kind: Kind, turn: int) -> Answer:
    if kind == "whole":
        return Answer(body="extra")
    return Answer(body=rng.choice(("extra", "whole", "whole", "huge")),
                  length=rng.choice(("right", "right", "huge", "missing")))


def _trickle(rng: random.Random, kind: Kind, turn: int) -> Answer:
    if turn % 8 == 3:  # pauses longer than an attempt's idle read timeout: a stall
        return Answer(pause_seconds=1.0, piece_bytes=32 << 10)
    return Answer(pause_seconds=rng.choice((0.005, 0.02, 0.05)),
                  piece_bytes=rng.choice((4 << 10, 8 << 10, 16 << 10)),
                  body=rng.choice(("right", "right", "right", "cut")))


def _chunked(rng: random.Random, kind: Kind, turn: int) -> Answer:
    return Answer(chunk_line=rng.choice(_CHUNK_LINES))


def _mixed(rng: random.Random, kind: Kind, turn: int) -> Answer:
    fields: dict[str, Any] = {}
    for family in rng.sample(_FAMILIES, 2):
        answer = family.make(rng, kind, turn)
        fields.update({name: getattr(answer, name) for name in Answer.__slots__
                       if getattr(answer, name) != getattr(Answer(), name)})
    if kind != "range" and fields.get("length") in ("short", "huge"):
        fields.pop("length")
    if kind == "whole" and fields.get("body") in ("whole", "huge"):
        fields.pop("body")
    if kind == "whole" and fields.get("length") == "missing" and fields.get("body") in (
            "cut", "none"):
        fields.pop("body")  # a body delimited by the close, cut: another object's whole
    return Answer(**fields)


def _good(rng: random.Random, kind: Kind, turn: int) -> Answer:
    return Answer()


@dataclass(frozen=True, slots=True)
class _Family:
    name: str
    make: Callable[[random.Random, Kind, int], Answer]
    kinds: tuple[Kind, ...]


_FAMILIES = (
    _Family("status", _status, ("range", "head", "whole")),
    _Family("redirect", _redirect, ("range", "head", "whole")),
    _Family("length", _length, ("range", "range", "head", "whole")),
    _Family("content_range", _content_range, ("range",)),
    _Family("cut", _cut, ("range", "head", "whole")),
    _Family("long_body", _long_body, ("range", "range", "range", "whole")),
    _Family("trickle", _trickle, ("range", "whole")),
    _Family("chunked", _chunked, ("range", "whole")),
)


def _object_size(rng: random.Random, kind: Kind, answer: Answer) -> int:
    if kind != "range":
        return rng.choice((0, 1000, RANGE_BYTES, 300_000, 1 << 20)) if kind == "whole" else (
            rng.choice((1000, 1 << 20, HUGE_BYTES)))
    if answer.body == "whole":
        return rng.choice((1 << 20, HUGE_BYTES))
    return rng.choice((256 << 10, 1 << 20, 5 << 20))


def generate(seed: int = SEED, count: int = CASES) -> list[Case]:
    """``count`` cases, the same for the same seed: the families in turn (a good answer
    every 12th, two families mixed every 6th), each drawn with ``Random(f"{seed}-{k}")``
    (statuses in turn, so that each is drawn)."""
    out = []
    turns: dict[str, int] = {}
    for k in range(count):
        rng = random.Random(f"{seed}-{k}")
        if k % 12 == 11:
            family = _Family("good", _good, ("range", "head", "whole"))
        elif k % 6 == 5:
            family = _Family("mixed", _mixed, ("range", "range", "whole", "head"))
        else:
            family = _FAMILIES[k % len(_FAMILIES)]
        kind = rng.choice(family.kinds)
        turn = turns[family.name] = turns.get(family.name, -1) + 1
        answer = family.make(rng, kind, turn)
        size = _object_size(rng, kind, answer)
        if kind == "whole" and answer.pause_seconds:
            size = min(size, 300_000)
            answer = Answer(**{**{n: getattr(answer, n) for n in Answer.__slots__},
                               "piece_bytes": max(4096, size // 12)})
        deadline = STALL_DEADLINE_SECONDS if answer.pause_seconds >= 1 else DEADLINE_SECONDS
        offset = rng.randrange(0, size - RANGE_BYTES - 1) if kind == "range" else 0
        out.append(Case(name=f"c{k:03d}", kind=kind, size=size, base=rng.randrange(1 << 30),
                        answer=answer, offset=offset,
                        length=RANGE_BYTES if kind == "range" else 0,
                        deadline_seconds=deadline))
    return out


ALL = generate()

# -- the roads ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Servers:
    hostile: AnswerServer
    other: AnswerServer

    def s3(self, case: Case) -> str:
        return f"s3://fuzz-{case.name}/obj"

    def http(self, case: Case) -> str:
        return f"{self.hostile.endpoint_url}/fuzz-{case.name}/obj"

    def s3_options(self) -> dict[str, Any]:
        return {"key": "fuzz-key", "secret": "fuzz-secret", "token": TOKEN,
                "client_kwargs": {"endpoint_url": self.hostile.endpoint_url,
                                  "region_name": "us-east-1"}}


@pytest.fixture(scope="module")
def servers() -> Iterator[Servers]:
    """The hostile server and the other origin its redirects may name, with every case."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AWS_EC2_METADATA_DISABLED", "true")
        patch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY",
                     "all_proxy", "NO_PROXY", "no_proxy", "AWS_ENDPOINT_URL", "AWS_PROFILE"):
            patch.delenv(name, raising=False)
        hostile, other = AnswerServer(), AnswerServer(honest=True, host="127.0.0.2")
        hostile.other_url = other.endpoint_url
        for case in [*ALL, *WARM_UP]:
            hostile.cases[f"fuzz-{case.name}"] = case
            other.cases[f"fuzz-{case.name}"] = case
        try:
            found = Servers(hostile, other)
            _warm_up(found)
            yield found
        finally:
            hostile.stop()
            other.stop()


WARM_UP = [Case(name=f"warm-{kind}", kind=kind, size=1 << 20, base=0, answer=Answer(),
                length=RANGE_BYTES if kind == "range" else 0)
           for kind in ("range", "head", "whole")]
"""Good answers read once through every road before the cases: what the first read loads
(modules, runtimes, pools) is not counted against a case's memory."""


def _warm_up(servers: Servers) -> None:
    for case in WARM_UP:
        for road in ROADS[case.kind]:
            read, close = _call(servers, case, road)
            try:
                assert read() == _want(case), f"the {road} road cannot read a good answer"
            finally:
                close()


def _policy(case: Case) -> dict[str, Any]:
    return {"deadline_seconds": case.deadline_seconds, "retries": RETRIES,
            "backoff_seconds": BACKOFF_SECONDS}


def _http_options(case: Case) -> dict[str, Any]:
    # a header of the case's own: a filesystem (and connection pool) of its own
    return {"headers": {"x-fuzz-case": case.name}}


def _call(servers: Servers, case: Case, road: str) -> tuple[Callable[[], Any], Callable[[], None]]:
    """The read of ``road`` for ``case`` (its source opened first), and how to close it."""
    if road in ("obstore", "fsspec"):
        source: Any = (ObstoreSource(servers.s3(case), storage_options=servers.s3_options(),
                                     **_policy(case)) if road == "obstore" else
                       RemoteSource(servers.http(case), storage_options=_http_options(case),
                                    **_policy(case)))
        if case.kind == "head":
            return source.size, source.close
        return lambda: source.read(case.offset, case.length), source.close
    url, options = ((servers.s3(case), servers.s3_options()) if road == "read_bytes_s3"
                    else (servers.http(case), _http_options(case)))

    def whole() -> bytes:
        with files.retry_policy(RetryPolicy(**_policy(case))):
            return files.read_bytes(url, storage_options=options)

    return whole, lambda: None


ROADS: dict[Kind, tuple[str, str]] = {"range": ("obstore", "fsspec"),
                                      "head": ("obstore", "fsspec"),
                                      "whole": ("read_bytes_s3", "read_bytes_http")}

# -- the harness -------------------------------------------------------------------------------

_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _resident_bytes() -> int:
    """The process's resident memory now (Linux), else its peak so far."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE_BYTES
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


@dataclass(slots=True)
class Outcome:
    value: Any = None
    error: BaseException | None = None
    seconds: float = 0.0
    growth_bytes: int = 0
    hung: bool = False


def _run(read: Callable[[], Any], limit_seconds: float) -> Outcome:
    """``read()`` on a thread of its own, waited for up to ``limit_seconds``, its resident
    memory sampled every 2 ms (its growth over the start: ``growth_bytes``)."""
    outcome = Outcome()
    done = threading.Event()

    def work() -> None:
        try:
            outcome.value = read()
        except BaseException as exc:  # noqa: BLE001 - a PanicException is one
            outcome.error = exc
        finally:
            done.set()

    base = peak = _resident_bytes()
    began = time.monotonic()
    thread = threading.Thread(target=work, name="fuzz-read", daemon=True)
    thread.start()
    while not done.wait(0.002):
        peak = max(peak, _resident_bytes())
        if time.monotonic() - began > limit_seconds:
            outcome.hung = True
            break
    outcome.seconds = time.monotonic() - began
    outcome.growth_bytes = max(peak, _resident_bytes()) - base
    return outcome


def _want(case: Case) -> Any:
    if case.kind == "head":
        return case.size
    if case.kind == "range":
        return case.data(case.offset, case.offset + case.length)
    return case.data(0, case.size)


def _memory_bound(case: Case) -> int:
    return MEMORY_BYTES + (3 * case.size if case.kind == "whole" else 0)


def _judge(case: Case, outcome: Outcome) -> list[str]:
    """What went wrong (empty: an allowed outcome)."""
    wrong = []
    if outcome.hung:
        wrong.append(f"no answer after {outcome.seconds:.1f} s "
                     f"(deadline {case.deadline_seconds} s)")
    elif outcome.error is not None and not isinstance(outcome.error, StorageError):
        text = str(outcome.error).split("\n", 1)[0][:300]
        wrong.append(f"raised {type(outcome.error).__module__}.{type(outcome.error).__name__}: "
                     f"{text}")
    elif outcome.error is None:
        got, want = outcome.value, _want(case)
        if got != want:
            wrong.append(f"handed back wrong data: {_differ(got, want)}")
    if not outcome.hung and outcome.seconds > case.deadline_seconds + SLACK_SECONDS:
        wrong.append(f"took {outcome.seconds:.1f} s (deadline {case.deadline_seconds} s)")
    if outcome.growth_bytes > _memory_bound(case):
        wrong.append(f"resident memory grew by {outcome.growth_bytes / (1 << 20):.0f} MiB "
                     f"(bound {_memory_bound(case) / (1 << 20):.0f} MiB)")
    return wrong


def _differ(got: Any, want: Any) -> str:
    if not isinstance(got, (bytes, bytearray, memoryview)) or not isinstance(want, bytes):
        return f"{got!r} for {want!r}"
    got = bytes(got)
    at = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    return f"{len(got)} bytes for {len(want)}, first difference at byte {at}"


def _leaks(servers: Servers, case: Case, since: int) -> list[str]:
    """Requests of ``case`` the other origin received with a credential (from its
    ``since``-th request on)."""
    return [f"the other origin was sent {name} ({request.method} {request.path})"
            for request in list(servers.other.requests)[since:]
            if request.path.startswith(f"/fuzz-{case.name}/")
            for name in SECRETS if name in request.headers]


PARAMS = [pytest.param(case, road, id=f"{case.name}-{case.kind}-{road}-{case.answer.describe()}")
          for case in ALL for road in ROADS[case.kind]]


def test_the_generator_is_deterministic_and_covers_every_kind() -> None:
    again = generate()
    assert again == ALL
    assert {case.kind for case in ALL} == {"range", "head", "whole"}
    statuses = {case.answer.status for case in ALL}
    assert {301, 302, 307, 308, 404, 429, 500, 503} <= statuses
    assert {"other", "same"} <= {case.answer.location for case in ALL}
    assert any(case.answer.body == "whole" and case.size == HUGE_BYTES for case in ALL)


@pytest.mark.parametrize(("case", "road"), PARAMS)
def test_a_hostile_answer_gives_the_bytes_or_a_storage_error(
    servers: Servers, case: Case, road: str,
) -> None:
    read, close = _call(servers, case, road)
    since = len(servers.other.requests)
    try:
        outcome = _run(read, case.deadline_seconds + SLACK_SECONDS)
    finally:
        close()
    wrong = _judge(case, outcome) + _leaks(servers, case, since)
    assert not wrong, (f"{road} read of {case.kind} {case.name} (object of {case.size} bytes,"
                       f" answer {case.answer.describe()}): " + "; ".join(wrong))
