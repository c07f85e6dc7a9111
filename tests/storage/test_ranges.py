"""Range coalescing, retry policy and error classification (no network)."""

from __future__ import annotations

import errno
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardfeed.errors import StorageError
from shardfeed.storage.ranges import split_answers
from shardfeed.storage.remote import coalesce_ranges
from shardfeed.storage.retry import Retrier, RetryPolicy, is_transient

range_lists = st.lists(
    st.tuples(st.integers(0, 10_000), st.integers(0, 2_000)), min_size=0, max_size=60
)


@settings(max_examples=300, deadline=None)
@given(ranges=range_lists, gap=st.integers(-1, 3_000), max_request=st.integers(1, 20_000))
def test_every_range_is_covered_by_exactly_one_request(
    ranges: list[tuple[int, int]], gap: int, max_request: int
) -> None:
    plan = coalesce_ranges(ranges, gap_bytes=gap, max_request_bytes=max_request)
    members = [i for request in plan for i in request.members]
    assert sorted(members) == [i for i, (_, n) in enumerate(ranges) if n > 0]
    for request in plan:
        for i in request.members:
            offset, length = ranges[i]
            assert request.start <= offset and offset + length <= request.end
        # a request is only as long as the cap allows, unless it is one long range alone
        assert request.end - request.start <= max_request or len(request.members) == 1
    starts = [r.start for r in plan]
    assert starts == sorted(starts)


@settings(max_examples=200, deadline=None)
@given(ranges=range_lists, gap=st.integers(0, 3_000))
def test_requests_are_separated_by_more_than_the_gap(
    ranges: list[tuple[int, int]], gap: int
) -> None:
    plan = coalesce_ranges(ranges, gap_bytes=gap, max_request_bytes=10**9)
    for left, right in itertools.pairwise(plan):
        assert right.start - left.end > gap
    # requests never read bytes that no range asked for except holes <= gap
    for request in plan:
        covered = sorted((ranges[i][0], ranges[i][0] + ranges[i][1]) for i in request.members)
        end = covered[0][1]
        for lo, hi in covered[1:]:
            assert lo - end <= gap
            end = max(end, hi)


def test_neighbours_merge_and_far_ranges_do_not() -> None:
    plan = coalesce_ranges([(100, 10), (0, 50), (60, 10), (5000, 1)], gap_bytes=40,
                           max_request_bytes=1000)
    assert [(r.start, r.end, r.members) for r in plan] == [(0, 110, (1, 2, 0)), (5000, 5001, (3,))]
    none = coalesce_ranges([(0, 10), (10, 10)], gap_bytes=-1, max_request_bytes=1000)
    assert len(none) == 2


def test_backoff_doubles_up_to_the_cap_with_jitter_in_half_to_full() -> None:
    policy = RetryPolicy(retries=6, backoff_seconds=0.1, max_backoff_seconds=1.0)
    assert policy.delay(0, 0.0) == pytest.approx(0.05)
    assert policy.delay(2, 0.999) == pytest.approx(0.4, rel=1e-2)
    assert policy.delay(10, 0.0) == pytest.approx(0.5)
    assert policy.worst_case_wait_seconds() == pytest.approx(0.1 + 0.2 + 0.4 + 0.8 + 1 + 1)


@pytest.mark.parametrize(
    "kwargs", [{"retries": -1}, {"backoff_seconds": -0.1},
               {"backoff_seconds": 2.0, "max_backoff_seconds": 1.0}],
)
def test_bad_retry_settings_are_value_errors(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


def test_classification_of_failures() -> None:
    assert is_transient(ConnectionRefusedError())
    assert is_transient(TimeoutError())
    assert is_transient(OSError(errno.EIO, "InternalError"))
    assert not is_transient(FileNotFoundError("no such key"))
    assert not is_transient(PermissionError("denied"))
    assert not is_transient(OSError(errno.EINVAL, "bad range"))
    assert not is_transient(ValueError("bug"))
    import botocore.exceptions as boto

    assert is_transient(boto.EndpointConnectionError(endpoint_url="http://127.0.0.1:1"))
    err = boto.ClientError({"Error": {"Code": "SlowDown"},
                            "ResponseMetadata": {"HTTPStatusCode": 503}}, "GetObject")
    assert is_transient(err)
    wrapped = OSError(errno.EINVAL, "x")
    wrapped.__cause__ = err
    assert is_transient(wrapped)  # the HTTP status underneath decides
    denied = boto.ClientError({"Error": {"Code": "AccessDenied"},
                               "ResponseMetadata": {"HTTPStatusCode": 403}}, "GetObject")
    assert not is_transient(denied)


def test_retrier_retries_transient_then_succeeds_and_stops_on_permanent() -> None:
    calls = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionResetError("reset")
        return "ok"

    retrier = Retrier(RetryPolicy(retries=3, backoff_seconds=0.0), key="memory://x")
    assert retrier.call(flaky, url="memory://x", action="read") == "ok"
    assert len(calls) == 3 and retrier.retries_done == 2

    def missing() -> str:
        calls.append(1)
        raise FileNotFoundError("gone")

    calls.clear()
    with pytest.raises(StorageError, match=r"memory://x.*does not exist"):
        retrier.call(missing, url="memory://x", action="read")
    assert len(calls) == 1


def test_retrier_gives_up_after_its_budget_naming_the_url_and_attempts() -> None:
    retrier = Retrier(RetryPolicy(retries=2, backoff_seconds=0.0), key="s3://b/k")

    def down() -> None:
        raise ConnectionRefusedError("refused")

    with pytest.raises(StorageError, match=r"'s3://b/k' after 3 attempts"):
        retrier.call(down, url="s3://b/k", action="read")


def test_jitter_is_keyed_not_global() -> None:
    import random

    random.seed(1)
    a = Retrier(RetryPolicy(), key="s3://b/k")._rng.random()
    random.seed(2)
    b = Retrier(RetryPolicy(), key="s3://b/k")._rng.random()
    c = Retrier(RetryPolicy(), key="s3://b/other")._rng.random()
    assert a == b and a != c


def test_split_answers_cuts_each_range_from_its_request_answer() -> None:
    data = bytes(range(200))
    ranges = [(10, 5), (0, 0), (12, 6), (150, 50)]  # overlapping, empty, alone to the end
    plan = coalesce_ranges(ranges, gap_bytes=0, max_request_bytes=1 << 20)
    answers = [data[r.start : r.end] for r in plan]
    want = [data[o : o + n] for o, n in ranges]
    assert split_answers(ranges, plan, answers) == want
    assert split_answers(ranges, plan, [bytearray(a) for a in answers]) == want  # any buffer
    alone = coalesce_ranges([(150, 50)], gap_bytes=0, max_request_bytes=1 << 20)
    answer = data[150:]
    assert split_answers([(150, 50)], alone, [answer])[0] is answer  # a whole answer: no copy
