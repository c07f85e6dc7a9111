"""ByteCache: least recently used out first, bounded by bytes."""

from __future__ import annotations

import threading

import pytest

from shardfeed.storage.cache import ByteCache


def test_evicts_least_recently_used_until_within_bytes() -> None:
    cache = ByteCache(max_bytes=10)
    cache.put("a", b"aaaa")
    cache.put("b", b"bbbb")
    assert cache.get("a") == b"aaaa"  # a is now the most recent
    cache.put("c", b"cccc")  # 12 > 10: b goes, not a
    assert "b" not in cache
    assert cache.get("a") == b"aaaa" and cache.get("c") == b"cccc"
    assert cache.size_bytes == 8


def test_refuses_items_over_max_item_bytes_and_keeps_the_rest() -> None:
    cache = ByteCache(max_bytes=100, max_item_bytes=10)
    cache.put("small", b"x" * 10)
    assert cache.put("big", b"y" * 11) is False
    assert "big" not in cache and cache.get("small") == b"x" * 10


def test_replacing_a_key_counts_its_bytes_once() -> None:
    cache = ByteCache(max_bytes=10)
    cache.put("a", b"123456")
    cache.put("a", b"1234")
    assert cache.size_bytes == 4 and len(cache) == 1
    cache.discard("a")
    assert cache.size_bytes == 0 and cache.get("a") is None


@pytest.mark.parametrize("kwargs", [{"max_bytes": -1}, {"max_bytes": 5, "max_item_bytes": 6}])
def test_bad_bounds_are_value_errors(kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError, match="max_"):
        ByteCache(**kwargs)


def test_threads_never_push_it_past_its_bound() -> None:
    cache = ByteCache(max_bytes=1000)
    errors: list[str] = []

    def work(t: int) -> None:
        for i in range(300):
            cache.put(f"{t}-{i % 37}", bytes(7 + i % 50))
            cache.get(f"{(t + 1) % 4}-{i % 37}")
            if cache.size_bytes > 1000:
                errors.append("over")

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    assert cache.size_bytes == sum(len(cache.get(k) or b"") for k in list(cache._items))
