"""Pack images into indexed TFRecord shards (readable by tf.data, DALI and shardfeed).

From a folder of class sub-folders (label = index of the sorted class name; the names are
kept in the manifest), or from a CSV of image paths and label columns. Records of one group
stay contiguous and sorted by the order key. Shards are written under a temporary name and
renamed when complete and indexed; the manifest comes last. An interrupted pack is finished
with --resume (byte-identical to an uninterrupted run).

modes:
  embedded    the image file's bytes as they are, no re-encoding (default)
  referenced  only the image path, relative to --root (default: the CSV's folder)
  raw         decoded uint8 pixels with height, width, channels

examples:
  shardfeed pack photos/ out/ --shard-size 64MB          # class sub-folders become labels
  shardfeed pack frames.csv out/ --csv-path path --csv-group day --csv-order timestamp \\
      --csv-floats 'VF,IRR0..IRR10,MPC0..MPC10' --mode referenced
  shardfeed pack labels.csv out/ --csv-labels label --csv-onehot root,leaf --csv-mask mask
  shardfeed pack frames.csv out/ ... --resume            # finish an interrupted pack
  shardfeed pack old/*.tfrecord.gz out/ --from-tfrecord  # re-pack (GZIP) TFRecord files
"""

from __future__ import annotations

import argparse

from shardfeed.cli import common

NAME = "pack"
HELP = "pack a folder of images or a CSV into indexed TFRecord shards"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "source", nargs="+",
        help="a folder of class sub-folders, a CSV file, or (--from-tfrecord) TFRecord files",
    )
    parser.add_argument("output", help="output folder (created if missing; must be empty)")
    parser.add_argument(
        "--mode", choices=("embedded", "referenced", "raw"), default="embedded",
        help="how images are stored (default: embedded)",
    )
    size = parser.add_mutually_exclusive_group()
    size.add_argument(
        "--shard-size", default=None, metavar="SIZE",
        help="target shard size, e.g. 64MB, 256MiB, 1GB (default: 64MB)",
    )
    size.add_argument(
        "--records-per-shard", type=common.positive_int, default=None, metavar="N",
        help="exactly N records a shard (the last may hold fewer)",
    )
    parser.add_argument("--root", default=None,
                        help="folder CSV paths are relative to (default: the CSV's folder)")
    parser.add_argument("--prefix", default="shard",
                        help="shard file name prefix (default: shard -> shard-00000-of-00004)")
    again = parser.add_mutually_exclusive_group()
    again.add_argument("--resume", action="store_true",
                       help="finish an interrupted pack into OUTPUT, keeping its complete shards")
    again.add_argument("--overwrite", action="store_true",
                       help="replace what an earlier pack wrote into OUTPUT")
    parser.add_argument("--from-tfrecord", action="store_true",
                        help="the sources are TFRecord files (plain, GZIP or ZLIB) to re-pack")
    common.add_workers(parser, what="read and encode images")
    parser.add_argument("--processes", action="store_true",
                        help="use worker processes instead of threads")
    common.add_progress(parser)
    csv = parser.add_argument_group("CSV columns")
    csv.add_argument("--csv-path", default="path", metavar="COL",
                     help="column of image paths (default: path)")
    csv.add_argument("--csv-labels", default="", metavar="COLS",
                     help="integer label columns, comma-separated (one is image/class/label)")
    csv.add_argument("--csv-floats", default="", metavar="COLS",
                     help="float label columns stored together as 'labels'; ranges like "
                          "IRR0..IRR10 allowed")
    csv.add_argument("--csv-onehot", default="", metavar="COLS",
                     help="categorical columns stored one-hot as image/label/<col>")
    csv.add_argument("--csv-mask", default=None, metavar="COL", help="column of mask paths")
    csv.add_argument("--csv-group", default=None, metavar="COL",
                     help="group column (e.g. a day); records of a group stay together")
    csv.add_argument("--csv-order", default=None, metavar="COL",
                     help="order-key column: numbers or ISO timestamps (sorted within a group)")


def run(args: argparse.Namespace) -> int:
    from shardfeed.cli.common import human_bytes
    from shardfeed.tools.csvinput import CsvColumns, expand_columns
    from shardfeed.tools.pack import pack

    sources = args.source
    if not args.from_tfrecord and len(sources) > 1:
        raise ValueError(
            f"pack takes one folder or CSV, got {len(sources)} sources; pass --from-tfrecord "
            "to re-pack several TFRecord files"
        )
    csv = None
    if not args.from_tfrecord:
        csv = CsvColumns(
            path=args.csv_path,
            labels=expand_columns(args.csv_labels),
            floats=expand_columns(args.csv_floats),
            onehot=expand_columns(args.csv_onehot),
            mask=args.csv_mask,
            group=args.csv_group,
            order=args.csv_order,
        )
        import os

        if os.path.isdir(sources[0]):
            if csv != CsvColumns():
                raise ValueError(
                    f"--csv-* options were given but '{sources[0]}' is a folder; pass a CSV"
                )
            csv = None
    result = pack(
        sources if args.from_tfrecord else sources[0],
        args.output,
        mode=args.mode,
        csv=csv,
        root=args.root,
        shard_size=args.shard_size,
        records_per_shard=args.records_per_shard,
        workers=args.workers,
        executor="process" if args.processes else "thread",
        prefix=args.prefix,
        resume=args.resume,
        overwrite=args.overwrite,
        from_tfrecord=args.from_tfrecord,
        progress=common.show_progress(args),
    )
    kept = f" ({result.kept_shards} kept from the interrupted run)" if result.kept_shards else ""
    print(
        f"packed {result.records} records into {result.shards} shards{kept}, "
        f"{human_bytes(result.bytes)}: {result.manifest}"
    )
    return 0
