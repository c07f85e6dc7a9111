"""dataset layer: the DataSource protocol a Loader reads records through, and its TFRecord
implementation :class:`Dataset` (random access over shards)."""

from shardfeed.dataset.data_source import DataSource, DataSourceBase, ReadsAhead, ReadsColumns
from shardfeed.dataset.dataset import Dataset
from shardfeed.dataset.reading import ReadOptions

__all__ = ["DataSource", "DataSourceBase", "Dataset", "ReadOptions", "ReadsAhead", "ReadsColumns"]
