"""dataset layer: random access over shards (:class:`Dataset`)."""

from shardfeed.dataset.dataset import Dataset
from shardfeed.dataset.reading import ReadOptions

__all__ = ["Dataset", "ReadOptions"]
