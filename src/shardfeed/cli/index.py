"""Index existing TFRecord files so shardfeed (and DALI) can read them by offset.

Writes NAME.idx (DALI's text format) and NAME.idx.npy beside each file, in parallel, and a
shardfeed.json manifest in each folder of the files, naming only that folder's files, so
shardfeed.Dataset(folder) opens them: `shardfeed index train/ val/` makes two datasets (train
never reads val's records). --manifest PATH writes one manifest over all the files instead,
opened by that path; it may not be a folder's own shardfeed.json naming files outside that
folder. A folder is listed as Dataset(folder) lists it (*.tfrecord, *-00001-of-00010,
Spark/Hadoop part-r-00000; not _SUCCESS or *.crc). --group-key/--order-key read those
features from every record into the manifest's sidecars (for sequences); the order key's unit
is detected (Unix times in s, ms, us or ns; other numbers are seconds) or given with
--time-unit. GZIP/ZLIB files cannot be indexed: re-pack them with
`shardfeed pack --from-tfrecord`.

examples:
  shardfeed index existing/*.tfrecord
  shardfeed index existing/ --group-key day --order-key timestamp
  shardfeed index train/ val/                  # train/shardfeed.json, val/shardfeed.json
  shardfeed index 'gs-copy/train-*' --manifest train.json --workers 8
  shardfeed index spark-out/ --group-key day --order-key t_ms --time-unit ms --json
"""

from __future__ import annotations

import argparse

from shardfeed.cli import common

NAME = "index"
HELP = "build .idx indexes and a manifest for existing TFRecord files"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", help="TFRecord files, a folder of them, or a glob")
    parser.add_argument("--manifest", default=None, metavar="PATH",
                        help="write one manifest over all the files, at PATH (a .json file or "
                             "a folder); default: a shardfeed.json in each folder of the "
                             "files, naming only that folder's files")
    parser.add_argument("--group-key", default=None, metavar="FEATURE",
                        help="feature holding each record's group (e.g. day)")
    parser.add_argument("--order-key", default=None, metavar="FEATURE",
                        help="feature holding each record's order key (a time)")
    parser.add_argument("--time-unit", default="auto", choices=("auto", "s", "ms", "us", "ns"),
                        help="unit of the order key (default auto: Unix times in one unit are "
                             "detected, other numbers are seconds)")
    common.add_workers(parser, what="index files")
    common.add_progress(parser)
    parser.add_argument("--json", action="store_true",
                        help="print a machine-readable summary as JSON")


def run(args: argparse.Namespace) -> int:
    from shardfeed.tools.index import index_files

    result = index_files(
        args.files, manifest=args.manifest, group_key=args.group_key,
        order_key=args.order_key, workers=args.workers, progress=common.show_progress(args),
        time_unit=args.time_unit,
    )
    if args.json:
        common.print_json(result.to_json())
        return 0
    for written in result.manifests:  # one line a manifest: one a folder, or --manifest's
        print(
            f"indexed {common.count(written.records, 'record')} in "
            f"{common.count(written.files, 'file')} "
            f"({common.human_bytes(written.bytes)}): {written.manifest}"
        )
    return 0
