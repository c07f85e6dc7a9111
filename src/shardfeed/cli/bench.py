"""Measure how fast shardfeed feeds batches from your dataset, with the decode limit beside it.

Runs the Loader a training job would use over PATH (preset train or eval; or windows of
frames; or cached patches), after a warm-up, for --seconds, and prints:

  images/s      samples per second (frames/s for windows, patches/s for patches)
  MPix/s        output pixels per second, and source pixels decoded per second
  MB/s read     bytes of the records read per second (records/s x their mean size: local
                shards are memory-mapped, which the OS read counter does not see)
  first batch   time from start to the first batch
  memory        peak resident memory growth against the Loader's stated bound
  decode limit  full JPEG decodes of the same records on the same number of threads, and
                the loader's rate as a ratio of it (above 1: the crop-aware decode decodes
                at reduced scale)

examples:
  shardfeed bench data/train                          # train preset, 224 px, batch 256
  shardfeed bench data/train --preset eval --batch 64 --threads 8 --seconds 10
  shardfeed bench data/days --windows 3 --stride 2 --size 128
  shardfeed bench data/large --patches 64 --cache-images 32 --refresh-every 50
  shardfeed bench data/train --json --plot throughput.png
"""

from __future__ import annotations

import argparse
from typing import Any

from shardfeed.cli import common

NAME = "bench"
HELP = "measure images/s of a Loader over a dataset, next to the decode limit"


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value >= 0.1:
        raise argparse.ArgumentTypeError(f"must be >= 0.1 seconds, got {text}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", metavar="PATH",
                        help="dataset folder, manifest, folder of TFRecord files or glob")
    parser.add_argument("--preset", choices=("train", "eval"), default="train",
                        help="train: shuffled, random resized crop + flip; eval: in order, "
                             "center crop (default: train)")
    parser.add_argument("--size", type=common.positive_int, default=224, metavar="PX",
                        help="output image size (default: 224)")
    parser.add_argument("--batch", type=common.positive_int, default=256, metavar="N",
                        help="batch size (default: 256)")
    parser.add_argument("--threads", type=common.positive_int, default=common.default_workers(),
                        metavar="N",
                        help=f"loader threads, also used for the decode limit "
                             f"(default: {common.default_workers()})")
    windows = parser.add_argument_group("windows of frames (datasets packed with groups)")
    windows.add_argument("--windows", type=common.positive_int, default=None, metavar="LENGTH",
                         help="bench windows of LENGTH frames from the same group")
    windows.add_argument("--stride", type=common.positive_int, default=None, metavar="S",
                         help="records between the frames of a window (default: 1)")
    patches = parser.add_argument_group("cached patches (few large images)")
    patches.add_argument("--patches", type=common.positive_int, default=None, metavar="SIZE",
                         help="bench random SIZE x SIZE crops from a cache of decoded images")
    patches.add_argument("--cache-images", type=common.positive_int, default=None, metavar="N",
                         help="decoded images in the cache (default: 64, or every image of a "
                              "smaller dataset)")
    patches.add_argument("--refresh-every", type=common.positive_int, default=None, metavar="R",
                         help="outputs between two cache refreshes (default: 100)")
    parser.add_argument("--seconds", type=_seconds, default=30.0, metavar="S",
                        help="measured time after the warm-up (default: 30)")
    parser.add_argument("--seed", type=common.non_negative_int, default=0, metavar="S",
                        help="shuffle and augmentation seed (default: 0)")
    common.add_max_pixels(parser, what="larger images stop the run; the stated memory bound "
                          "counts this much decoding a thread: lower it to your largest image "
                          "for a tight bound")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--plot", default=None, metavar="FILE",
                        help="write throughput over time as a PNG, and where the threads' "
                             "time went beside it (FILE with -stages before its suffix)")
    parser.add_argument("--what-if", action="append", default=[], metavar="NAME=VALUE",
                        help="measure again with one option changed and print both: threads, "
                             "batch, size, preset, cache-images, refresh-every (e.g. "
                             "--what-if threads=16); may be given more than once")
    common.add_dataset_options(parser)
    common.add_progress(parser)


def _options(args: argparse.Namespace) -> Any:
    from shardfeed.tools.bench import BenchOptions

    if args.stride is not None and args.windows is None:
        raise ValueError("--stride belongs to --windows: add --windows LENGTH")
    if args.patches is None and (args.cache_images is not None or args.refresh_every is not None):
        raise ValueError("--cache-images and --refresh-every belong to --patches: add --patches SIZE")
    if args.windows is not None and args.patches is not None:
        raise ValueError("--windows and --patches exclude each other: bench one at a time")
    return BenchOptions(
        preset=args.preset, size=args.size, batch_size=args.batch, num_threads=args.threads,
        windows=args.windows, stride=args.stride or 1, patches=args.patches,
        cache_images=args.cache_images, refresh_every=args.refresh_every or 100,
        seconds=args.seconds, seed=args.seed, max_pixels=args.max_pixels,
    )


def _mb(n: float | None) -> str:
    return "n/a" if n is None else f"{n / 1e6:,.1f} MB"


def _read(result: dict[str, Any]) -> str:
    """The MB/s read line: what was counted, or n/a and why."""
    read = result["read_mb_per_s"]
    if read is None:
        return f"n/a ({result['read_note']})"
    if result["read_counted"] == "os":
        return f"{read:,.1f}   (image files, by the OS read counter)"
    return (f"{read:,.1f}   ({result['records_read_per_s']:,.1f} records/s x "
            f"{result['mean_record_bytes'] / 1e3:,.1f} kB, their mean size)")


def format_result(result: dict[str, Any]) -> str:
    """The text printed by the command."""
    kind = result["kind"]
    if kind == "windows":
        what = f"windows of {common.count(result['windows'], 'frame')}"
    else:
        what = "images" if kind == "records" else f"{result['patches']} px patches"
    lines = [
        (f"bench: {result['source']} ({common.count(result['records'], 'record')}), {what}, "
        f"preset {result['preset']}, size {result['size']}, batch {result['batch_size']}, "
        f"{common.count(result['threads'], 'thread')}"),
        (f"  measured      {result['seconds']:.1f} s after {result['warmup_seconds']:.1f} s "
        f"warm-up: {common.count(result['samples'], 'sample')} in "
        f"{common.count(result['batches'], 'batch')}"),
    ]
    if kind == "windows":
        lines.append(f"  windows/s     {result['samples_per_s']:,.1f}   "
                     f"(frames/s {result['frames_per_s']:,.1f})")
    elif kind == "patches":
        lines.append(f"  patches/s     {result['patches_per_s']:,.1f}")
    else:
        lines.append(f"  images/s      {result['images_per_s']:,.1f}")
    source_mpix = result["source_mpix_per_s"]
    lines.append(
        f"  MPix/s        {result['output_mpix_per_s']:,.1f} out"
        + (f", {source_mpix:,.1f} source" if source_mpix is not None else "")
    )
    lines.append(f"  MB/s read     {_read(result)}")
    lines.append(f"  first batch   {result['time_to_first_batch_s']:.3f} s")
    within = result["within_bound"]
    verdict = "" if within is None else ("  (within)" if within else "  (ABOVE the bound)")
    lines.append(
        f"  memory        peak RSS {_mb(result['peak_rss_bytes'])}, growth "
        f"{_mb(result['rss_growth_bytes'])} vs stated bound "
        f"{_mb(result['memory_bound_bytes'])}{verdict}"
    )
    budget = result["memory_budget"]
    lines.append(
        f"                of the bound: decoding {_mb(budget['decode_bytes_per_thread'])} a "
        f"thread (images up to --max-pixels {result['max_pixels']}), fixed "
        f"{_mb(budget['fixed_bytes'])}"
    )
    limit = result["decode_limit"]
    if limit is None:
        lines.append("  decode limit  n/a (images are not JPEG/PNG)")
    else:
        compared = {"records": "images/s", "windows": "frames/s", "patches": "patches/s"}[kind]
        lines.append(
            f"  decode limit  {limit['images_per_s']:,.1f} images/s "
            f"({limit['mpix_per_s']:,.1f} MPix/s; full decode of "
            f"{common.count(limit['distinct_images'], 'record')} on "
            f"{common.count(limit['threads'], 'thread')})"
        )
        lines.append(f"  ratio         {result['ratio_to_decode_limit']:.2f}x the decode limit "
                     f"({compared} / decoded images/s)")
    stages = result.get("stages")
    if stages:
        shares = stages["shares"]
        parts = ", ".join(f"{name} {shares[name]:.0%}" for name in
                          ("read", "decode", "transform", "assemble") if shares.get(name))
        storage = (f"; storage calls {shares['storage']:.0%}, "
                   f"{common.count(stages['requests'], 'request')}"
                   if stages.get("requests") else "")
        lines.append(f"  threads       busy {stages['busy_share']:.0%} of the time: "
                     f"{parts}{storage}")
    if result.get("plot"):
        lines.append(f"  plot          {result['plot']}")
    if result.get("stage_plot"):
        lines.append(f"  stage plot    {result['stage_plot']}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from shardfeed.tools.bench import bench

    options = _options(args)
    changes = [what_if(text, options) for text in args.what_if]  # checked before measuring
    result = bench(args.source, options=options, progress=common.show_progress(args),
                   plot=args.plot, **common.dataset_options(args))
    others = []
    for label, changed in changes:
        other = bench(args.source, options=changed, progress=common.show_progress(args),
                      **common.dataset_options(args))
        others.append((label, other))
    if args.json:
        if others:
            result["what_if"] = {label: other for label, other in others}
        common.print_json(result)
    else:
        print(format_result(result))
        for label, other in others:
            print(compare_line(label, result, other))
    return 0


_WHAT_IF = {"threads": "num_threads", "batch": "batch_size", "size": "size", "preset": "preset",
            "cache-images": "cache_images", "refresh-every": "refresh_every"}


def what_if(text: str, options: Any) -> tuple[str, Any]:
    """``NAME=VALUE`` as the options with that one changed (ValueError naming what is
    wrong: an unknown name, a value the option refuses)."""
    import dataclasses

    name, sep, value = text.partition("=")
    name = name.strip().replace("_", "-")
    if not sep or name not in _WHAT_IF:
        raise ValueError(f"--what-if {text!r}: give NAME=VALUE with NAME one of "
                         f"{', '.join(_WHAT_IF)} (e.g. --what-if threads=16)")
    field = _WHAT_IF[name]
    if field in ("cache_images", "refresh_every") and options.patches is None:
        raise ValueError(f"--what-if {text!r}: {name} belongs to --patches: add --patches SIZE")
    try:
        parsed: Any = value.strip() if field == "preset" else common.positive_int(value)
        return f"{name}={value.strip()}", dataclasses.replace(options, **{field: parsed})
    except (argparse.ArgumentTypeError, TypeError) as exc:
        raise ValueError(f"--what-if {text!r}: {exc}") from None


def compare_line(label: str, result: dict[str, Any], other: dict[str, Any]) -> str:
    """One line: the rate as measured and with the change, and their ratio."""
    unit = {"records": "images/s", "windows": "windows/s", "patches": "patches/s"}[result["kind"]]
    a, b = result["samples_per_s"], other["samples_per_s"]
    ratio = f"{b / a:.2f}x" if a > 0 else "n/a"
    return (f"  what if {label}: {a:,.1f} -> {b:,.1f} {unit} ({ratio}; one run each: at a "
            "few --seconds, differences of 10% are noise)")
