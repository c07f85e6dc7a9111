"""Which records a training step held, on every rank: shard, record, byte offset, label.

The batch of any step is computed from a loader state the run saved (loader.state()
written as JSON): nothing was logged, and any step, past or future, is found in the time of
one batch. The state names the sampler (records, windows, patches) and its options, the
seed, the order and the run's batch size and ranks; what it does not hold (the decode
preset, on_error) is asked here.

examples:
  shardfeed which out/ --state ckpt/loader_state.json --step 41237
  shardfeed which out/ --state s.json --step 900 --rank 3
  shardfeed which out/ --state s.json --step 900 --json
  shardfeed which out/ --state s.json --step 900 --batch-size 32 --state-step 500
      (the run restored s.json at step 500 with another batch size or world size: steps
       are counted from there)
  shardfeed which out/ --state s.json --step 10 --preset train --size 224 \\
      --on-error skip     (a run that skipped bad images: their replacements are shown)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from shardfeed.cli import common

NAME = "which"
HELP = "show which records the batch of a training step held, on every rank"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", help="the dataset the run read (folder, manifest, URL)")
    parser.add_argument("--state", required=True, metavar="STATE.json",
                        help="a loader state the run saved (loader.state() as JSON; a "
                             "LoaderCheckpoint's loader_state.json, or its folder)")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--step", type=common.non_negative_int, metavar="N",
                      help="the step: batches each rank took since the run's start")
    what.add_argument("--record", type=common.non_negative_int, metavar="X",
                      help="the other way round: the steps, ranks and rows at which record X "
                           "is in an epoch's batches (a run over records; over windows every "
                           "window with X among its frames; over patches every patch of X)")
    parser.add_argument("--epoch", type=common.non_negative_int, default=None, metavar="E",
                        help="with --record: the epoch (default the state's)")
    parser.add_argument("--batch-size", type=common.positive_int, default=None, metavar="B",
                        help="the run's batch size (a rank's; default: the state's)")
    parser.add_argument("--world-size", type=common.positive_int, default=None, metavar="W",
                        help="the run's ranks (default: the state's)")
    parser.add_argument("--rank", type=common.non_negative_int, default=None, metavar="R",
                        help="show this rank only (default: every rank)")
    parser.add_argument("--state-step", type=common.non_negative_int, default=None,
                        metavar="S", help="the step at which the run saved or restored the "
                        "state, when it changed its batch size or ranks there: steps are then "
                        "counted from the state")
    parser.add_argument("--preset", choices=("train", "eval"), default=None,
                        help="the run's decode preset (decides which images are bad)")
    parser.add_argument("--size", type=common.positive_int, default=224,
                        help="the preset's output size (default 224)")
    parser.add_argument("--on-error", choices=("raise", "skip"), default="raise",
                        help="the run's on_error: 'skip' shows each bad sample's replacement")
    parser.add_argument("--drop-last", action="store_true", default=None,
                        help="the run dropped an epoch's last, shorter batch (drop_last=True; "
                             "default: the state's)")
    parser.add_argument("--remainder", choices=("pad", "drop"), default=None,
                        help="the run's remainder: how ranks share an epoch's last samples "
                             "(default: the state's)")
    parser.add_argument("--exif-orientation", choices=("ignore", "apply"), default="ignore",
                        help="the run's exif_orientation, for patches and presets (a state "
                             "does not hold it; default ignore, the Loader's)")
    parser.add_argument("--json", action="store_true", help="print the batch as JSON")
    common.add_dataset_options(parser)


def run(args: argparse.Namespace) -> int:
    import shardfeed
    from shardfeed.errors import ShardfeedError
    from shardfeed.pipeline.step_records import loader_state_of

    if args.epoch is not None and args.record is None:
        raise SystemExit("shardfeed which: --epoch goes with --record (a step names its epoch)")
    try:
        state = loader_state_of(_saved(Path(args.state)))
    except (OSError, ValueError) as exc:
        raise SystemExit(f"shardfeed which: cannot read the state {args.state}: {exc} "
                         "(pass the JSON of loader.state() the run saved, or a "
                         "LoaderCheckpoint's loader_state.json or folder)") from None
    if not isinstance(state.get("source"), dict):
        raise SystemExit(f"shardfeed which: {args.state} is not a loader state (a JSON object "
                         "with 'seed', 'epoch', 'consumed' and 'source', from loader.state())")
    _run_options(args, state)
    transform = None
    if args.preset is not None:
        transform = getattr(shardfeed.presets, args.preset)(
            size=args.size, exif_orientation=args.exif_orientation)
    try:
        with _dataset(args, state) as ds:
            source = _sampler(ds, state["source"], args.exif_orientation)
            if args.record is not None:
                return _where(source, state, args)
            found = shardfeed.records_at(
                source, state, args.step, batch_size=args.batch_size,
                world_size=args.world_size, rank=args.rank, state_step=args.state_step,
                transform=transform, on_error=args.on_error, drop_last=args.drop_last,
                remainder=args.remainder)
    except (ShardfeedError, ValueError) as exc:
        raise SystemExit(f"shardfeed which: {exc}") from None
    if args.json:
        common.print_json(found.to_json())
    else:
        print(found)
    return 0


def _dataset(args: argparse.Namespace, state: dict[str, Any]) -> Any:
    """The dataset at the version the state read (a state of version 1 of a dataset appended
    to since opens version 1)."""
    import shardfeed

    options = common.dataset_options(args)
    ds = shardfeed.Dataset(args.source, **options)
    fingerprint = state["source"].get("dataset")
    if not isinstance(fingerprint, str) or fingerprint == ds.fingerprint:
        return ds
    saved = ds.version_with(fingerprint)
    if saved is None or saved == ds.version:
        return ds  # the check of the state names what differs
    ds.close()
    return shardfeed.Dataset(args.source, version=saved, **options)


def _saved(path: Path) -> Any:
    """The JSON of a state file (a LoaderCheckpoint's folder: its ``loader_state.json``)."""
    if path.is_dir():
        path = path / "loader_state.json"
    return json.loads(path.read_text())


def _run_options(args: argparse.Namespace, state: dict[str, Any]) -> None:
    """The run's batch size, ranks, drop_last and remainder: as given, else as the state
    records them (``state["run"]``), else the Loader's defaults (a batch size must be known).
    One given against the state's is said on stderr: the answer is then for a run with it."""
    import sys

    from shardfeed.tools.which import run_options

    saved = state.get("run")
    run: dict[str, Any] = saved if isinstance(saved, dict) else {}
    for name in ("batch_size", "world_size", "drop_last", "remainder"):
        given = getattr(args, name)
        if given is not None and name in run and given != run[name]:
            print(f"shardfeed which: note: the state was saved by a run with "
                  f"{name}={run[name]!r}; answering for {name}={given!r}, as a run with "
                  "it trains", file=sys.stderr)
    try:
        found = run_options(state, batch_size=args.batch_size, world_size=args.world_size,
                            drop_last=args.drop_last, remainder=args.remainder)
    except ValueError:
        raise SystemExit("shardfeed which: pass --batch-size, the run's batch size (this "
                         "state was saved before states recorded it)") from None
    for name, value in found.items():
        setattr(args, name, value)


def _where(source: Any, state: dict[str, Any], args: argparse.Namespace) -> int:
    """Print where record ``args.record`` is in an epoch's batches."""
    from shardfeed.tools.which import record_steps

    epoch = int(state["epoch"]) if args.epoch is None else args.epoch
    places = record_steps(source, state, args.record, epoch, batch_size=args.batch_size,
                          world_size=args.world_size, drop_last=args.drop_last,
                          remainder=args.remainder)
    if args.json:
        common.print_json({"record": args.record, "epoch": epoch,
                           "places": [{"step": s, "rank": r, "row": w} for s, r, w in places]})
    elif not places:
        print(f"record {args.record} is in no batch of epoch {epoch} (a dropped remainder)")
    else:
        for step, rank, row in places:
            print(f"record {args.record}: epoch {epoch}, step {step}, rank {rank}, row {row}")
    return 0


def _sampler(ds: Any, source: dict[str, Any], exif_orientation: Any) -> Any:
    """The sampler the state names, over ``ds``, with the state's options (and the
    ``exif_orientation`` asked, which a Patches state does not hold)."""
    import shardfeed

    kind = source.get("kind", "records")
    if kind == "records":
        return ds
    if kind == "windows":
        return shardfeed.Windows(
            ds, length=int(source["length"]), stride=int(source["stride"] or 1),
            stride_seconds=source.get("stride_seconds"),
            tolerance_seconds=source.get("tolerance_seconds"),
            max_gap_seconds=source.get("max_gap_seconds"), labels=source.get("labels", "last"),
            label_keys=source.get("label_keys"))
    if kind == "patches":
        return shardfeed.Patches(
            ds, size=tuple(source["size"]), scale=source.get("scale"),
            cache_images=int(source["cache_images"]),
            refresh_every=int(source["refresh_every"]), pick=source.get("pick", "stratified"),
            reduced_decode=bool(source.get("reduced_decode", True)),
            exif_orientation=exif_orientation)
    raise SystemExit(f"shardfeed which: the state is of a {kind} sampler, which this command "
                     "does not rebuild; call shardfeed.records_at(source, state, step, ...) "
                     "in Python with the run's source")
