"""Where the GPU path's time goes: its CPU half, its device half and the decoder, apart.

``presets.train(224, decode_on="cuda")`` over generated 500x375 JPEGs (the node bench's
data), batch B, N threads:

- ``cpu-half@T``: the loader alone at T threads, every one held (boxes drawn, code streams
  parsed by its threads), batches kept in memory;
- ``device-half``: the device stage called on those kept batches one after the other on the
  calling thread, synchronised at the end: what the stage costs with no CPU half to wait on;
- ``decoder``: nvImageCodec's batched decode of the same parsed streams, nothing else;
- ``whole@P``: the path as users run it (``shardfeed.torch.adapt(..., device="cuda")``, N
  threads) with P of them planning at once (``torch_decode.PLAN_THREADS``; the default
  marked);

then the device half's top functions under cProfile (cumulative seconds).

    python bench/profile_gpu_path.py [--images 4096] [--batch 256] [--threads N] [--device cpu]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_node import JPEG_H, JPEG_W, TRAIN_SIZE, make_jpegs, write_jpeg_shards


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--images", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    args = parser.parse_args(argv)
    import torch

    import shardfeed
    from shardfeed.dataset import Dataset
    from shardfeed.loaders import torch_decode
    from shardfeed.loaders.torch_decode import DeviceDecode, plan_of
    from shardfeed.pipeline import Loader
    from shardfeed.transforms import presets

    n = args.threads or len(os.sched_getaffinity(0))
    device = torch.device(args.device)
    lines = [(f"GPU path apart: {args.images} JPEGs {JPEG_W}x{JPEG_H}, batch {args.batch}, "
              f"{n} threads, device {device}")]
    with tempfile.TemporaryDirectory(prefix="shardfeed-gpu-") as tmp:
        jpegs = make_jpegs(args.images, JPEG_H, JPEG_W, threads=n, seed=7)
        folder = write_jpeg_shards(Path(tmp) / "jpeg", jpegs, JPEG_H, JPEG_W, shards=8,
                                   files=False)
        del jpegs

        def loader_of(ds: Any, threads: int = n, held: bool = False) -> Any:
            return Loader(ds, batch_size=args.batch, shuffle=True, seed=0, num_threads=threads,
                          transform=presets.train(size=TRAIN_SIZE, decode_on="cuda"),
                          prefetch_batches=4, drop_last=True, adaptive_threads=not held)

        counts = sorted({1, 2, 4, n})
        with Dataset(str(folder)) as ds:
            stage = None
            for threads in counts:
                loader = loader_of(ds, threads, held=True)
                plan = plan_of(loader.transform)
                assert plan is not None
                stage = stage or DeviceDecode(plan, device)
                plan.streams = stage.mode
                for _ in zip(range(2), loader):  # warm: threads settled, decoder built
                    pass
                loader.set_epoch(1)
                start = time.perf_counter()
                kept = list(loader)
                cpu_s = time.perf_counter() - start
                loader.close()
                images = sum(len(b["plan/encoded"]) for b in kept)
                lines.append(f"cpu-half@{threads:<3d} {images / cpu_s:9.0f} img/s  "
                             f"({len(kept)} batches)")
            assert stage is not None

            for batch in kept[:2]:  # warm the device half
                stage(dict(batch), None)
            _sync(device)
            start = time.perf_counter()
            for batch in kept:
                stage(dict(batch), None)
            _sync(device)
            dev_s = time.perf_counter() - start
            lines.append(f"device-half  {images / dev_s:9.0f} img/s")

            streams = [[b["plan/stream"][r] for r in range(len(b["plan/encoded"]))
                        if not b["plan/on_cpu"][r]] for b in kept]
            start = time.perf_counter()
            decoded = 0
            for work in streams:
                decoded += len(stage.decoder.decode(work, params=stage.params,
                                                    cuda_stream=stage.streams.handle))
            _sync(device)
            lines.append(f"decoder      {decoded / (time.perf_counter() - start):9.0f} img/s "
                         "(the same parsed streams)")

            profile = cProfile.Profile()
            profile.enable()
            for batch in kept:
                stage(dict(batch), None)
            _sync(device)
            profile.disable()
            stage.close()

            default = torch_decode.PLAN_THREADS
            for planning in counts:
                torch_decode.PLAN_THREADS = planning
                with shardfeed.torch.adapt(loader_of(ds), device=str(device)) as adapted:
                    count, start = 0, 0.0
                    for k, batch in enumerate(adapted):
                        if k == 2:
                            _sync(device)
                            start, count = time.perf_counter(), 0
                        count += int(batch["image"].shape[0])
                    _sync(device)
                mark = " (default)" if planning == default else ""
                lines.append(f"whole@{planning:<6d}{count / (time.perf_counter() - start):9.0f}"
                             f" img/s{mark}")
            torch_decode.PLAN_THREADS = default
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(22)
    print("\n".join(lines))
    print(text.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
