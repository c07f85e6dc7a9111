"""Shuffle-buffer simulation: the orders that streaming loaders produce.

An *order* is a 1-D integer array: ``order[p]`` is the record index emitted at output position
``p`` of one epoch. This module produces the orders of a shuffle buffer, which
:mod:`shardfeed.tools.shuffle_report.stats` then measures against a uniform random permutation:

- :func:`buffer_shuffle_order` — a shuffle buffer over the stored order, the algorithm of
  tf.data's ``Dataset.shuffle(buffer_size)``.
- :func:`file_shuffle_buffer_order` — shard order shuffled first, then a buffer over the
  concatenated shards (tf.data's ``list_files(shuffle=True)`` + ``interleave(cycle_length=1)``
  + ``shuffle``).

What a shuffle buffer does (tf.data's algorithm; DALI and WebDataset use the same kind)::

    stored order:   0 1 2 3 4 5 6 7 8 9 ...
    buffer (B=4):  [0 1 2 3]  pick slot 2 -> emit 2, put 4 in slot 2 -> [0 1 4 3]
                   [0 1 4 3]  pick slot 0 -> emit 0, put 5 in slot 0 -> [5 1 4 3]
                   ...        input exhausted: emit the rest in random order

An element can only leave the buffer after it has entered it, so output position ``p`` holds a
record with index below ``p + B``: over label-sorted data with a buffer much smaller than a
class, the last classes are absent from the whole first part of the epoch.

Where the other loaders differ from this simulation:

- DALI readers (``random_shuffle=True``) fill a buffer of ``initial_fill`` samples (default
  1024) and pick a random one each step: the same algorithm with ``B = initial_fill``; each
  reader shard is buffered separately.
- WebDataset's ``shuffle(bufsize, initial)`` starts emitting once ``initial`` samples (default
  100) are buffered and grows the buffer to ``bufsize`` while emitting, so its first outputs
  come from an even smaller buffer (more bias early in the epoch); shard-level shuffling is
  ``shardshuffle``, as in :func:`file_shuffle_buffer_order`.
- tf.data uses its own random number generator: the simulated order has the same distribution
  as tf.data's, not the same sequence for the same seed.

Determinism: every order here is a function of its arguments and ``(seed, epoch)``; randomness
comes from a Philox generator keyed by a SeedSequence of ``(seed, epoch, purpose)``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

__all__ = [
    "buffer_draws",
    "buffer_shuffle_order",
    "check_count",
    "file_shuffle_buffer_order",
    "simulate_buffer",
]

IntArray = npt.NDArray[np.int64]

# Purpose words of the keyed generators, so the two streams of one (seed, epoch) never overlap.
_PURPOSE_BUFFER = 0x5348_4246  # "SHBF"
_PURPOSE_FILES = 0x5348_464C  # "SHFL"
_PURPOSE_FILES_BUFFER = 0x5346_4246  # "SFBF": the buffer after a shard shuffle draws anew


def check_count(name: str, value: object, *, minimum: int) -> int:
    """``value`` as an int >= ``minimum`` (NumPy integers accepted); TypeError/ValueError naming
    ``name`` otherwise. Shared by the shuffle tools."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def _rng(seed: int, epoch: int, purpose: int) -> np.random.Generator:
    seed = check_count("seed", seed, minimum=0)
    epoch = check_count("epoch", epoch, minimum=0)
    return np.random.Generator(np.random.Philox(np.random.SeedSequence([seed, epoch, purpose])))


def buffer_draws(n: int, buffer_size: int, seed: int, *, epoch: int = 0) -> IntArray:
    """The random slot picks of a shuffle buffer over ``n`` elements, one per output.

    ``draws[t]`` is uniform in ``[0, min(buffer_size, n - t))``: the number of elements held by
    the buffer at output ``t``. Drawn in one vectorised call. Feed them to
    :func:`simulate_buffer`.
    """
    return _draws(n, buffer_size, seed, epoch, _PURPOSE_BUFFER)


def _draws(n: int, buffer_size: int, seed: int, epoch: int, purpose: int) -> IntArray:
    n = check_count("n", n, minimum=0)
    buffer_size = check_count("buffer_size", buffer_size, minimum=1)
    held = np.minimum(buffer_size, n - np.arange(n, dtype=np.int64))
    return _rng(seed, epoch, purpose).integers(0, held, dtype=np.int64)


def simulate_buffer(draws: npt.ArrayLike, buffer_size: int) -> IntArray:
    """The order a shuffle buffer emits, given its slot picks (see :func:`buffer_draws`).

    The buffer holds the first ``B = min(buffer_size, n)`` elements in slots ``0..B-1``. At
    output ``t`` it emits the element in slot ``draws[t]`` and puts the next input element
    (``t + B``) in that slot. Once the input is exhausted it drains: the emitted slot is filled
    with the element of the last slot, and the buffer shrinks by one.

    While input remains, the element in slot ``s`` at output ``t`` is the one written by the
    last earlier output that picked ``s`` (element ``t' + B``), or ``s`` itself if none did; a
    stable sort of the draws by slot finds every such ``t'`` at once. Only the drain (at most
    ``B`` steps) runs as a loop. 1M outputs with ``B = 10,000`` take about 0.04 s; with
    ``B >= n`` (all drain) about 0.6 s.
    """
    r = np.asarray(draws)
    if r.ndim != 1 or (r.size and not np.issubdtype(r.dtype, np.integer)):
        raise TypeError(f"draws must be a 1-D integer array, got shape {r.shape} {r.dtype}")
    r = r.astype(np.int64, copy=False)
    buffer_size = check_count("buffer_size", buffer_size, minimum=1)
    n = int(r.size)
    held = min(buffer_size, n)
    limits = np.minimum(held, n - np.arange(n, dtype=np.int64))
    if n and (r.min() < 0 or np.any(r >= limits)):
        bad = int(np.flatnonzero((r < 0) | (r >= limits))[0])
        raise ValueError(
            f"draws[{bad}] = {int(r[bad])} is outside [0, {int(limits[bad])}): "
            f"use buffer_draws(n, buffer_size, seed) to make valid draws"
        )
    steady = n - held  # outputs after which a new input element enters the buffer
    out = np.empty(n, dtype=np.int64)
    slots = np.arange(held, dtype=np.int64)
    if steady:
        picks = r[:steady]
        # Radix sort when the slot numbers fit 16 bits (the common buffer sizes): ~3x faster.
        keys = picks.astype(np.uint16) if held <= 1 << 16 else picks
        by_slot = np.argsort(keys, kind="stable")
        sorted_slots = picks[by_slot]
        same = sorted_slots[1:] == sorted_slots[:-1]
        previous = np.full(steady, -1, dtype=np.int64)
        previous[by_slot[1:][same]] = by_slot[:-1][same]
        out[:steady] = np.where(previous >= 0, previous + held, picks)
        last = np.ones(steady, dtype=bool)
        last[:-1] = ~same
        slots[sorted_slots[last]] = by_slot[last] + held
    # Drain: plain lists are the fastest form of this short sequential loop.
    remaining = slots.tolist()
    tail = [0] * held
    for i, slot in enumerate(r[steady:].tolist()):
        tail[i] = remaining[slot]
        remaining[slot] = remaining[-1]
        remaining.pop()
    out[steady:] = tail
    return out


def buffer_shuffle_order(n: int, buffer_size: int, seed: int, *, epoch: int = 0) -> IntArray:
    """The order ``Dataset.shuffle(buffer_size)`` produces over ``n`` elements in stored order.

    ``order[p]`` is the stored index emitted at position ``p``. Deterministic in
    ``(n, buffer_size, seed, epoch)``. Memory: a few int64 arrays of length ``n``.
    """
    return simulate_buffer(buffer_draws(n, buffer_size, seed, epoch=epoch), buffer_size)


def file_shuffle_buffer_order(
    shard_sizes: Sequence[int] | npt.ArrayLike, buffer_size: int, seed: int, *, epoch: int = 0
) -> IntArray:
    """Shards read in a shuffled order, one after another, through a shuffle buffer.

    ``shard_sizes[k]`` is the record count of shard ``k``; records are numbered in stored order
    across shards (shard 0 first). This is tf.data's ``list_files(shuffle=True)`` followed by
    ``interleave(TFRecordDataset, cycle_length=1)`` and ``shuffle(buffer_size)``.
    """
    sizes = np.asarray(shard_sizes)
    if sizes.ndim != 1 or (sizes.size and not np.issubdtype(sizes.dtype, np.integer)):
        raise TypeError(f"shard_sizes must be a 1-D sequence of ints, got {shard_sizes!r}")
    if sizes.size and sizes.min() < 0:
        raise ValueError(f"shard_sizes must be >= 0, got {sizes.tolist()}")
    sizes = sizes.astype(np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    shard_order = _rng(seed, epoch, _PURPOSE_FILES).permutation(sizes.size)
    stream = np.concatenate(
        [np.arange(starts[k], starts[k] + sizes[k], dtype=np.int64) for k in shard_order]
        or [np.empty(0, dtype=np.int64)]
    )
    draws = _draws(int(stream.size), buffer_size, seed, epoch, _PURPOSE_FILES_BUFFER)
    return stream[simulate_buffer(draws, buffer_size)]
