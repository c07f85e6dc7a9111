"""Show what a dataset holds: shards, records, bytes, schema, groups, first records.

examples:
  shardfeed inspect out/                 # a packed or indexed dataset
  shardfeed inspect data/train.tfrecord  # bare TFRecord files (schema inferred)
  shardfeed inspect out/ --records 3     # also the first 3 records, briefly
  shardfeed inspect out/ --json
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


def run(args: argparse.Namespace) -> int:
    from shardfeed.tools.inspect import inspect

    source = args.source[0] if len(args.source) == 1 else args.source
    info = inspect(source, records=args.records)
    if args.json:
        common.print_json(info)
        return 0
    _print_text(info, all_shards=args.all_shards)
    return 0


def _print_text(info: dict[str, Any], *, all_shards: bool) -> None:
    hb = common.human_bytes
    print(f"dataset   {info['manifest'] or info['source']}")
    print(f"mode      {info['mode']}" + (f"  (root {info['root']})" if info["root"] else ""))
    print(f"records   {info['records']} in {len(info['shards'])} shards, {hb(info['bytes'])}")
    shards = info["shards"] if all_shards else info["shards"][:10]
    for s in shards:
        print(f"  {s['path']}  {s['records']} records  {hb(s['bytes'])}")
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
    for key, names in (info["extra"].get("vocabularies") or {}).items():
        shown = ", ".join(map(str, names[:12])) + (" ..." if len(names) > 12 else "")
        print(f"classes   {key}: {len(names)} ({shown})")
    for i, rec in enumerate(info.get("first_records", [])):
        print(f"record {i}")
        for key, value in rec.items():
            print(f"  {key:<24} {value}")
