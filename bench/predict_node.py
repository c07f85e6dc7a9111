"""Predict the training node's 16-thread figures from this (small) machine, calibrated
against the node's own table in README.

A process on many cores is bounded two ways: by its cores (the one-thread rate times the
threads, times how well the node's cores scale: its JPEG decode made 7,510 images/s on 16
threads against 596 on one, ``eff`` = 0.79 of 16×), and by what one thread at a time can do
(the GIL: Python, NumPy's small operations, the record parser, every hand-over). For each of
the node bench's cases this script measures, on one loader thread:

    r1   items/s
    g    µs of CPU an item in code that holds the GIL: ``perf record -g`` samples of the
         process, each put on the side of the first library on its stack whose calls hold
         the GIL (libpython, NumPy, the compiled parser) or release it (the JPEG and PNG
         decoders, OpenCV, nvImageCodec, zlib, the compiled slice); C-library samples whose
         caller cannot be told are counted apart (``libc``)
    d1   the full JPEG decode on one thread: ``k`` = 596 / d1 scales this machine's core to
         the node's

(the node bench's cases at the node's batches: the train preset at 256, 28² PNG at 256,
Patches 32² of 200 images of 1566² at 256), and predicts ``min(16 · eff · r1 · k, u · k /
g)``. The one thread builds the slices the gate cuts with 16 threads on the node
(``--slices node``, the default: :func:`slices_as_on_node`, the gate's CPU time a sample
scaled by ``1 / k``, among the batches the node builds at once, at the gate's choice of
every thread: 28² PNG 4 whole batches a slice among 64 since slices may hold several, a
batch a slice among 16 before that, 64 items a slice before that; Patches a batch a slice
among 16; the train
preset's 16 before the gate gave many threads larger slices, about 43 since), so that a
slice's own costs (submitting it, the gate, its plan and draws, its hand-over) count as
often an item as on the node: a one-thread loader here builds a
whole batch a slice, and with them (``--slices one``, train at 64 a batch as before) the
train preset read 19-21 GIL µs an image where 16-image slices read 35-51. With the node's
slices the ``u`` each case implies on the node run's code lies closer together: 0.42-0.51
/ 0.49-0.63 / 0.53-0.69 in eight runs (one ``u`` within ±11-19% of each in seven, ±28% in
one), against 0.33-0.34 / 0.29-0.37 / 0.47-0.48 in two with one thread's slices (±24%,
±31%). The train set here is
``Sizes.quick``'s 768 JPEGs: 3 batches of 256 an epoch against the node's 31, so each
epoch's start (its order, its pass) counts about 10× as often an image as there.

NumPy is counted as holding the GIL (it lets go only
for large arrays: a patch's copy is small); perf's rate is taken as asked (``HZ``). ``u`` is the one fitted constant: the
share of a core's time in which a process of 16 threads gets its serial part done, hand-
overs and waits included. Fitted on the node table in README (train 4,633, 28² PNG 355,553,
Patches 4,974 images/s at 16 threads), with this script run here on the code of that run
(f4c1452): the ``u`` each case implies, ``node · g / k``, was 0.46 / 0.43 / 0.50 in one run
and 0.44 / 0.47 / 0.49 in another; ``u`` = 0.46 (about their geometric mean) then predicted
the three within 8% (1.00 / 1.08 / 0.92 and 1.04 / 0.98 / 0.95 of the node) that day. This
machine's figures drift from day to day (f4c1452's train read 51-53 GIL µs that day, 38-45
on a later one, when the cases implied 0.33 / 0.39-0.43 / 0.56 and one ``u`` fitted them
within about ±25%): ``--baseline`` measures f4c1452 beside this code, run for run, and fits
``u`` in the same session, which is the figure to judge a change by. A probe thread that
waits for the GIL was tried first and read 97 µs for a thread known to hold it 10 µs (this
virtual machine's thread wake-ups): not a measure.

    .venv/bin/python bench/predict_node.py                 # ~3 minutes on 2 cores
    .venv/bin/python bench/predict_node.py --cases train   # one case
    git worktree add /tmp/node f4c1452 && (cd /tmp/node && python setup.py build_ext --inplace)
    .venv/bin/python bench/predict_node.py --baseline /tmp/node/src   # ~6 minutes
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_node  # the node bench's data and cases

NODE_DECODE_1 = 596.0  # the node, full decode (simplejpeg), one thread (README)
NODE_DECODE_16 = 7510.0  # the same, 16 threads
NODE_SEEN = {"train": 4633.0, "png28": 355553.0, "patches": 4974.0}
"""The node's 16-thread figures (README), of the code at f4c1452: other code is compared to
them as a change, not a check."""
U = 0.46
"""The share of a core's time in which a process of 16 threads gets its serial part done,
fitted on the node table (see the module doc), on the day of the node run and before
:data:`RELEASING_FUNCTIONS` (which moves it about 3% lower); ``--baseline`` fits it anew."""
CORES = 16
HZ = 1999  # perf's samples a second of a thread's CPU time
BIG_IMAGES, CACHE_IMAGES, REFRESH = 200, 64, 100  # the node bench's Patches set

RELEASES = ("libjpeg_turbo", "_jpeg.cpython", "cv2.abi3", "libnvimgcodec", "nvimgcodec_impl",
            "_png.cpython", "_slice.cpython", "_jpeg_frames", "libz.so", "libdeflate",
            "_draws.cpython", "_jpeg_rows.cpython", "libjpeg.so", "_jpeg_record.cpython")
"""Libraries whose work runs with the GIL released (their calls let it go; ``_slice`` and
``_jpeg_record`` hold it only to take their arguments and build their results)."""
HOLDS = ("libpython", "_multiarray", "_umath", "_wire.cpython", "_generator",
         "_philox", "bit_generator", "_bounded", "math.cpython", "_struct", "crc32c",
         "_queue", "_bisect")
"""Libraries whose work runs holding the GIL."""


RELEASING_FUNCTIONS = ("crc_instruction", "gather_copy")
"""Functions of a library on the ``HOLDS`` list counted as running with the GIL released:
the record gather's copy and its CRC (``_wire``). The gathers let it go for 64 KiB or more
a call, as every gather of the cases here is (a 1566² JPEG's record is 945 KB; 64 train
records ~5 MB; 256 28² PNG records ~180 KB, read with their columns). Not so elsewhere: a
smaller gather, and ``unframe`` under 1 MiB, run the same CRC holding the GIL, and the
frames above it cannot be told apart here (the extension keeps no frame pointers), so this
rule is for these cases only. Counted as held, the CRC was 4.6 µs an image of this code's
train, 0.7 a patch, 0.08 a 28² PNG; on the code of the node run (f4c1452) it moved train's
figure 8-10%, Patches' 1.1%, 28² PNG's none."""


def classify(stack: list[str], symbols: list[str] | None = None) -> str:
    """``held``, ``released``, or ``libc`` / ``other`` where no library on the stack says
    (``symbols``: the frames' functions, for :data:`RELEASING_FUNCTIONS`)."""
    for at, dso in enumerate(stack):
        if any(name in dso for name in RELEASES):
            return "released"
        if any(name in dso for name in HOLDS):
            # a compiler's copies keep the name before the dot (crc32c.constprop.0)
            if symbols is not None and symbols[at].split(".", 1)[0] in RELEASING_FUNCTIONS:
                return "released"
            return "held"
    first = stack[0] if stack else "?"
    return "libc" if "libc.so" in first else "other"


def samples(perf_data: Path) -> dict[str, int]:
    script = subprocess.run(["perf", "script", "-i", str(perf_data), "-F", "ip,sym,dso"],
                            capture_output=True, text=True, check=True).stdout
    counts: collections.Counter[str] = collections.Counter()
    stack: list[str] = []
    symbols: list[str] = []
    for line in [*script.splitlines(), ""]:
        text = line.strip()
        if not text:
            if stack:
                counts[classify(stack, symbols)] += 1
            stack, symbols = [], []
        elif "(" in text:
            cut = text.rfind("(")
            stack.append(text[cut + 1 : -1].rsplit("/", 1)[-1])
            frame = text[:cut].split(None, 1)  # "ip symbol+offset"
            symbols.append(frame[1].rsplit("+", 1)[0].strip() if len(frame) > 1 else "")
    return dict(counts)


# -- the child: one case on one thread ----------------------------------------------------------


def _loader(case: str, root: Path, slices: str = "node") -> Any:
    from shardfeed.dataset import Dataset
    from shardfeed.pipeline import Loader
    from shardfeed.pipeline.patches import Patches
    from shardfeed.transforms import DecodeImage, presets

    sizes = bench_node.Sizes.quick()
    if case == "train":
        source: Any = Dataset(str(root / "jpeg500"))
        transform: Any = presets.train(size=224)
        # the node's batch where its slices are cut as there (a slice a thread of 16)
        batch = bench_node.Sizes.node().batch if slices == "node" else sizes.batch
    elif case == "png28":
        source, transform = Dataset(str(root / "png28-node")), DecodeImage(channels="gray")
        batch = 256
    else:
        source = Patches(Dataset(str(root / "big200")), size=32, cache_images=CACHE_IMAGES,
                         refresh_every=REFRESH)
        transform, batch = None, sizes.patch_batch
    return Loader(source, batch_size=batch, shuffle=True, seed=0, transform=transform,
                  num_threads=1, prefetch_batches=4, drop_last=True)


def slices_as_on_node(threads: int = CORES, cpu_scale: float = 1.0) -> None:
    """Make this process's loaders cut their batches into the slices the slice gate cuts
    with ``threads`` threads building at once on the node (a batch over the threads, or
    larger where the gate enlarges them), while one thread builds them: each slice's own
    costs (submitting it, the gate, its plan, its images' lookups and features) are then
    paid as often an item as on the node. With the one-thread loader's own slices (a whole
    batch) the node pays them 4 to 16 times as often as measured here. The gate's own rule
    does the cutting, asked as if ``threads`` ran and with its CPU time a sample times
    ``cpu_scale`` (the node's cores: ``1 / k``, about 1.9), among the batches the node's
    loader builds at once (``batches_in_flight`` at ``threads``)."""
    import dataclasses

    from shardfeed.pipeline import loader as loader_module
    from shardfeed.pipeline.concurrency import SliceGate

    cut = SliceGate.slice_size
    in_flight = getattr(loader_module, "batches_in_flight", None)  # not in older code

    def batches_in_flight(options: Any, batch_bytes: int, **given: Any) -> int:
        # the batches the node's loader builds at once (more than one thread's, where its
        # batches are small: its slices are cut among them; a sampler's cache sized for them)
        assert in_flight is not None
        return int(in_flight(dataclasses.replace(options, num_threads=threads), batch_bytes,
                             **given))

    def slice_size(self: Any, base: int, batch: int, ahead: int) -> int:
        limit, every, cpu = self.limit, self._all, self._sample_cpu
        chosen, wait = getattr(self, "_chosen", None), getattr(self, "_wait_left", None)
        # read back at once: the one thread builds alone (a measure it adds meanwhile is
        # lost at worst). At the node's choice of every thread, between trials, as the
        # node's gate is nearly all the time (trials cost at most BUDGET of a run)
        self.limit = self._all = threads
        self._sample_cpu = cpu * cpu_scale
        self._chosen, self._wait_left = True, 1.0
        try:
            return int(cut(self, -(-batch // threads), batch, ahead))
        finally:
            self.limit, self._all, self._sample_cpu = limit, every, cpu
            self._chosen, self._wait_left = chosen, wait

    SliceGate.slice_size = slice_size  # type: ignore[method-assign]
    if in_flight is not None:
        loader_module.batches_in_flight = batches_in_flight


def child(case: str, root: Path, seconds: float, ready: Path, slices: str = "node",
          cpu_scale: float = 1.0) -> None:
    """Run ``case`` on one thread (its slices cut as on the node, ``slices="node"``, or as
    one thread cuts them, ``"one"``): warm up, say so in ``ready``, count items for
    ``seconds``, print ``{"rate": items/s, "code": where shardfeed is, "compiled": whether
    its compiled parser loaded}``."""
    import shardfeed
    from shardfeed.format import native

    if slices == "node":
        slices_as_on_node(cpu_scale=cpu_scale)
    with _loader(case, root, slices) as loader:
        batches = bench_node.endless(loader, bench_node._labels)
        warm = time.perf_counter()
        while time.perf_counter() - warm < min(seconds, 3.0):
            next(batches)
        told = ready.with_suffix(".part")  # renamed whole: the parent never reads it half
        told.write_text(str(os.getpid()))
        told.replace(ready)
        items, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            items += next(batches)
        print(json.dumps({"rate": items / (time.perf_counter() - start),
                          "code": shardfeed.__file__, "compiled": native.wire is not None}))


def measure(case: str, root: Path, seconds: float, src: str | None = None,
            slices: str = "node", cpu_scale: float = 1.0) -> tuple[float, dict[str, int]]:
    """(items/s on one thread, its CPU samples by kind, at ``HZ`` a busy thread) of
    ``case``, in a child process sampled by perf for ``seconds`` (``src``: the ``src``
    folder of another checkout whose code the child runs)."""
    env = None
    if src is not None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [src, *filter(None, [os.environ.get("PYTHONPATH")])])}
    with tempfile.TemporaryDirectory() as tmp:
        ready = Path(tmp) / "ready"
        run = subprocess.Popen(
            [sys.executable, __file__, "--child", case, "--data", str(root),
             "--seconds", str(seconds + 2), "--ready", str(ready), "--slices", slices,
             "--cpu-scale", str(cpu_scale)],
            stdout=subprocess.PIPE, text=True, env=env)
        while not ready.exists():
            if run.poll() is not None:
                raise RuntimeError(f"the {case} case ended before it was measured")
            time.sleep(0.05)
        data = Path(tmp) / "perf.data"
        subprocess.run(["perf", "record", "-q", "-F", str(HZ), "-g", "-p", ready.read_text(),
                        "-o", str(data), "--", "sleep", str(seconds)],
                       check=True, capture_output=True)
        out, _ = run.communicate(timeout=seconds + 120)
        counted = samples(data)
    said = json.loads(out.strip().splitlines()[-1])
    if not said["compiled"]:
        raise RuntimeError(f"the {case} case ran without its compiled parts ({said['code']}): "
                           "build them (python setup.py build_ext --inplace) and run again")
    if src is not None and not Path(said["code"]).resolve().is_relative_to(Path(src).resolve()):
        raise RuntimeError(f"the baseline's {case} case ran {said['code']}, not the code in "
                           f"{src}")
    return float(said["rate"]), counted


def decode_rate(folder: Path, seconds: float) -> float:
    import simplejpeg

    from shardfeed.dataset import Dataset

    with Dataset(str(folder)) as ds:
        payloads = [bytes(cast(bytes, r["image/encoded"]))
                    for r in ds.read_many(list(range(min(256, len(ds)))))]

    def batches() -> Iterator[int]:
        with ThreadPoolExecutor(1) as pool:
            while True:
                for _ in pool.map(simplejpeg.decode_jpeg, payloads):
                    pass
                yield len(payloads)

    made = batches()
    next(made)
    rates = []
    for _ in range(3):
        items, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds / 3:
            items += next(made)
        rates.append(items / (time.perf_counter() - start))
    return statistics.median(rates)


def build(root: Path) -> None:
    """The node bench's data, small (``Sizes.quick``), and its 28² PNG and Patches sets at
    full size: an epoch's own costs (its order, its pass's start and end) then count as
    often an item as on the node (60,000 PNGs: 234 batches an epoch, where the quick set's
    8,192 made 32)."""
    if not (root / "built").exists():
        bench_node.build_data(root, bench_node.Sizes.quick(), threads=2)
        (root / "built").write_text("ok")
    if not (root / "png28-node" / "built").exists():
        bench_node.make_png28(root / "png28-node", bench_node.Sizes.node().pngs)
        (root / "png28-node" / "built").write_text("ok")
    if not (root / "big200" / "built").exists():
        side = bench_node.Sizes.node().big_side
        big = bench_node.make_jpegs(BIG_IMAGES, side, side, threads=2, seed=11)
        bench_node.write_jpeg_shards(root / "big200", big, side, side, shards=4, files=False)
        (root / "big200" / "built").write_text("ok")


def per_item(runs: list[tuple[float, dict[str, int]]], kind: str, seconds: float) -> float:
    """CPU µs an item of samples of ``kind``, every thread: the median of the runs."""
    return statistics.median(part.get(kind, 0) / HZ / (rate * seconds) * 1e6
                             for rate, part in runs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--cases", default="train,png28,patches")
    parser.add_argument("--seconds", type=float, default=6.0, help="perf's window a run")
    parser.add_argument("--repeats", type=int, default=3, help="runs a case (medians)")
    parser.add_argument("--data", help="folder for the generated data (kept between runs)")
    parser.add_argument("--baseline", metavar="SRC", help=(
        "the src folder of a checkout of the node run's code (f4c1452): measured too, each "
        "run beside one of this code's, and u fitted on it in this session, not taken from "
        "the module (this machine's figures drift from day to day)"))
    parser.add_argument("--slices", choices=("node", "one"), default="node", help=(
        "node: each batch cut into the slices the gate cuts with 16 threads (the node's "
        "train batch of 256); one: as one thread cuts them (a whole batch, train at 64)"))
    parser.add_argument("--json", help="write the rows here too")
    parser.add_argument("--cpu-scale", type=float, default=1.0, help=argparse.SUPPRESS)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--ready", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    root = Path(args.data or Path(tempfile.gettempdir()) / "shardfeed-predict")
    if args.child:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        child(args.child, root, args.seconds, Path(args.ready), args.slices, args.cpu_scale)
        return 0
    if shutil.which("perf") is None:
        parser.error("needs Linux perf (`perf record`): apt install linux-perf")
    if args.baseline and not (Path(args.baseline) / "shardfeed").is_dir():
        parser.error(f"--baseline {args.baseline}: no shardfeed package there; give the src "
                     "folder of a checkout (git worktree add /tmp/node f4c1452, then build "
                     "its compiled parts: python setup.py build_ext --inplace)")
    root.mkdir(parents=True, exist_ok=True)
    build(root)
    d1 = decode_rate(root / "jpeg500", 3.0)
    k = NODE_DECODE_1 / d1
    eff = NODE_DECODE_16 / (CORES * NODE_DECODE_1)
    cases = args.cases.split(",")
    unknown = sorted(set(cases) - set(NODE_SEEN))
    if unknown:
        parser.error(f"--cases: no case {', '.join(unknown)}; the cases are "
                     f"{','.join(NODE_SEEN)}")
    measured: dict[str, list[tuple[float, dict[str, int]]]] = {}
    base: dict[str, list[tuple[float, dict[str, int]]]] = {}
    for case in cases:
        for repeat in range(args.repeats):
            # interleaved, in turns (baseline first, then this code first): neither order
            # always gets the machine as the other left it
            order = [("this", None), ("baseline", args.baseline)] if args.baseline else [
                ("this", None)]
            for code, src in order[:: 1 if repeat % 2 else -1]:
                into = base if code == "baseline" else measured
                into.setdefault(case, []).append(
                    measure(case, root, args.seconds, src, args.slices, 1 / k))
    u = U
    if base:
        # u each case implies on the baseline (node = u·k/g): their geometric mean
        implied = {case: NODE_SEEN[case] * per_item(base[case], "held", args.seconds) * 1e-6 / k
                   for case in cases}
        u = statistics.geometric_mean(implied.values())
        print("u implied by the baseline, case by case: "
              + ", ".join(f"{case} {value:.3f}" for case, value in implied.items()))
    print(f"full decode, 1 thread: {d1:,.0f} images/s here; k = {k:.2f} (node / here); "
          f"eff = {eff:.2f} (node's decode at {CORES} threads / {CORES}x one); "
          f"u = {u:.3f}{' (fitted now)' if base else ''}")
    print(f"{'case':<9}{'code':<10}{'1 thread':>10}{'GIL us':>8}{'libc us':>9}"
          f"{'cores bound':>13}{'GIL bound':>11}{'predicted':>11}{'x 1 thread':>11}"
          f"{'node f4c1452':>14}{'ratio':>8}")
    rows = []
    for case in cases:
        for code, runs in (("baseline", base.get(case)), ("this", measured[case])):
            if not runs:
                continue
            r1 = statistics.median(rate for rate, _ in runs)
            held = per_item(runs, "held", args.seconds)
            libc = per_item(runs, "libc", args.seconds)
            cores_bound = CORES * eff * r1 * k
            gil_bound = u * k / (held * 1e-6)
            predicted = min(cores_bound, gil_bound)
            scaling = predicted / (r1 * k)  # against one thread of the node, predicted
            seen = NODE_SEEN.get(case)
            ratio = f"{predicted / seen:>7.2f}x" if seen else f"{'':>8}"
            print(f"{case:<9}{code:<10}{r1:>10,.0f}{held:>8.2f}{libc:>9.2f}{cores_bound:>13,.0f}"
                  f"{gil_bound:>11,.0f}{predicted:>11,.0f}{scaling:>10.1f}x{seen or 0:>14,.0f}"
                  f"{ratio}")
            rows.append({"case": case, "code": code, "one_thread": r1, "gil_us": held,
                         "libc_us": libc, "samples": runs[0][1], "cores_bound": cores_bound,
                         "gil_bound": gil_bound, "predicted": predicted,
                         "times_one_thread": scaling, "node": seen})
    if args.json:
        Path(args.json).write_text(json.dumps({"k": k, "eff": eff, "u": u, "rows": rows},
                                              indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
