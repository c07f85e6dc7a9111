"""Pack images into indexed TFRecord shards (readable by tf.data, DALI and shardfeed).

From a folder of class sub-folders (label = index of the sorted class name; the names are
kept in the manifest; --classes/--classes-from fix them across splits), from a CSV of
image paths and label columns, or from Parquet files or WebDataset tar shards. Every input file is checked first (headers and end markers;
--check-decode decodes them too): bad files are all listed and nothing is written, unless
--skip-bad packs the rest and lists what it skipped in OUTPUT/skipped.csv. Records of one
group stay contiguous and sorted by the order key (stored as int64 nanoseconds; its unit is
detected, or given with --time-unit). Shards are written under a temporary name and renamed
when complete and indexed; the manifest comes last. An interrupted pack is finished with
--resume (byte-identical to an uninterrupted run; kept shards are checked against the
checksums recorded when they were written). --overwrite removes what an earlier pack wrote
there and nothing else.

modes:
  embedded    the image file's bytes as they are, no re-encoding (default)
  referenced  only the image path, relative to --root (default: the CSV's folder)
  raw         decoded uint8 pixels with height, width, channels

examples:
  shardfeed pack photos/ out/ --shard-size 64MB          # class sub-folders become labels
  shardfeed pack val/ val_out/ --classes-from out/        # the labels of the training split
  shardfeed pack photos/ out/ --skip-bad --check-decode   # decode all; pack the good ones
  shardfeed pack frames.csv out/ --csv-path path --csv-group day --csv-order timestamp \\
      --csv-floats 'VF,IRR0..IRR10,MPC0..MPC10' --mode referenced
  shardfeed pack frames.csv out/ --csv-group day --csv-order t_ms --time-unit ms
  shardfeed pack labels.csv out/ --csv-labels label --csv-onehot root,leaf --csv-mask mask
  shardfeed pack frames.csv out/ ... --resume            # finish an interrupted pack
  shardfeed pack day258.csv out/ ... --append            # a new day: version 2 of out/
  shardfeed pack old/*.tfrecord.gz out/ --from-tfrecord  # re-pack (GZIP) TFRecord files
  shardfeed pack export/*.parquet out/ --image-column jpeg --label-columns label
  shardfeed pack export/ out/ --image-column path --root /data/images  # a Parquet folder
  shardfeed pack saved/ out/                      # a Hugging Face dataset's save_to_disk
  shardfeed pack shards/*.tar out/                        # WebDataset: key = name, cls = label
  shardfeed pack shards/*.tar.gz out/ --image-column rgb.jpg  # two image members: name one
  shardfeed pack mnist.npz out/ --image-column x_train --label-columns y_train  # arrays
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from shardfeed.cli import common

if TYPE_CHECKING:
    from shardfeed.tools.pack.csvinput import CsvColumns
    from shardfeed.tools.pack.output import PackResult

NAME = "pack"
HELP = "pack a folder of images or a CSV into indexed TFRecord shards"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``shardfeed pack``: what to pack and where, the input checks and
    workers, the CSV columns."""
    _add_input_arguments(parser)
    _add_run_arguments(parser)
    _add_csv_arguments(parser)
    _add_rows_arguments(parser)


def _add_rows_arguments(parser: argparse.ArgumentParser) -> None:
    """Columns of Parquet files, WebDataset tars and NumPy .npz archives."""
    rows = parser.add_argument_group("Parquet, WebDataset tar and .npz columns")
    rows.add_argument("--image-column", default=None, metavar="COL",
                      help="the image column (encoded bytes, a path, or a bytes/path struct; "
                           "of an .npz: the N×H×W[×C] array; of a tar: a member type such "
                           "as jpg or rgb.jpg; default: image)")
    rows.add_argument("--label-columns", default=None, metavar="COLS",
                      help="comma-separated label columns (default: every other column; of "
                           "an .npz: every other array, all as long as the images)")
    rows.add_argument("--name-column", default=None, metavar="COL",
                      help="the column stored as the record's name (a tar's default: the key)")


def _row_fields(args: argparse.Namespace) -> object:
    if args.image_column is None and args.label_columns is None and args.name_column is None:
        return None
    from shardfeed.tools.pack.rows import RowFields

    labels = None if args.label_columns is None else [
        c.strip() for c in args.label_columns.split(",") if c.strip()]
    return RowFields(image=args.image_column or "image", labels=labels, name=args.name_column)


def _add_input_arguments(parser: argparse.ArgumentParser) -> None:
    """Sources and output, mode, shard size, resume or overwrite, classes."""
    parser.add_argument(
        "source", nargs="+",
        help="a folder of class sub-folders, a CSV file, Parquet files (or a folder of "
             "them), .npz archives, a Hugging Face save_to_disk folder, WebDataset .tar "
             "(.tar.gz, .tgz) shards, or (--from-tfrecord) TFRecord files",
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
                        help="folder CSV paths are relative to (default: the CSV's folder); "
                             "for Parquet, .npz, tar or Hugging Face data, the folder image "
                             "paths in the data are read under, and only under (without it "
                             "such paths are refused)")
    parser.add_argument("--prefix", default="shard",
                        help="shard file name prefix (default: shard -> shard-00000-of-00004)")
    again = parser.add_mutually_exclusive_group()
    again.add_argument("--resume", action="store_true",
                       help="finish an interrupted pack into OUTPUT, keeping its complete "
                            "shards that still match their checksums (a finished one is "
                            "checked and left as it is)")
    again.add_argument("--overwrite", action="store_true",
                       help="replace what an earlier pack wrote into OUTPUT (the files its "
                            "manifest or plan names); other files stay")
    parser.add_argument("--append", action="store_true",
                        help="add the input to the dataset in OUTPUT as its next version: "
                             "only new shards are written (OUTPUT/vN/), earlier versions stay "
                             "readable, class ids are kept (a new class gets the next); with "
                             "--resume, finish an append that was stopped")
    parser.add_argument("--from-tfrecord", action="store_true",
                        help="the sources are TFRecord files (plain, GZIP or ZLIB) to re-pack")
    classes = parser.add_mutually_exclusive_group()
    classes.add_argument(
        "--classes", default=None, metavar="A,B,C",
        help="the class list of a folder input, in label order (label = position); a class "
             "folder not in it is refused, a missing or empty one keeps its label",
    )
    classes.add_argument(
        "--classes-from", default=None, metavar="PATH",
        help="take the class list from a packed dataset (e.g. the training split's output) "
             "or a folder of class sub-folders; for a CSV, the dataset's --csv-onehot "
             "vocabularies",
    )


def _add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """Input checks, workers, progress and --json."""
    check = parser.add_argument_group("input checks")
    check.add_argument(
        "--check-decode", action="store_true",
        help="decode every image before packing (default: check headers and end markers, "
             "which catches missing, empty, non-image and truncated files)",
    )
    check.add_argument(
        "--skip-bad", action="store_true",
        help="pack the good files and list the bad ones in OUTPUT/skipped.csv (default: "
             "list every bad file and write nothing)",
    )
    common.add_max_pixels(check, what="an image claiming more is a bad input, as a loader "
                          "with that limit would refuse it")
    common.add_workers(parser, what="check, read and encode images")
    parser.add_argument("--processes", action="store_true",
                        help="use worker processes instead of threads")
    common.add_progress(parser)
    parser.add_argument("--json", action="store_true",
                        help="print a machine-readable summary (or the bad inputs) as JSON")


def _add_csv_arguments(parser: argparse.ArgumentParser) -> None:
    """The CSV columns (and the order column's time unit)."""
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
                     help="order-key column: times (sorted within a group; stored as int64 "
                          "nanoseconds, seconds in order.npy)")
    csv.add_argument("--time-unit", default="auto",
                     choices=("auto", "s", "ms", "us", "ns", "iso"),
                     help="what the --csv-order values are: s, ms, us, ns (numbers), iso "
                          "(ISO 8601 timestamps) or auto (default: ISO, or Unix times of one "
                          "unit; any other column is refused)")


def run(args: argparse.Namespace) -> int:
    """Pack as the arguments say; print a summary, or every bad input (exit status 1)."""
    from shardfeed.tools.pack import pack
    from shardfeed.tools.pack.check import BadInputsError

    sources = args.source
    from shardfeed.tools.pack.rows import DATA_SUFFIXES

    data = all(s.endswith(DATA_SUFFIXES) for s in sources)
    if not args.from_tfrecord and len(sources) > 1 and not data:
        raise ValueError(
            f"pack takes one folder or CSV, got {len(sources)} sources; pass --from-tfrecord "
            "to re-pack several TFRecord files"
        )
    csv = _csv_columns(args, sources)
    classes = None
    if args.classes is not None:
        classes = [c.strip() for c in args.classes.split(",") if c.strip()]
    try:
        result = pack(
            sources if args.from_tfrecord or data else sources[0],
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
            classes=classes,
            classes_from=args.classes_from,
            check="decode" if args.check_decode else "header",
            skip_bad=args.skip_bad,
            max_pixels=args.max_pixels,
            fields=_row_fields(args),  # type: ignore[arg-type]
            append=args.append,
        )
    except BadInputsError as exc:
        return _report_bad(exc, as_json=args.json)
    if args.json:
        common.print_json(result.to_json())
        return 0
    _print_summary(result)
    return 0


def _csv_columns(args: argparse.Namespace, sources: list[str]) -> CsvColumns | None:
    """The CSV columns the --csv-* options name; None for TFRecords or a folder (where
    --csv-* options are refused)."""
    import os

    from shardfeed.tools.pack.csvinput import CsvColumns, expand_columns

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
            time_unit=args.time_unit,
        )
        if os.path.isdir(sources[0]):
            if csv != CsvColumns():
                raise ValueError(
                    f"--csv-* options were given but '{sources[0]}' is a folder; pass a CSV"
                )
            csv = None
    return csv


def _print_summary(result: PackResult) -> None:
    """What was packed (or found already complete), what was skipped, the order-key unit."""
    if result.already_complete:
        print(
            f"already complete: {common.count(result.records, 'record')} in "
            f"{common.count(result.shards, 'shard')}, every shard checked against "
            f"{result.manifest}; nothing was written"
        )
        return
    kept = f" ({result.kept_shards} kept from the interrupted run)" if result.kept_shards else ""
    if result.version is not None:
        added = (f"appended {common.count(result.added[0], 'record')} in "
                 f"{common.count(result.added[1], 'shard')}{kept}" if result.added is not None
                 else "finished the append")
        print(f"{added}: version {result.version} of {result.output} holds "
              f"{common.count(result.records, 'record')} in "
              f"{common.count(result.shards, 'shard')}, {common.human_bytes(result.bytes)} "
              f"(earlier versions: Dataset(..., version=k))")
    else:
        print(
            f"packed {common.count(result.records, 'record')} into "
            f"{common.count(result.shards, 'shard')}{kept}, "
            f"{common.human_bytes(result.bytes)}: {result.manifest}"
        )
    if result.skipped_list:
        parts = []
        if result.skipped:
            parts.append(f"{common.count(len(result.skipped), 'bad input')} skipped")
        if result.ignored:
            parts.append(f"{common.count(len(result.ignored), 'other file')} not packed")
        print(f"{' and '.join(parts)}: listed in {result.skipped_list}")
    if result.order_unit is not None:
        print(f"order key read as {_UNIT_NAMES.get(result.order_unit, result.order_unit)}, "
              "stored as int64 nanoseconds (order.npy: float64 seconds)")


_UNIT_NAMES = {"s": "seconds", "ms": "milliseconds", "us": "microseconds",
               "ns": "nanoseconds", "iso": "ISO 8601 timestamps"}


def _report_bad(exc: Exception, *, as_json: bool) -> int:
    """Every bad input, one a line, then one line saying what to do; exit status 1."""
    import sys

    problems = getattr(exc, "problems", ())
    if as_json:
        common.print_json({
            "ok": False,
            "error": str(exc),
            "bad": [{"path": p.path, "line": p.line, "problem": p.problem} for p in problems],
        })
        return 1
    for problem in problems:
        print(f"bad input: {problem.text()}", file=sys.stderr)
    print(
        f"shardfeed pack: error: {common.count(len(problems), 'input file')} cannot be packed "
        "(listed above); nothing was written. Fix or remove them, or pass --skip-bad to pack "
        "the rest and list what was skipped",
        file=sys.stderr,
    )
    return 1
