"""``bench``: how fast a Loader feeds batches from your dataset, next to the decode limit.

:func:`bench` builds the pipeline a training job would use (a preset transform over records,
windows of frames, or cached patches), then:

1. times the first batch (start-up: opening, first reads, first decodes);
2. runs a warm-up, then measures for ``seconds``: samples/s (frames/s for windows, patches/s
   for patches), output megapixels/s, source megapixels/s, MB/s read (the bytes of the
   records read: memory-mapped shards are invisible to the OS read counter; see
   :mod:`shardfeed.tools.bench.measure`), and a throughput timeline; a background thread samples resident memory, whose growth is set
   against the Loader's stated bound (``loader.memory_bound_bytes``);
3. closes the Loader and measures the decode limit of the same files in the same run: full
   decodes of the same encoded images on the same number of threads (see
   :mod:`shardfeed.tools.bench.probe`), and the ratio of the pipeline to it.

A ratio above 1 is possible and expected for the train preset: its crop-aware decode decodes
at a reduced DCT scale whenever the crop allows.

Determinism: the samples are the Loader's (keyed by the seed); the figures are timings.
State: none. Memory: the Loader's bound, plus up to 256 MB of encoded bytes for the decode
limit (held only after the Loader is closed).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, get_args

from shardfeed.tools.bench.measure import (
    measure,
    memory_figures,
    rate_figures,
    setup_figures,
    stage_figures,
)
from shardfeed.tools.bench.probe import RssSampler, decode_limit, sample_encoded
from shardfeed.transforms.decode.sizes import DEFAULT_MAX_PIXELS

__all__ = ["BenchOptions", "bench"]

Preset = Literal["train", "eval"]
PRESETS: tuple[Preset, ...] = get_args(Preset)


def _check_int(name: str, value: object, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


def _check_seconds(name: str, value: object, *, minimum: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= minimum:
        raise ValueError(f"{name} must be a number of seconds >= {minimum}, got {value!r}")


#: Decoded images in the patch cache when ``cache_images`` is not given (fewer on a smaller
#: dataset: a cache never holds more images than there are).
DEFAULT_CACHE_IMAGES = 64


@dataclass(kw_only=True, frozen=True, slots=True)
class BenchOptions:
    """What to measure. ``windows`` (a frame count) and ``patches`` (a crop size) exclude each
    other; ``stride`` belongs to windows, ``cache_images`` / ``refresh_every`` to patches
    (``cache_images=None``: 64, or every image of a smaller dataset).
    ``warmup_seconds`` defaults to ``min(5, seconds / 5)``, ``decode_seconds`` to
    ``max(1, seconds / 4)``. ``max_pixels`` goes to the decode (the preset, or Patches): the
    largest image allowed, and what the stated memory bound counts a thread for decoding."""

    preset: Preset = "train"
    size: int = 224
    batch_size: int = 256
    num_threads: int = 4
    windows: int | None = None
    stride: int = 1
    patches: int | None = None
    cache_images: int | None = None
    refresh_every: int = 100
    seconds: float = 30.0
    warmup_seconds: float | None = None
    decode_seconds: float | None = None
    seed: int = 0
    max_pixels: int = DEFAULT_MAX_PIXELS

    def __post_init__(self) -> None:
        if self.preset not in PRESETS:
            raise ValueError(f"preset must be one of {PRESETS}, got {self.preset!r}")
        for name in ("size", "batch_size", "num_threads", "stride", "refresh_every"):
            _check_int(name, getattr(self, name), minimum=1)
        if self.cache_images is not None:
            _check_int("cache_images", self.cache_images, minimum=1)
        _check_int("seed", self.seed, minimum=0)
        _check_int("max_pixels", self.max_pixels, minimum=1)
        if self.windows is not None:
            _check_int("windows", self.windows, minimum=1)
        if self.patches is not None:
            _check_int("patches", self.patches, minimum=1)
        if self.windows is not None and self.patches is not None:
            raise ValueError("windows and patches exclude each other: bench one source at a time")
        _check_seconds("seconds", self.seconds, minimum=0.1)
        if self.warmup_seconds is not None:
            _check_seconds("warmup_seconds", self.warmup_seconds, minimum=0.0)
        if self.decode_seconds is not None:
            _check_seconds("decode_seconds", self.decode_seconds, minimum=0.1)

    @property
    def kind(self) -> str:
        return "windows" if self.windows else "patches" if self.patches else "records"

    @property
    def warmup(self) -> float:
        return self.warmup_seconds if self.warmup_seconds is not None else min(5.0, self.seconds / 5)

    @property
    def decode(self) -> float:
        return self.decode_seconds if self.decode_seconds is not None else max(1.0, self.seconds / 4)


def _transform(options: BenchOptions) -> Any:
    from shardfeed.transforms import presets

    if options.preset == "train":
        return presets.train(size=options.size, max_pixels=options.max_pixels)
    return presets.eval(size=options.size, max_pixels=options.max_pixels)


def _source(dataset: Any, options: BenchOptions) -> tuple[Any, Any]:
    """The Loader's source and transform for ``options``."""
    if options.windows is not None:
        from shardfeed.pipeline import Windows

        return Windows(dataset, length=options.windows, stride=options.stride), _transform(options)
    if options.patches is not None:
        from shardfeed.pipeline import Patches

        cache = options.cache_images or min(DEFAULT_CACHE_IMAGES, len(dataset))
        source = Patches(dataset, size=options.patches, cache_images=cache,
                         refresh_every=options.refresh_every, max_pixels=options.max_pixels)
        return source, None
    return dataset, _transform(options)


def bench(
    path_or_dataset: Any,
    *,
    options: BenchOptions | None = None,
    progress: bool = False,
    plot: str | os.PathLike[str] | None = None,
    allow_outside_paths: bool = False,
    **option_values: Any,
) -> dict[str, Any]:
    """Measure a Loader over ``path_or_dataset`` (a dataset path or an open Dataset).

    Options come as a :class:`BenchOptions` or as its fields by keyword (``preset``,
    ``size``, ``batch_size``, ``num_threads``, ``windows``, ``stride``, ``patches``,
    ``cache_images``, ``refresh_every``, ``seconds``, ...). ``progress`` draws a live tqdm bar
    on stderr; ``plot`` writes throughput over time as a PNG. ``allow_outside_paths``: open
    a dataset path as ``Dataset(path, allow_outside_paths=True)``.

    Returns a JSON-able dict: ``kind``, ``samples_per_s``, ``images_per_s``,
    ``frames_per_s`` (windows), ``patches_per_s`` (patches), ``output_mpix_per_s``,
    ``source_mpix_per_s``, ``read_mb_per_s`` (with ``read_counted``: ``"records"`` or
    ``"os"``, ``read_note`` when it is None, ``records_read_per_s``, ``mean_record_bytes``),
    ``time_to_first_batch_s``,
    ``memory_bound_bytes``, ``peak_rss_bytes``, ``rss_growth_bytes``, ``within_bound``,
    ``decode_limit`` (images/s and MPix/s of full decodes), ``ratio_to_decode_limit``,
    ``timeline``, ``stages`` (where the loader's threads spent the measured stretch: see
    :meth:`shardfeed.pipeline.Loader.stats`) and ``stage_timeline``, ``plot`` and
    ``stage_plot`` (``plot`` with ``-stages`` before its suffix), and the options used.
    """
    if options is None:
        options = BenchOptions(**option_values)
    elif option_values:
        raise TypeError("pass either options= or option keywords, not both")
    if plot is not None and os.path.isdir(plot):  # said before the run, not after it
        raise ValueError(f"plot={os.fspath(plot)!r} is a folder: give the PNG's path "
                         "(e.g. bench.png)")
    from shardfeed.dataset import Dataset

    owned = not hasattr(path_or_dataset, "read_many")
    dataset = Dataset(os.fspath(path_or_dataset), allow_outside_paths=allow_outside_paths) \
        if owned else path_or_dataset
    try:
        result = _run(dataset, options, progress=progress)
    finally:
        if owned:
            dataset.close()
    result["source"] = os.fspath(path_or_dataset) if owned else type(path_or_dataset).__name__
    if plot is not None:
        from shardfeed.tools.bench.plot import plot_stages, plot_throughput, stages_path

        result["plot"] = str(plot_throughput(result, plot))
        drawn = plot_stages(result, stages_path(plot))
        result["stage_plot"] = None if drawn is None else str(drawn)
    else:
        result["plot"] = result["stage_plot"] = None
    return result


def _run(dataset: Any, options: BenchOptions, *, progress: bool) -> dict[str, Any]:
    """Build the Loader, measure it while sampling memory, then report the figures and the
    decode limit."""
    from shardfeed.pipeline import Loader

    train = options.preset == "train"
    start = time.perf_counter()
    source, transform = _source(dataset, options)
    loader = Loader(
        source, batch_size=options.batch_size, shuffle=train, seed=options.seed,
        transform=transform, num_threads=options.num_threads, drop_last=train,
    )
    # The budget builds one sample: libraries are loaded before the memory baseline is taken.
    try:
        budget = loader.memory_budget()
    except BaseException:
        loader.close()
        raise
    decodes = _decode_counter(source) if options.kind == "patches" else None
    with RssSampler() as rss:
        try:
            measured = measure(loader, options, start=start, progress=progress,
                               decodes=decodes)
        finally:
            loader.close()
    if measured.batches == 0 or measured.seconds <= 0:
        raise ValueError("no batch was measured: raise seconds")
    result: dict[str, Any] = {
        **setup_figures(dataset, options, source),
        **rate_figures(dataset, options, measured),
        **memory_figures(options, budget, rss, measured),
        **stage_figures(measured),
    }
    growth = None
    if rss.peak_bytes is not None and rss.start_bytes is not None:
        growth = rss.peak_bytes - rss.start_bytes
    result["rss_growth_bytes"] = growth
    result["within_bound"] = None if growth is None else growth <= budget.total_bytes
    result.update(_decode_part(dataset, options, result["images_per_s"]))
    return result


def _decode_counter(patches: Any) -> Callable[[], int] | None:
    """The patch cache's count of decodes (each reads its record), or None without a cache."""
    if patches.cache_stats() is None:
        return None

    def decodes() -> int:
        stats = patches.cache_stats()
        return 0 if stats is None else int(stats.loads)

    return decodes


def _decode_part(dataset: Any, options: BenchOptions, images_per_s: float) -> dict[str, Any]:
    image = dataset.schema.image
    if image is None or image.encoding not in ("jpeg", "png", "mixed"):
        return {"decode_limit": None, "ratio_to_decode_limit": None}
    encoded = sample_encoded(dataset, image_key=image.key, seed=options.seed)
    if not encoded:
        return {"decode_limit": None, "ratio_to_decode_limit": None}
    limit = decode_limit(encoded, num_threads=options.num_threads, seconds=options.decode,
                         max_pixels=options.max_pixels)
    ratio = images_per_s / limit.images_per_s if limit.images_per_s > 0 else math.nan
    return {"decode_limit": limit.to_json(), "ratio_to_decode_limit": ratio}
