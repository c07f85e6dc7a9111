"""The decoded-image cache: one load per key under contention, byte bound, eviction order,
failed loads not cached, pickled copies empty."""

from __future__ import annotations

import pickle
import threading
import time
from collections.abc import Callable

import numpy as np
import pytest

from shardfeed.pipeline.image_cache import ImageCache


def loader(value: int, nbytes: int = 100,
           calls: list[int] | None = None) -> Callable[[], tuple[int, int]]:
    def load() -> tuple[int, int]:
        if calls is not None:
            calls.append(value)
        return value, nbytes

    return load


def test_hit_after_load_and_counters() -> None:
    cache: ImageCache[int] = ImageCache(max_bytes=1000)
    calls: list[int] = []
    assert cache.get(1, loader(10, calls=calls), expires=(0, 5), now=(0, 0)) == 10
    assert cache.get(1, loader(99, calls=calls), expires=(0, 5), now=(0, 1)) == 10
    stats = cache.stats()
    assert calls == [10] and stats.loads == 1 and stats.hits == 1 and stats.bytes == 100
    assert 1 in cache and len(cache) == 1


def test_threads_asking_for_one_key_share_one_load() -> None:
    cache: ImageCache[int] = ImageCache(max_bytes=10_000)
    started = threading.Event()
    release = threading.Event()
    calls: list[int] = []

    def slow() -> tuple[int, int]:
        calls.append(1)
        started.set()
        release.wait(5)
        return 7, 10

    results: list[int] = []
    threads = [threading.Thread(target=lambda: results.append(
        cache.get("k", slow, expires=(0, 9), now=(0, 0)))) for _ in range(6)]
    threads[0].start()
    started.wait(5)
    for t in threads[1:]:
        t.start()
    time.sleep(0.05)  # let the others queue on the pending load
    release.set()
    for t in threads:
        t.join(5)
    assert results == [7] * 6 and calls == [1]
    assert cache.stats().loads == 1 and cache.stats().hits == 5


def test_failed_load_is_not_cached_and_waiters_load_themselves() -> None:
    cache: ImageCache[int] = ImageCache(max_bytes=1000)
    attempts: list[int] = []

    def bad() -> tuple[int, int]:
        attempts.append(1)
        raise ValueError("cannot decode")

    for _ in range(2):
        with pytest.raises(ValueError, match="cannot decode"):
            cache.get(3, bad, expires=(0, 1), now=(0, 0))
    assert len(attempts) == 2 and 3 not in cache
    assert cache.get(3, loader(4), expires=(0, 1), now=(0, 0)) == 4


def test_never_exceeds_the_byte_bound_and_evicts_expired_first() -> None:
    cache: ImageCache[int] = ImageCache(max_bytes=300)
    cache.get("a", loader(1), expires=(0, 10), now=(0, 0))
    cache.get("b", loader(2), expires=(0, 3), now=(0, 1))
    cache.get("c", loader(3), expires=(0, 20), now=(0, 2))
    cache.get("a", loader(1), expires=(0, 10), now=(0, 4))  # clock 4: "b" has expired
    cache.get("d", loader(4), expires=(0, 30), now=(0, 5))  # needs room: "b" goes, not "a"
    assert "b" not in cache and {"a", "c", "d"} <= {k for k in "acd" if k in cache}
    cache.get("e", loader(5), expires=(0, 40), now=(0, 6))  # nothing expired: LRU ("c")
    assert "c" not in cache and "a" in cache
    stats = cache.stats()
    assert stats.peak_bytes <= 300 and stats.evictions == 2 and stats.entries == 3


def test_among_expired_the_oldest_residency_goes_first() -> None:
    cache: ImageCache[int] = ImageCache(max_bytes=200)
    cache.get("late", loader(1), expires=(0, 8), now=(0, 0))
    cache.get("early", loader(2), expires=(0, 2), now=(0, 1))
    cache.get("early", loader(2), expires=(0, 2), now=(0, 2))  # used last, expired first
    cache.get("new", loader(3), expires=(0, 30), now=(0, 9))
    assert "early" not in cache and "late" in cache


def test_values_larger_than_the_bound_are_returned_not_kept() -> None:
    cache: ImageCache[int] = ImageCache(max_bytes=50)
    assert cache.get(1, loader(1, nbytes=80), expires=(0, 1), now=(0, 0)) == 1
    assert len(cache) == 0 and cache.stats().uncached == 1


def test_bound_derived_from_the_first_value() -> None:
    cache: ImageCache[np.ndarray] = ImageCache(default_images=3)
    assert cache.max_bytes is None
    image = np.zeros((4, 5, 3), np.uint8)
    for key in range(6):
        cache.get(key, lambda: (image, image.nbytes), expires=(0, key), now=(0, key))
    assert cache.max_bytes == 3 * image.nbytes and len(cache) == 3


def test_pickled_copy_is_empty_with_the_same_bound() -> None:
    cache: ImageCache[int] = ImageCache(max_bytes=500)
    cache.get(1, loader(1), expires=(0, 1), now=(0, 0))
    copy = pickle.loads(pickle.dumps(cache))
    assert len(copy) == 0 and copy.max_bytes == 500 and copy.stats().loads == 0


@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_bad_bound(bad: object) -> None:
    with pytest.raises(ValueError):
        ImageCache(max_bytes=bad)  # type: ignore[arg-type]


def test_get_many_is_get_called_in_order() -> None:
    """A slice's lookups in one call: the values, loads, hits, evictions and what stays
    cached are those of ``get`` called for each key in turn."""
    rng = np.random.default_rng(5)
    for _ in range(30):
        keys = rng.integers(0, 9, 40).tolist()
        expires = [(0, int(e)) for e in rng.integers(0, 60, 40)]
        now = [(0, k) for k in range(40)]
        one: ImageCache[int] = ImageCache(max_bytes=450)
        many: ImageCache[int] = ImageCache(max_bytes=450)
        calls_one: list[int] = []
        calls_many: list[int] = []
        for start in range(0, 40, 10):  # four slices
            got = [one.get(keys[i], loader(keys[i] * 10, calls=calls_one),
                           expires=expires[i], now=now[i]) for i in range(start, start + 10)]
            assert many.get_many(
                keys[start:start + 10],
                lambda row, s=start, k=keys, c=calls_many: loader(k[s + row] * 10, calls=c),
                expires=expires[start:start + 10], now=now[start:start + 10]) == got
        assert calls_many == calls_one and many.stats() == one.stats()
        assert [(k, e.expires) for k, e in many._entries.items()] == [
            (k, e.expires) for k, e in one._entries.items()]


def test_get_many_of_cached_keys_is_get_called_in_order() -> None:
    """Every key cached (a slice's usual case, one run of hits): the values, hits, the order
    of use, the expiries, the clock, and so which entries later loads evict, are those of
    ``get`` called for each key in turn, keys asked twice and expiries extended, kept or
    shortened among them."""
    rng = np.random.default_rng(11)
    for _ in range(40):
        one: ImageCache[int] = ImageCache(max_bytes=1200)
        many: ImageCache[int] = ImageCache(max_bytes=1200)
        for key in range(12):  # all cached
            first = (0, int(rng.integers(0, 30)))
            for cache in (one, many):
                cache.get(key, loader(key * 10), expires=first, now=(0, 0))
        for start in range(4):  # four slices of cached keys, some twice
            keys = rng.integers(0, 12, 8).tolist()
            expires = [(0, int(e)) for e in rng.integers(0, 60, 8)]
            now = [(0, int(t)) for t in rng.integers(0, 40, 8)]  # some behind the clock
            uses = rng.integers(1, 4, 8).tolist() if start % 2 else None
            got = []
            for i, key in enumerate(keys):
                for _ in range(1 if uses is None else uses[i]):
                    value = one.get(key, loader(-1), expires=expires[i], now=now[i])
                got.append(value)
            assert many.get_many(keys, lambda row: loader(-1), expires=expires, now=now,
                                 uses=uses) == got
            assert many.stats() == one.stats() and many._clock == one._clock
            assert [(k, e.expires) for k, e in many._entries.items()] == [
                (k, e.expires) for k, e in one._entries.items()]
        # the next loads evict the same entries (the expiry index agrees)
        for key in range(12, 20):
            for cache in (one, many):
                cache.get(key, loader(key * 10), expires=(0, 90), now=(0, 50 + key))
            assert list(many._entries) == list(one._entries)


def test_a_key_asked_for_once_for_its_uses_is_the_key_repeated() -> None:
    """A slice's images, each asked for once with the number of its outputs: the values,
    loads, hits, evictions and what stays cached are those of each key asked for that many
    times in a row; a value too large for the bound is loaded once for all of them."""
    rng = np.random.default_rng(8)
    for _ in range(30):
        keys = list(dict.fromkeys(rng.integers(0, 9, 12).tolist()))
        uses = rng.integers(1, 5, len(keys)).tolist()
        expires = [(0, int(e)) for e in rng.integers(0, 60, len(keys))]
        now = [(0, 3 * k) for k in range(len(keys))]
        once: ImageCache[int] = ImageCache(max_bytes=450)
        repeated: ImageCache[int] = ImageCache(max_bytes=450)
        calls_once: list[int] = []
        calls_repeated: list[int] = []
        rows = [i for i, u in enumerate(uses) for _ in range(u)]
        want = repeated.get_many(
            [keys[i] for i in rows],
            lambda row, k=keys, r=rows, c=calls_repeated: loader(k[r[row]] * 10, calls=c),
            expires=[expires[i] for i in rows], now=[now[i] for i in rows])
        got = once.get_many(keys, lambda j, k=keys, c=calls_once: loader(k[j] * 10, calls=c),
                            expires=expires, now=now, uses=uses)
        assert [got[i] for i in rows] == want
        assert calls_once == calls_repeated and once.stats() == repeated.stats()
        assert [(k, e.expires) for k, e in once._entries.items()] == [
            (k, e.expires) for k, e in repeated._entries.items()]
    large: ImageCache[int] = ImageCache(max_bytes=50)
    calls: list[int] = []
    assert large.get_many([1], lambda j: loader(10, calls=calls), expires=[(0, 9)],
                          now=[(0, 0)], uses=[4]) == [10]
    assert calls == [10] and large.stats().uncached == 1 and large.stats().hits == 0


def test_get_many_stops_at_a_failed_load_as_the_loop_would() -> None:
    cache: ImageCache[int] = ImageCache(max_bytes=1000)
    cache.get(1, loader(10), expires=(0, 9), now=(0, 0))

    def load_of(row: int) -> Callable[[], tuple[int, int]]:
        if row == 1:
            def broken() -> tuple[int, int]:
                raise ValueError("damaged")
            return broken
        return loader([1, 2, 3][row] * 10)

    with pytest.raises(ValueError, match="damaged"):
        cache.get_many([1, 2, 3], load_of, expires=[(0, 9)] * 3, now=[(0, 1), (0, 2), (0, 3)])
    stats = cache.stats()
    assert stats.hits == 1 and stats.loads == 1 and 2 not in cache and 3 not in cache
    assert cache.get(2, loader(20), expires=(0, 9), now=(0, 4)) == 20  # nothing left pending


def test_a_new_pass_takes_the_last_passs_entries_for_expired_until_it_uses_them() -> None:
    """rewind(): the clock starts again (an epoch read again) and the last pass's entries
    go first, before the new pass's own, expired or not, unless the new pass uses them."""
    cache: ImageCache[int] = ImageCache(max_bytes=300)
    for key in (1, 2, 3):  # the last pass's, live to its end
        cache.get(key, loader(key), expires=(0, 100), now=(0, 90 + key))
    cache.rewind()
    assert cache.get(2, loader(2), expires=(0, 60), now=(0, 0)) == 2  # used again: live
    cache.get(4, loader(4), expires=(0, 5), now=(0, 1))  # pushes out 1, a leftover
    assert 1 not in cache and {2, 3, 4} <= set(cache._entries)
    cache.get(5, loader(5), expires=(0, 50), now=(0, 10))  # 4 expired at 5: 3 goes first
    assert 3 not in cache and {2, 4, 5} == set(cache._entries)


class _LookAtEvery(ImageCache[int]):
    """The victim found by looking at every entry (the rule the expiry index must keep)."""

    def _victim(self) -> object:
        victim, oldest = None, self._clock
        for key, entry in self._entries.items():
            if entry.expires < oldest:
                victim, oldest = key, entry.expires
        return next(iter(self._entries)) if victim is None else victim


def test_the_expiry_index_evicts_what_a_look_at_every_entry_evicts() -> None:
    """Random lookups (one at a time and a slice's), expiries that grow on a hit, ties of
    expiry, new passes and clears: the same loads, hits, evictions and entries, in the same
    order, as a cache that looks at every entry for its victim."""
    rng = np.random.default_rng(11)
    for trial in range(60):
        bound = int(rng.integers(2, 9)) * 100
        ours: ImageCache[int] = ImageCache(max_bytes=bound)
        oracle = _LookAtEvery(max_bytes=bound)
        calls_ours: list[int] = []
        calls_oracle: list[int] = []
        position = 0
        for _ in range(120):
            step = rng.random()
            if step < 0.03:
                ours.rewind()
                oracle.rewind()
                position = 0
                continue
            if step < 0.04:
                ours.clear()
                oracle.clear()
                continue
            position += int(rng.integers(0, 3))
            count = 1 if step < 0.6 else int(rng.integers(2, 6))
            keys = rng.integers(0, 14, count).tolist()
            # few distinct expiries, so that several entries share the earliest
            expires = [(0, position + int(rng.integers(0, 4)) * 5) for _ in keys]
            now = [(0, position)] * count
            sizes = rng.integers(1, 3, count).tolist()
            if count == 1:
                got = [cache.get(keys[0], loader(keys[0], 100 * sizes[0], calls=calls),
                                 expires=expires[0], now=now[0])
                       for cache, calls in ((ours, calls_ours), (oracle, calls_oracle))]
            else:
                got = [cache.get_many(
                    keys, lambda i, c=calls, k=keys, s=sizes: loader(k[i], 100 * s[i], calls=c),
                    expires=expires, now=now)
                       for cache, calls in ((ours, calls_ours), (oracle, calls_oracle))]
            assert got[0] == got[1], trial
            assert calls_ours == calls_oracle, trial
            assert ours.stats() == oracle.stats(), trial
            assert [(k, e.expires) for k, e in ours._entries.items()] == [
                (k, e.expires) for k, e in oracle._entries.items()], trial


def test_a_key_loaded_again_during_a_clear_is_one_entry_with_its_last_expiry() -> None:
    """A load ahead that ends after a clear() and a load of the same key meanwhile replaces
    that entry: its bytes counted once (counted twice, the cache held one image fewer for
    good), and evictions find each entry once, by the expiry it has now."""
    cache: ImageCache[int] = ImageCache(max_bytes=300)
    deferred: list[Callable[[], object]] = []
    assert cache.load_ahead("a", loader(1), expires=(0, 5), run=deferred.append)
    cache.clear()  # the load ahead is forgotten, still running
    cache.get("a", loader(1), expires=(0, 9), now=(0, 0))  # loaded again, kept
    deferred[0]()  # the first load ends: its entry replaces the second's
    assert [(k, e.expires) for k, e in cache._entries.items()] == [("a", (0, 5))]
    for t, key in enumerate("bcdefg"):  # expired "a" goes first, then the oldest expired
        cache.get(key, loader(t), expires=(0, 10 + 2 * t), now=(0, 6 + 2 * t))
    assert "a" not in cache and len(cache) == 3
    assert cache.stats().evictions == 4
