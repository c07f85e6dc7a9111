"""The patch schedule: which images are cached, and which one each patch output comes from.

Many small crops from few large images: a cache of ``N`` decoded images; every ``R`` outputs
the oldest image is replaced by the next one of the epoch's (shuffled) image order. That
process has a closed form, so the cache never has to be simulated::

    image order positions   0  1  2  3  4  5  6       M = 7 images, N = 3 slots, R = 2
    outputs 0, 1          [ 0  1  2 ]                 L(p) = N + p // R
    outputs 2, 3             [ 1  2  3 ]              resident at output p:
    outputs 4, 5                [ 2  3  4 ]             order positions [L(p) - N, L(p))
    ...
    outputs 8, 9                         [ 4  5  6 ]  last window: (M - N + 1)·R = 10 outputs

Output ``p`` picks one resident order position (and its own crop); which image that is comes
from ``EpochOrder(M)``. An order position ``q`` is resident for ``N·R`` consecutive outputs
(fewer at the two edges of the epoch: the first ``N - 1`` and last ``N - 1`` images), so each
interior image is used ``R`` times on average. ``pick="stratified"`` (the default,
:meth:`PatchSchedule.order_positions`) deals the ``N`` slots out as a keyed permutation per
block of ``N`` consecutive outputs, so a batch of ``B <= N`` consecutive outputs draws on
(nearly) ``B`` different images; ``pick="uniform"`` (:meth:`PatchSchedule.pick_many`) draws
each slot on its own, and a batch then draws on about ``N·(1 - (1 - 1/N)^B)`` distinct images
(e.g. 25 of N=64 for B=32). Either way each output's slot is uniform over the resident images.
The decoded-image cache of a loader is then only a performance device: it may hold any
superset of the window, be shared by threads, or be dropped, without changing an output.

A per-image patch budget (a hard cap on uses per image) is not provided: uses are random
with mean ``R`` for interior images.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Literal, get_args

import numpy as np
import numpy.typing as npt

from shardfeed.sampling._checks import as_index_array, as_int
from shardfeed.sampling.crop_draws import compiled_slot_orders
from shardfeed.sampling.keys import PATCH_SLOT, position_keys, uniform_many

__all__ = ["PICKS", "SLOT_DRAW", "PatchSchedule", "Pick", "block_permutations",
           "compiled_slot_orders_agree"]

Pick = Literal["stratified", "uniform"]
PICKS: tuple[Pick, ...] = get_args(Pick)

IntArray = npt.NDArray[np.int64]


class PatchSchedule:
    """The closed-form cache schedule for one epoch of patch outputs over ``num_images`` images.

    ``cache_images`` (N) is clipped to ``num_images`` (M); ``refresh_every`` (R) is the number
    of outputs between two replacements. ``len`` = outputs per epoch = ``(M - N + 1)·R`` (0
    when M = 0).

    Determinism: pure arithmetic; :meth:`pick` / :meth:`pick_many` are deterministic given the
    uniform draws (key them with ``keys.sample_rng`` / ``keys.uniform_many`` and the purpose
    ``PATCH_SLOT``); :meth:`order_positions` draws them itself, keyed by ``(seed, epoch)``.
    State: the slot draws' keys of the last ``(seed, epoch)`` asked for; the slot permutations
    drawn lately are kept for the process (:func:`block_permutations`: at most 256 blocks,
    ``8·N`` bytes each, shared by every schedule). Memory: that store; a loader's cache needs
    ``max_resident`` images.
    """

    __slots__ = ("_slot_keys", "cache_images", "num_images", "refresh_every")

    def __init__(self, num_images: int, *, cache_images: int, refresh_every: int) -> None:
        num_images = as_int(num_images, "num_images")
        cache_images = as_int(cache_images, "cache_images")
        refresh_every = as_int(refresh_every, "refresh_every")
        if num_images < 0:
            raise ValueError(f"num_images must be >= 0, got {num_images}")
        if cache_images < 1:
            raise ValueError(f"cache_images must be >= 1 (decoded images held at once), got "
                             f"{cache_images}")
        if refresh_every < 1:
            raise ValueError(f"refresh_every must be >= 1 (outputs between two image "
                             f"replacements), got {refresh_every}")
        self.num_images = num_images
        self.cache_images = min(cache_images, num_images)
        self.refresh_every = refresh_every
        # the slot draws' keys of the last (seed, epoch) asked for (made in Python: ~4 µs)
        self._slot_keys: tuple[int, int, tuple[int, int]] | None = None

    @property
    def max_resident(self) -> int:
        """The most images resident at once (N clipped to M): the cache size a loader needs."""
        return self.cache_images

    def __len__(self) -> int:
        if self.num_images == 0:
            return 0
        return (self.num_images - self.cache_images + 1) * self.refresh_every

    def __repr__(self) -> str:
        return (f"PatchSchedule({self.num_images}, cache_images={self.cache_images}, "
                f"refresh_every={self.refresh_every})")

    def window(self, p: int) -> tuple[int, int]:
        """Order positions ``[lo, hi)`` resident at output ``p`` (``hi - lo == N``)."""
        p = self._check_output(p)
        hi = self.cache_images + p // self.refresh_every
        return hi - self.cache_images, hi

    def windows_many(self, ps: npt.ArrayLike) -> tuple[IntArray, IntArray]:
        """:meth:`window` for many outputs: arrays ``lo`` and ``hi``."""
        outputs = self._check_outputs(ps)
        hi = self.cache_images + outputs // self.refresh_every
        return hi - self.cache_images, hi

    def pick(self, p: int, rng: np.random.Generator) -> int:
        """The order position output ``p`` is cut from: uniform over the resident positions.

        Draws one ``rng.random()``; equal to ``pick_many([p], [u])`` for that draw ``u``.
        """
        lo, _ = self.window(p)
        return lo + min(int(rng.random() * self.cache_images), self.cache_images - 1)

    def pick_many(self, ps: npt.ArrayLike, uniforms: npt.ArrayLike) -> IntArray:
        """Vectorised :meth:`pick` from one uniform in ``[0, 1)`` per output.

        E.g. ``pick_many(ps, keys.uniform_many(seed, epoch, ps, keys.PATCH_SLOT))``.
        """
        lo, _ = self.windows_many(ps)
        u = np.asarray(uniforms, dtype=np.float64)
        if u.shape != lo.shape:
            raise ValueError(f"uniforms must have one value per output: got shape {u.shape} "
                             f"for {lo.shape} outputs")
        if u.size and (float(u.min()) < 0.0 or float(u.max()) >= 1.0):
            raise ValueError("uniforms must lie in [0, 1); draw them with keys.uniform_many "
                             "or Generator.random")
        slot = np.minimum((u * self.cache_images).astype(np.int64), self.cache_images - 1)
        return lo + slot

    def order_positions(self, seed: int, epoch: int, ps: npt.ArrayLike, *,
                        pick: Pick = "stratified") -> IntArray:
        """The order position ``q`` (an index into the epoch's image order) of each output:
        ``pick="stratified"`` deals the ``N`` slots out as a keyed permutation per block of
        ``N`` consecutive outputs (:func:`block_permutations`); ``"uniform"`` draws each
        slot on its own (:meth:`pick_many` of ``uniform_many(..., PATCH_SLOT)``).

        The stratified permutations of a run of outputs in order (never decreasing, at least
        ``N`` of them: a Patches slice's) are made by one compiled call without the GIL where
        this build's agree with :func:`block_permutations` (:func:`compiled_slot_orders_agree`):
        on 2 cores, 256 outputs of 64 slots take ~10 µs there, most of it without the GIL,
        against ~12 µs (blocks drawn before) to ~42 µs (new blocks) through NumPy, all of it
        under the GIL; a Patches loader asks twice a slice (its outputs, those it looks
        ahead to). Other outputs go through NumPy, which keeps blocks across calls (a call
        makes each of its blocks anew: for fewer outputs than ``N``, or outputs out of
        order, that is slower)."""
        _check_pick(pick)
        ps = np.asarray(ps, dtype=np.int64)
        n = self.cache_images
        if (pick == "stratified" and ps.ndim == 1 and 0 < n <= len(ps)
                and compiled_slot_orders_agree()):
            kept = self._slot_keys  # one read: another thread may replace it meanwhile
            if kept is None or kept[0] != seed or kept[1] != epoch:
                kept = self._slot_keys = (seed, epoch,
                                          position_keys(seed, epoch, PATCH_SLOT, SLOT_DRAW))
            q = compiled_slot_orders(kept[2], n, self.refresh_every, len(self), ps)
            if isinstance(q, np.ndarray):
                return q
            # an output out of range (raised below, as NumPy's path names it) or out of order
        ps = self._check_outputs(ps)
        if pick == "uniform":
            return self.pick_many(ps, uniform_many(seed, epoch, ps, PATCH_SLOT))
        return self._stratified(seed, epoch, ps)

    def _stratified(self, seed: int, epoch: int, ps: IntArray) -> IntArray:
        """:meth:`order_positions` with ``pick="stratified"`` through NumPy."""
        lo, _ = self.windows_many(ps)
        n = self.cache_images
        if not len(ps):
            return lo
        blocks = ps // n
        first, last = int(blocks.min()), int(blocks.max())
        if last - first < len(ps):  # a run of outputs: its blocks' permutations end to end
            run = np.concatenate(block_permutations(seed, epoch, range(first, last + 1), n))
            lo += run[ps - first * n]  # lo is a new array
            return lo
        within = ps - blocks * n
        slots = np.empty_like(ps)
        unique = np.unique(blocks).tolist()
        for block, perm in zip(unique, block_permutations(seed, epoch, unique, n)):
            chosen = blocks == block
            slots[chosen] = perm[within[chosen]]
        lo += slots
        return lo

    def order_position(self, seed: int, epoch: int, p: int, *,
                       pick: Pick = "stratified") -> int:
        """:meth:`order_positions` of one output, in plain integers (once a patch, on the
        sample path)."""
        _check_pick(pick)
        p = self._check_output(p)
        if pick == "uniform":
            return int(self.order_positions(seed, epoch, np.array([p]), pick=pick)[0])
        n = self.cache_images
        block, within = divmod(p, n)
        slot = int(block_permutations(seed, epoch, (block,), n)[0][within])
        return p // self.refresh_every + slot

    def first_output(self, q: int) -> int:
        """The first output at which order position ``q`` is resident."""
        first, _ = self.resident_spans(np.array([self._check_position(q)]))
        return int(first[0])

    def last_output(self, q: int) -> int:
        """The last output at which order position ``q`` is resident (drop the image after it):
        :meth:`resident_spans`' last, in plain integers (a loader asks once an image it
        decodes)."""
        q = self._check_position(q)
        return min((q + 1) * self.refresh_every, len(self)) - 1

    def resident_spans(self, qs: npt.ArrayLike) -> tuple[IntArray, IntArray]:
        """First and last (inclusive) output at which each order position is resident.

        ``last - first + 1`` is ``N·R`` except for the first and last ``N - 1`` positions.
        """
        q = as_index_array(qs, self.num_images, "order position")
        n, r = self.cache_images, self.refresh_every
        first = np.maximum(q - n + 1, 0) * r
        last = np.minimum((q + 1) * r, len(self)) - 1
        return first, last

    def expected_uses(self, q: int) -> float:
        """Mean number of outputs cut from order position ``q`` in an epoch (``R`` if interior)."""
        first, last = self.resident_spans(np.array([self._check_position(q)]))
        return float(last[0] - first[0] + 1) / self.cache_images

    def _check_position(self, q: int) -> int:
        q = as_int(q, "order position")
        if not 0 <= q < self.num_images:
            raise IndexError(f"order position {q} out of range for {self.num_images} images")
        return q

    def _check_output(self, p: int) -> int:
        p = as_int(p, "output")
        if not 0 <= p < len(self):
            raise IndexError(f"output {p} out of range for an epoch of {len(self)} outputs")
        return p

    def _check_outputs(self, ps: npt.ArrayLike) -> IntArray:
        return as_index_array(ps, len(self), "output")


SLOT_DRAW = 1
"""The draw (of :data:`~shardfeed.sampling.keys.PATCH_SLOT`) the stratified permutations
sort (draw 0 is ``pick="uniform"``'s)."""

_PERMUTATIONS: dict[tuple[int, int, int, int], IntArray] = {}
"""Block permutations drawn lately, oldest first (no lock: a dict's one operations hold
under the GIL, and a block another thread drops meanwhile is drawn again)."""
_PERMUTATIONS_KEPT = 256  # blocks: a slice of outputs spans a few


def _check_pick(pick: str) -> None:
    if pick not in PICKS:
        raise ValueError(f"pick must be one of {PICKS}, got {pick!r}")


def block_permutations(seed: int, epoch: int, blocks: Sequence[int], n: int) -> list[IntArray]:
    """The keyed permutation of the ``n`` slots in each block of outputs of ``blocks``
    (read-only arrays), those not kept from earlier calls drawn in one call (a slice's new
    blocks: one hash and one sort for them all, not one each)."""
    kept = [_PERMUTATIONS.get((seed, epoch, n, block)) for block in blocks]
    missing = [block for block, perm in zip(blocks, kept) if perm is None]
    if not missing:
        return kept  # type: ignore[return-value]
    positions = (np.asarray(missing, dtype=np.int64)[:, None] * n
                 + np.arange(n, dtype=np.int64)).ravel()
    draws = uniform_many(seed, epoch, positions, PATCH_SLOT, draw=SLOT_DRAW).reshape(
        len(missing), n)
    perms = np.argsort(draws, axis=1, kind="stable")
    perms.flags.writeable = False
    made = dict(zip(missing, perms))
    for block, perm in made.items():
        _PERMUTATIONS[(seed, epoch, n, block)] = perm
    while len(_PERMUTATIONS) > _PERMUTATIONS_KEPT:
        try:
            del _PERMUTATIONS[next(iter(_PERMUTATIONS))]
        except (KeyError, RuntimeError, StopIteration):  # another thread's meanwhile
            break
    return [made[block] if perm is None else perm for block, perm in zip(blocks, kept)]


@functools.cache
def compiled_slot_orders_agree() -> bool:
    """Whether the compiled stratified order positions
    (:func:`~shardfeed.sampling.crop_draws.compiled_slot_orders`) equal NumPy's
    (:func:`block_permutations`) on this build: checked once a process on schedules of 1,
    3, 64 and 1,000 slots, at runs of outputs, strides and sorted draws, large seeds and
    epochs among them (outputs in no order: refused). Where they differ (or the module was
    not compiled), NumPy's are used."""
    rng = np.random.Generator(np.random.Philox(17))
    for n, r in ((1, 1), (3, 2), (64, 100), (1000, 7)):
        schedule = PatchSchedule(n + 40, cache_images=n, refresh_every=r)
        end = len(schedule)
        for ps, in_order in ((np.arange(end, dtype=np.int64), True),
                             (np.arange(5, end, 3, dtype=np.int64), True),
                             (np.sort(rng.integers(0, end, 300)), True),
                             (rng.integers(0, end, 300), False)):
            for seed, epoch in ((0, 0), (2**64 - 1, 3), (12345, 2**40)):
                got = compiled_slot_orders(position_keys(seed, epoch, PATCH_SLOT, SLOT_DRAW),
                                           n, r, end, ps)
                want = schedule._stratified(seed, epoch, ps)
                if in_order and (not isinstance(got, np.ndarray)
                                 or not np.array_equal(got, want)):
                    return False
                if not in_order and got != -1:  # refused: NumPy's path takes them
                    return False
    _PERMUTATIONS.clear()  # the check's blocks: none a loader will ask for
    return True
