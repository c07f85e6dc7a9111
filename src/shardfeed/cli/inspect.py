"""Show what a dataset holds: shards, records, bytes, schema, groups, first records.

examples:
  shardfeed inspect out/                 # a packed or indexed dataset
  shardfeed inspect data/train.tfrecord  # bare TFRecord files (schema inferred)
  shardfeed inspect out/ --records 3     # also the first 3 records, briefly
  shardfeed inspect out/ --json
  shardfeed inspect s3://bucket/ds/      # any URL Dataset opens (s3://, gs://, memory://)
  shardfeed inspect s3://bucket/ds/ --cache-dir ~/.cache/ds   # and what a disk cache holds of it
  shardfeed inspect out/ --windows 3 --stride 2            # valid 3-frame windows, every 2nd frame
  shardfeed inspect out/ --windows 3 --stride-seconds 16 --max-gap-seconds 30
"""

from __future__ import annotations

import argparse
from typing import Any

from shardfeed.cli import common

NAME = "inspect"
HELP = "show shards, records, schema and groups of a dataset"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "source", nargs="+",
        help="dataset folder, manifest, folder of TFRecord files, glob, or files",
    )
    parser.add_argument("--records", type=common.non_negative_int, default=0, metavar="N",
                        help="print the first N records, briefly")
    parser.add_argument("--json", action="store_true", help="print everything as JSON")
    parser.add_argument("--all-shards", action="store_true",
                        help="list every shard (default: the first 10)")
    parser.add_argument("--cache-dir", default=None, metavar="DIR",
                        help="also show how much of the dataset the disk cache folder DIR "
                             "holds (a Dataset's cache_dir; `shardfeed cache DIR` shows it all)")
    parser.add_argument("--trust-cache-dir", action="store_true",
                        help="look in a cache folder that another user owns or other users "
                             "can write (refused otherwise)")
    common.add_dataset_options(parser)
    windows = parser.add_argument_group(
        "windows", "count the valid windows of K frames within groups (needs group/order keys)"
    )
    windows.add_argument("--windows", type=common.positive_int, default=None, metavar="K",
                         help="report the windows of K frames and what was excluded")
    how = windows.add_mutually_exclusive_group()
    how.add_argument("--stride", type=common.positive_int, default=1, metavar="S",
                     help="records between the frames of a window (default 1)")
    how.add_argument("--stride-seconds", type=_seconds, default=None, metavar="T",
                     help="seconds between the frames of a window (matched within T/2)")
    windows.add_argument("--max-gap-seconds", type=_seconds, default=None, metavar="G",
                         help="exclude windows with two consecutive frames more than G s apart")


def _seconds(text: str) -> float:
    """argparse type: a finite number of seconds >= 0."""
    import math

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def run(args: argparse.Namespace) -> int:
    from shardfeed.tools.inspect import inspect

    source = args.source[0] if len(args.source) == 1 else args.source
    window_options = (args.stride != 1 or args.stride_seconds is not None
                      or args.max_gap_seconds is not None)
    if args.windows is None and window_options:
        raise ValueError("--stride, --stride-seconds and --max-gap-seconds describe windows: "
                         "also pass --windows K (frames a window)")
    info = inspect(source, records=args.records, windows=args.windows, stride=args.stride,
                   stride_seconds=args.stride_seconds, max_gap_seconds=args.max_gap_seconds,
                   cache_dir=args.cache_dir, trust_cache_dir=args.trust_cache_dir,
                   **common.dataset_options(args))
    if args.json:
        common.print_json(info)
        return 0
    _print_text(info, all_shards=args.all_shards)
    return 0


def _print_text(info: dict[str, Any], *, all_shards: bool) -> None:
    hb = common.human_bytes
    print(f"dataset   {info['manifest'] or info['source']}")
    if (info.get("dataset_version") or 1) > 1:
        print(f"version   {info['dataset_version']} (each pack --append adds one; an earlier "
              "one: Dataset(..., version=k))")
    print(f"mode      {info['mode']}" + (f"  (root {info['root']})" if info["root"] else ""))
    shards_text = common.count(len(info["shards"]), "shard")
    print(f"records   {info['records']:,} in {shards_text}, {hb(info['bytes'])}")
    shards = info["shards"] if all_shards else info["shards"][:10]
    for s in shards:
        print(f"  {s['path']}  {common.count(s['records'], 'record')}  {hb(s['bytes'])}")
    if len(shards) < len(info["shards"]):
        print(f"  ... {len(info['shards']) - len(shards)} more (--all-shards lists them)")
    print("schema")
    for row in info["schema"]:
        length = "var" if row["length"] is None else str(row["length"])
        role = f"  [{row['role']}" + (f", {row['encoding']}" if row["encoding"] else "") + "]" \
            if row["role"] else ""
        print(f"  {row['name']:<24} {row['kind']:<6} x{length}{role}")
    groups = info["groups"]
    if groups:
        rpg = groups["records_per_group"]
        print(f"groups    {groups['count']} by '{info['group_key']}', records per group "
              f"min {rpg['min']} / median {rpg['median']:g} / max {rpg['max']}")
        span = groups.get("order_span_seconds")
        if span:
            print(f"order     '{info['order_key']}', span per group min {span['min']:g} s / "
                  f"median {span['median']:g} s / max {span['max']:g} s")
    _print_extras(info)
    for i, rec in enumerate(info.get("first_records", [])):
        print(f"record {i}")
        for key, value in rec.items():
            print(f"  {key:<24} {value}")


def _print_extras(info: dict[str, Any]) -> None:
    """Windows, the cache's share, and vocabularies (class names, float label names)."""
    if "windows" in info:
        _print_windows(info["windows"])
    if "cache" in info:
        _print_cache(info["cache"], records=info["records"])
    kinds = {row["name"]: row["kind"] for row in info["schema"]}
    for key, names in (info["extra"].get("vocabularies") or {}).items():
        shown = ", ".join(map(str, names[:12])) + (" ..." if len(names) > 12 else "")
        if kinds.get(key) == "float":  # the names of float label columns, not classes
            print(f"values    {key}: {common.count(len(names), 'float')} ({shown})")
        else:
            print(f"classes   {key}: {len(names)} ({shown})")


def _print_cache(cache: dict[str, Any], *, records: int) -> None:
    share = f" ({cache['records'] / records:.0%})" if records else ""
    shards = sum(1 for s in cache["shards"] if s["cached"] == s["records"] and s["records"])
    print(f"cached    {cache['records']:,} of {common.count(records, 'record')}{share}, "
          f"{common.human_bytes(cache['bytes'])} in {cache['path']}; "
          f"{shards} of {common.count(len(cache['shards']), 'shard')} whole")


def _print_windows(w: dict[str, Any]) -> None:
    if w["stride_seconds"] is not None:
        how = f"{w['stride_seconds']:g} s apart (within {w['tolerance_seconds']:g} s)"
    else:
        how = f"stride {w['stride']}"
    gap = f", gaps over {w['max_gap_seconds']:g} s excluded" if w["max_gap_seconds"] is not None \
        else ""
    print(f"windows   {w['count']:,} of {common.count(w['length'], 'frame')}, {how}{gap}")
    ex = w["excluded"]
    print(f"excluded  {common.count(ex['total'], 'anchor')}: {ex['group_end']} at group ends, "
          f"{ex['gap']} by "
          f"gaps, {ex['off_grid']} off the time grid, {ex['missing_time']} without a time")
    if "groups" in w:
        without = w["groups_without_windows"]
        print(f"          {without:,} of {common.count(w['groups'], 'group')} "
              f"{'has' if without == 1 else 'have'} no window")
