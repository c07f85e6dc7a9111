"""Show how random an epoch's order is: shardfeed's exact shuffle vs a shuffle buffer.

Reads the label of every record, then compares, on this dataset, the order of one epoch under
shardfeed's exact shuffle with the order a shuffle buffer gives (tf.data's
shuffle(buffer_size), DALI's random_shuffle, WebDataset's shuffle), and with --file-shuffle
also shards shuffled first, then the buffer. For each order it prints:

  rho, rho p    Spearman correlation of output position vs stored index (0 for a fair
                shuffle, 1 for no shuffle; a buffer over sorted data stays near 1) and its
                p-value for this many records
  displ.        mean |position - index| / n (1/3 for a fair shuffle, 0 for none)
  chi2 p        chi-square test of position bin x index bin (n/a below 20 records)
  last class    the position where the last class to appear comes out first (a buffer
  from, last p  over label-sorted data keeps whole classes out of the early epoch), and
                the chance a uniform shuffle shows a class that late
  labels/batch  mean distinct labels in a batch, next to what a fair shuffle gives
  verdict       NOT UNIFORM when the smallest p-value times the number of tests is below
                0.001; otherwise "looks uniform" if, at this many records, the tests would
                flag the buffer compared with, else "too small to tell"

The label must be a class: one integer (or string, or one-hot vector) a record; a float
feature, several values a record or nearly one value a record are refused (exit 2): pass
--label-key naming an integer class feature.

With --weights, each PATH is a dataset of its own and the report shows what a
shardfeed.Mixture of them realises in one epoch: each source's outputs and share, the passes
over it and the most times a record comes in one pass (1), and its share of each batch beside
what a uniform shuffle gives; --balanced does the same for the classes of one dataset.

PATH is a dataset folder, a manifest, a folder of TFRecord files, a glob or TFRecord files;
or a .npy file of labels (one per record, stored order) to ask what a buffer would do to data
sorted like that, without any shards.

examples:
  shardfeed shuffle-report data/train --out report/        # table + two PNG plots
  shardfeed shuffle-report data/train --buffer 1000 --file-shuffle
  shardfeed shuffle-report 'shards/train-*.tfrecord' --label-key label --json
  shardfeed shuffle-report labels.npy --buffer 10000       # labels only, no shards
  shardfeed shuffle-report data/a data/b --weights 0.7 0.3 # a mixture: realised shares
  shardfeed shuffle-report data/train --balanced           # class-balanced draws
"""

from __future__ import annotations

import argparse
import textwrap
from typing import Any

from shardfeed.cli import common

NAME = "shuffle-report"
HELP = "measure how random an epoch is: exact shuffle vs a shuffle buffer (table, plots)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "source", nargs="+", metavar="PATH",
        help="dataset folder, manifest, folder of TFRecord files, glob, files, or labels.npy",
    )
    parser.add_argument(
        "--label-key", default=None, metavar="K",
        help="label feature (default: the schema's label, else image/class/label)",
    )
    parser.add_argument(
        "--buffer", type=common.positive_int, default=10_000, metavar="B",
        help="shuffle buffer size to compare with (default: 10000)",
    )
    mix = parser.add_mutually_exclusive_group()
    mix.add_argument(
        "--weights", type=float, nargs="+", default=None, metavar="W",
        help="each PATH is a dataset of its own, mixed with these weights (one a PATH): "
             "report the proportions each epoch and batch realise (shardfeed.Mixture)",
    )
    mix.add_argument(
        "--balanced", action="store_true",
        help="report a class-balanced mixture of the dataset's labels "
             "(shardfeed.Mixture.balanced; reads the label of every record)",
    )
    parser.add_argument("--seed", type=common.non_negative_int, default=0, metavar="S",
                        help="shuffle seed (default: 0)")
    parser.add_argument("--epoch", type=common.non_negative_int, default=0, metavar="E",
                        help="epoch whose order is measured (default: 0)")
    parser.add_argument(
        "--file-shuffle", action="store_true",
        help="also measure shards read in shuffled order followed by the buffer",
    )
    parser.add_argument("--batch", type=common.positive_int, default=256, metavar="N",
                        help="batch size for labels per batch (default: 256)")
    parser.add_argument("--out", default=None, metavar="DIR",
                        help="write position_vs_index.png and label_vs_position.png here")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    common.add_dataset_options(parser)
    common.add_progress(parser)


class _Bar:
    """A tqdm bar created on the first report, shown only if reading lasts over a second."""

    def __init__(self) -> None:
        self._bar: Any = None

    def __call__(self, done: int, total: int) -> None:
        if self._bar is None:
            from tqdm import tqdm

            self._bar = tqdm(total=total, unit="rec", unit_scale=True, delay=1.0,
                             desc="reading labels", leave=False)
        self._bar.update(done - self._bar.n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def _p_value(p: float | None) -> str:
    if p is None:
        return "n/a"
    if p == 0.0:
        return "<1e-300"
    return f"{p:.2g}" if p < 0.01 else f"{p:.2f}"


_VERDICTS = {"not uniform": "NOT UNIFORM", "looks uniform": "looks uniform",
             "too small to tell": "too small to tell"}
_TEST_NAMES = {"rho": "rho p", "chi2": "chi2 p", "last_class": "last p"}


def _explain(report: dict[str, Any]) -> list[str]:
    """What the verdicts mean at this n: the rule, and what the tests can and cannot see."""
    tests = report["tests"]
    n, m = report["records"], len(tests["tests"])
    run = ", ".join(_TEST_NAMES[t] for t in tests["tests"])
    rule = (f"verdict: NOT UNIFORM when the smallest p-value ({run}) times {m} is below "
            f"{tests['alpha']:g}; a uniform shuffle is flagged 1 time in {1 / tests['alpha']:,.0f}.")
    limit = tests["rho_limit"]
    seen = f"at {common.count(n, 'record')} " + (
        "the rank test cannot flag any rho" if limit > 1
        else f"a uniform shuffle keeps |rho| below {limit:.3f}"
    )
    last = tests["latest_first_position"]
    if last is not None:
        seen += (f"{', and a uniform shuffle' if limit > 1 else ' and'} shows every class before position "
                 f"{last['limit']:,} (half the time before {last['typical']:,})")
    buffer = f"a buffer of {report['buffer_size']:,}"
    if tests["reference"] == "buffer":
        bias = (f"{buffer} over {common.count(n, 'record')} gives rho "
                f"{tests['reference_rho']:+.3f} on average, which these tests")
    else:
        bias = (f"{buffer} holds every record, so it is a uniform shuffle too; an unshuffled "
                f"order is what these tests")
    if tests["can_tell"]:
        meaning = "flag more often than not: 'looks uniform' means no sign of such a bias."
    else:
        meaning = "would miss more often than not: too small to tell; more records would tell."
    return textwrap.wrap(rule, 100, initial_indent="  ", subsequent_indent="    ") + \
        textwrap.wrap(f"{seen}; {bias} {meaning}", 100, initial_indent="  ",
                      subsequent_indent="    ")


def format_table(report: dict[str, Any]) -> str:
    """The text summary printed by the command."""
    classes = report["classes"]
    labelled = classes is not None
    what = common.count(report["records"], "record")
    if labelled:
        what += ", " + common.count(classes, "class")
        if report["label_key"]:
            what += f" in {report['label_key']!r}"
    lines = [
        f"shuffle report: {report['source']}",
        (
            f"  {what}; seed {report['seed']}, epoch {report['epoch']}, "
            f"buffer {report['buffer_size']:,}, batch {report['batch_size']:,}"
        ),
        "",
    ]
    header = f"  {'order':<32} {'rho':>6} {'rho p':>7} {'displ.':>6} {'chi2 p':>7}"
    if labelled:
        header += f" {'last class from':>17} {'last p':>7} {'labels/batch':>12}"
    lines += [header + "  verdict", "  " + "-" * (len(header) + 16)]
    for stats in report["orders"].values():
        row = (
            f"  {stats['description']:<32} {stats['spearman_rho']:>+6.3f} "
            f"{_p_value(stats['rho_p_value']):>7} {stats['mean_abs_displacement']:>6.3f} "
            f"{_p_value(stats['chi2_p_value']):>7}"
        )
        if labelled:
            label = str(stats["latest_label"])
            label = label if len(label) <= 8 else label[:7] + "\u2026"
            latest = f"{stats['latest_first_position']:,} ({label})"
            row += (f" {latest:>17} {_p_value(stats['last_class_p_value']):>7}"
                    f" {stats['mean_labels_per_batch']:>12.2f}")
        lines.append(row + "  " + _VERDICTS[stats["verdict"]])
    fair = f"  {'a uniform shuffle gives':<32} {'~0':>6} {'':>7} {'~0.333':>6} {'':>7}"
    if labelled:
        last = report["tests"]["latest_first_position"]
        typical = "" if last is None else f"~{last['typical']:,}"
        fair += f" {typical:>17} {'':>7} {report['expected_labels_per_batch']:>12.2f}"
    lines += [fair.rstrip(), ""] + _explain(report)
    if report["plots"]:
        lines += ["", "plots: " + ", ".join(report["plots"].values())]
    return "\n".join(lines)


def _run_mixture(args: argparse.Namespace, sources: list[str]) -> int:
    """--weights (one dataset a PATH) or --balanced (the classes of one dataset)."""
    from shardfeed.dataset import Dataset
    from shardfeed.pipeline.mixture import Mixture
    from shardfeed.tools.shuffle_report import mixture_report, read_labels
    from shardfeed.tools.shuffle_report.labels import label_key_of
    from shardfeed.tools.shuffle_report.mixture import format_mixture

    if args.weights is not None and len(args.weights) != len(sources):
        raise ValueError(f"--weights has {len(args.weights)} value(s) for {len(sources)} "
                         "PATH(s): give one weight a dataset")
    options = common.dataset_options(args)
    opened = [Dataset(path, **options) for path in sources] if args.weights is not None \
        else [Dataset(sources if len(sources) > 1 else sources[0], **options)]
    bar = _Bar() if common.show_progress(args) else None
    try:
        if args.weights is not None:
            mixture, names = Mixture(opened, args.weights), list(sources)
        else:
            key = label_key_of(opened[0], args.label_key)
            if key is None:
                raise ValueError("--balanced needs each record's class: pass --label-key "
                                 "naming an integer class feature")
            labels = read_labels(opened[0], key, progress=bar)
            mixture = Mixture.balanced(opened[0], labels)
            names = [f"class {c}" for c in mixture.classes or []]
    finally:
        if bar is not None:
            bar.close()
    try:
        report = mixture_report(mixture, seed=args.seed, epoch=args.epoch,
                                batch_size=args.batch)
    finally:
        for dataset in opened:
            dataset.close()
    report["names"] = names
    if args.json:
        common.print_json(report)
    else:
        print(format_mixture(report, names))
    return 0


def run(args: argparse.Namespace) -> int:
    from shardfeed.tools.shuffle_report import shuffle_report

    if args.weights is not None or args.balanced:
        return _run_mixture(args, list(args.source))
    sources: list[str] = list(args.source)
    source: Any = sources[0]
    opened: Any = None
    if len(sources) == 1 and sources[0].endswith(".npy"):
        import numpy as np

        if args.file_shuffle:
            raise ValueError(
                f"--file-shuffle needs shards, and {sources[0]} holds labels only: "
                f"give the dataset path instead"
            )
        source = np.load(sources[0], allow_pickle=False)
    elif len(sources) > 1:
        from shardfeed.dataset import Dataset

        source = opened = Dataset(sources, **common.dataset_options(args))
    bar = _Bar() if common.show_progress(args) else None
    try:
        report = shuffle_report(
            source, label_key=args.label_key, buffer_size=args.buffer, seed=args.seed,
            epoch=args.epoch, file_shuffle=args.file_shuffle, batch_size=args.batch,
            out_dir=args.out, progress=bar,
            **common.dataset_options(args),
        )
    finally:
        if bar is not None:
            bar.close()
        if opened is not None:
            opened.close()
    report["source"] = " ".join(sources)
    if args.json:
        common.print_json(report)
    else:
        print(format_table(report))
    return 0
