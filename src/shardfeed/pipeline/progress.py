"""Where a Loader stands in its stream: the epoch, the positions consumed, the samples replaced.

Updated as each batch is handed out (:meth:`Progress.commit`), so it always describes what
the caller has received; ``consumed`` is global (all ranks together), see
:mod:`shardfeed.pipeline.loader`. Determinism: plain counters. Memory: none.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from shardfeed.errors import TooManyErrorsError

logger = logging.getLogger("shardfeed.pipeline.loader")


@dataclass(slots=True)
class Progress:
    """A loader's counters. ``skip_budget``: bad samples an epoch may replace on this rank."""

    samples_per_epoch: int
    world_size: int
    skip_budget: int
    epoch: int = 0
    consumed: int = 0
    skipped: int = 0
    skipped_total: int = 0
    batches_total: int = 0


    def go_to(self, epoch: int) -> None:
        """The start of ``epoch``; the position is kept if it is the current epoch."""
        if epoch != self.epoch:
            self.epoch, self.consumed, self.skipped = epoch, 0, 0

    def commit(self, count: int, skipped: int, last: bool) -> None:
        """A batch of ``count`` samples handed out (``skipped`` of them replacements); ``last``:
        it ends the epoch. TooManyErrorsError past the epoch's skip budget."""
        self.batches_total += 1 if count else 0
        self.skipped += skipped
        self.skipped_total += skipped
        if skipped:
            self._check_budget(skipped)
        if last:
            self.epoch += 1
            self.consumed = 0
            self.skipped = 0
        else:
            self.consumed = min(self.samples_per_epoch, self.consumed + count * self.world_size)

    def _check_budget(self, skipped: int) -> None:
        budget = self.skip_budget
        logger.warning("replaced %d bad sample(s) in epoch %d (%d this epoch, budget %d)",
                       skipped, self.epoch, self.skipped, budget)
        if self.skipped > budget:
            raise TooManyErrorsError(
                f"{self.skipped} bad samples in epoch {self.epoch}, more than the budget of "
                f"{budget}: check the data with `shardfeed verify`, or raise max_skipped / "
                "max_skipped_fraction"
            )
