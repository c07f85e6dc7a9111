"""The device half of a decode on the GPU, as a batch stage of the Loader: a batch of planned
JPEG crops decoded, resized, flipped, normalised and laid out on the device, ahead of the
caller, as torch tensors (JAX takes them through DLPack: :mod:`shardfeed.loaders.jax`).

The loader's threads run the CPU half
(:class:`~shardfeed.transforms.decode.device_plan.DevicePlan`, what
``presets.train(..., decode_on="cuda")`` builds): each row's box and flip drawn with its keyed
generator, and its JPEG parsed into the decoder's code stream cut to the box. This stage
(:class:`DeviceDecode`) runs on the Loader's run-ahead thread (``ahead_batches`` batches
before the caller asks, :mod:`shardfeed.pipeline.run_ahead`) on a CUDA stream of its own::

    rows planned for the device    nvImageCodec: one batched decode of the parsed streams
                                   (region decode; ``region_decode=False``: whole images,
                                   the box cut on the device)
    every decoded box at once      resize + flip as two batched matrix products
                                   (:mod:`shardfeed.loaders.device_resize`: area average
                                   when shrinking, bilinear otherwise, as the CPU path)
    rows made on the CPU, and      uploaded; a box the device decoder refuses is made on the
    boxes the decoder refuses      CPU with the op's own pixel work (decode_planned)
    the tail                       normalise / float / CHW as the preset asked
    an event recorded              the batch waits in the run-ahead queue
    hand-out (caller's thread)     the caller's current stream waits on the event, and the
                                   batch's tensors are recorded on that stream

The explicit event is the guard against a decoder whose output is still being written when
another stream reads it (the nvJPEG hardware batch path was reported doing so on H100,
torchvision#9606): nothing reads a batch before its own stream's work is done. A batch whose
region decode raises (nvImageCodec 0.9.0's ROI decode was reported failing on H100,
nvImageCodec#55) is decoded whole and cut on the device; ``region_decode=False`` does that
for every batch.

On a CPU device (``device="cpu"``) the same code runs with nvImageCodec's CPU backend and the
stream and event are no-ops: the path tests take on machines without a GPU.

What to install: nvImageCodec and the nvJPEG wheel of torch's CUDA (``shardfeed[nvimgcodec-cu12]``
or ``[nvimgcodec-cu13]``); where either is missing, the error names the pip line that matches
``torch.version.cuda`` (:func:`~shardfeed.transforms.decode.region.install_hint`), and where
nvImageCodec found no libnvjpeg, the wheel or the ``LD_LIBRARY_PATH`` folder it needs
(:func:`~shardfeed.transforms.decode.region.nvjpeg_hint`). The nvJPEG wheel may lie in another
``sys.path`` folder than nvImageCodec: :func:`~shardfeed.transforms.decode.region.backend`
loads it from there before nvImageCodec's import looks for it.

EXIF orientation: the decoder is handed ``DecodeParams(apply_exif_orientation=False)``
(:func:`~shardfeed.transforms.decode.region.no_turn`; nvImageCodec's default turns a tagged
JPEG), so the device decodes the stored pixels of each box, as every CPU path does by
default; where the plan's op has ``exif_orientation="apply"``, a JPEG its tag turns is made
on the CPU by the plan, never here.

Boxes and flips are the CPU path's for the same seed; pixels are not bit-identical to it (a
GPU IDCT differs from libjpeg, and the CPU path decodes a large box at a DCT scale).

Determinism: a function of the batch (same boxes, flips; the device's own arithmetic).
State: the stage's options (the Loader's counters say which batches were handed out).
Memory: on the device, the batches made ahead, the one being made and the one handed out,
the decoded boxes of the largest batch so far and the resize scratch (``device_bytes`` in
``memory_budget()``); on the host, the parsed streams of the batches being made.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch.utils.dlpack import from_dlpack

from shardfeed.errors import DecodeError
from shardfeed.loaders.device_resize import resize_boxes, row_scratch_bytes
from shardfeed.loaders.numpy import AdaptedLoader
from shardfeed.pipeline.batch_stage import BatchKeys, BatchStageBase
from shardfeed.pipeline.memory import MemoryBudget
from shardfeed.transforms.base import Compose
from shardfeed.transforms.color import IMAGENET_MEAN, IMAGENET_STD
from shardfeed.transforms.decode import region
from shardfeed.transforms.decode.device_plan import (
    PLAN_KEYS,
    DevicePlan,
    StreamMode,
    decode_planned,
    parse_stream,
)

Batch = dict[str, Any]

__all__ = ["DeviceAdapted", "DeviceDecode", "device_stage", "plan_of"]

SCRATCH_BYTES = 1 << 30  # resize scratch on the device: 2 chunks of a batch of 256 at 500x375
PLAN_THREADS = 2
"""The loader's threads that build slices at once under this stage (``slice_threads``). The
CPU half is planning, not decoding: keyed box draws, a code stream parsed per row, rows
written, mostly Python that holds the GIL; and this stage's own thread needs the GIL for every
batch it makes. Measured on the 16-core node (``bench/profile_gpu_path.py``, batch 256,
500x375): the CPU half alone made 7.0k / 13.3k / 21.1k / 11.9k images/s at 1 / 2 / 4 / 16
threads, the whole path 7.3k / 7.5k / 6.8k / 4.8k with that many planning: past two, the
planners take the GIL from the stage and the path slows. Rows the device cannot take (PNG,
CMYK, turned photos) are made on these threads too: a set of mostly such images runs better
with ``decode_on="cpu"``."""


def plan_of(transform: Any) -> DevicePlan | None:
    """The loader's :class:`DevicePlan` (itself, or a Compose's only op), else None."""
    if isinstance(transform, Compose) and len(transform) == 1:
        transform = next(iter(transform))
    return transform if isinstance(transform, DevicePlan) else None


class _Made(dict[str, Any]):
    """A batch made ahead: its ``ready`` event (None on a CPU device) and what the device's
    work on it still reads (``keep``)."""

    ready: Any = None
    keep: Any = None


class _Streams:
    """The stage's side stream and events on a CUDA device; no-ops on the CPU."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.side: torch.cuda.Stream | None = (
            torch.cuda.Stream(device) if device.type == "cuda" else None)  # type: ignore[no-untyped-call]
        self.retired: list[tuple[Any, Any]] = []  # (event, what its work reads)

    @property
    def handle(self) -> int:
        return int(self.side.cuda_stream) if self.side is not None else 0

    def context(self) -> Any:
        return torch.cuda.stream(self.side) if self.side is not None else _NoStream()

    def record(self) -> Any:
        if self.side is None:
            return None
        event = torch.cuda.Event()  # type: ignore[no-untyped-call]
        event.record(self.side)
        return event

    def hand_over(self, made: _Made) -> None:
        """The caller's current stream waits for ``made``; its tensors are marked as used
        there (the allocator reuses them only after the caller's work)."""
        if self.side is None:
            return
        current = torch.cuda.current_stream(self.device)
        current.wait_event(made.ready)
        for value in made.values():
            if isinstance(value, torch.Tensor) and value.device.type == "cuda":
                value.record_stream(current)
        self.retired = [(e, k) for e, k in self.retired if not e.query()]
        self.retired.append((made.ready, made.keep))


class DeviceDecode(BatchStageBase):
    """Make ``plan``'s batches on ``device``, ahead of the caller (see the module doc).

    ``channels_first`` also lays the images out C×H×W (as the plan's ``layout="CHW"`` does);
    ``ahead_batches``: batches made ahead (>= 1); ``region_decode=False``: decode whole images
    and cut the boxes on the device; ``scratch_bytes``: the resize's device scratch bound;
    ``plan_threads``: the loader's threads planning at once (see ``PLAN_THREADS``).

    Raises ValueError (naming the wheel to install) where nvImageCodec or nvJPEG is missing.
    """

    def __init__(self, plan: DevicePlan, device: torch.device, *, channels_first: bool = False,
                 ahead_batches: int = 2, region_decode: bool = True,
                 scratch_bytes: int = SCRATCH_BYTES, plan_threads: int = PLAN_THREADS) -> None:
        for name, value in (("ahead_batches", ahead_batches), ("plan_threads", plan_threads)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        module = region.backend()
        if module is None:
            raise ValueError(
                f"decoding on the device needs nvImageCodec: "
                f"{region.install_hint(torch.version.cuda)}; or decode on the CPU "
                "(presets' decode_on='cpu')"
            )
        found = region.libraries()
        if device.type == "cuda" and found is not None and not found.nvjpeg_loaded:
            raise ValueError(
                "decoding on the GPU needs nvJPEG, and nvImageCodec found no libnvjpeg: "
                f"{region.nvjpeg_hint(found, torch.version.cuda)}; or decode on the CPU "
                "(presets' decode_on='cpu')"
            )
        self.plan, self.device, self.module = plan, device, module
        self.channels_first = channels_first or plan.tail.layout == "CHW"
        self.mode: StreamMode = "region" if region_decode else "whole"
        self.scratch_bytes = int(scratch_bytes)
        self._ahead = ahead_batches
        self._plan_threads = plan_threads
        op = plan.op
        options = f":fast_idct={int(op.fast_dct)} :fancy_upsampling={int(not op.fast_upsample)}"
        if device.type == "cuda":
            self.decoder = module.Decoder(device_id=device.index or 0, options=options)
        else:
            self.decoder = module.Decoder(
                device_id=module.NVIMGCODEC_DEVICE_CPU_ONLY, max_num_cpu_threads=1,
                backends=[module.Backend(module.BackendKind.CPU_ONLY)], options=options)
        self.streams = _Streams(device)
        self.params = region.no_turn(module)  # the stored pixels: the plan turns none here
        self.mean = torch.tensor(IMAGENET_MEAN, device=device)
        self.std = torch.tensor(IMAGENET_STD, device=device)
        self.peak_decoded_bytes = 0
        self.peak_scratch_bytes = 0
        self.fallbacks = 0  # rows planned for the device that the CPU made instead
        self.whole_batches = 0  # batches whose region decode raised, decoded whole instead
        self.batch_rows = 0  # the largest batch made so far
        self.closed = False

    # -- the stage contract ----------------------------------------------------------------

    @property
    def ahead_batches(self) -> int:
        return self._ahead

    @property
    def slice_threads(self) -> int:
        """The loader's threads that plan at once (see ``PLAN_THREADS``)."""
        return self._plan_threads

    @property
    def stream(self) -> torch.cuda.Stream | None:
        """The stage's own CUDA stream (None on a CPU device)."""
        return self.streams.side

    def options(self) -> dict[str, Any]:
        return {"size": list(self.plan.size), "channels_first": self.channels_first,
                **self.plan.tail.as_dict()}

    def restore(self, state: Mapping[str, Any]) -> None:
        super().restore(state)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self.streams.side is not None:
                self.streams.side.synchronize()
            self.streams.retired.clear()

    def device_bytes(self, batch_size: int) -> int:
        """The device memory the stage holds at most: the batches made ahead, the one being
        made and the one handed out; the decoded boxes of the largest batch so far; the
        resize scratch."""
        h, w = self.plan.size
        per_row = h * w * 3 * (1 + (4 if self.plan.tail.dtype == "float32" else 0))
        return ((self._ahead + 2) * batch_size * per_row + self.peak_decoded_bytes
                + min(self.scratch_bytes, self.peak_scratch_bytes or self.scratch_bytes))

    def memory_bytes(self) -> int:
        """Host memory beyond the loader's batches: on a CPU device, everything the device
        side holds (it is host memory there); on a GPU, nothing of image size (the parsed
        streams share the size of the loader's encoded bytes)."""
        return 0 if self.device.type == "cuda" else self.device_bytes(self.batch_rows)

    def __call__(self, batch: Batch, keys: BatchKeys, /) -> Batch:
        if self.closed:
            raise RuntimeError("this device decode stage is closed")
        rows = len(batch["plan/encoded"])
        self.batch_rows = max(self.batch_rows, rows)
        made = _Made()
        with self.streams.context():
            images, made.keep = self._images(batch, rows)
            result = self._tail(images)
            for name, value in batch.items():
                if name in PLAN_KEYS or name == "image":
                    continue
                made[name] = (self._upload(value) if isinstance(value, np.ndarray)
                              else value)  # lists stay lists
            made["image"] = result
            made.ready = self.streams.record()
        return made

    def _upload(self, value: np.ndarray) -> torch.Tensor:
        """A copy of ``value`` on the device, queued on the stage's stream without waiting
        for it (from pinned memory on a GPU: a pageable copy waits for the work before it)."""
        host = torch.from_numpy(np.array(value))
        if self.device.type == "cuda":
            host = host.pin_memory()
        return host.to(self.device, non_blocking=True)

    def hand_over(self, batch: Batch, /) -> Batch:
        if isinstance(batch, _Made):
            self.streams.hand_over(batch)
        return dict(batch)

    # -- making a batch ----------------------------------------------------------------------

    def _images(self, batch: Batch, rows: int) -> tuple[torch.Tensor, Any]:
        h, w = self.plan.size
        images = torch.empty((rows, h, w, 3), dtype=torch.uint8, device=self.device)
        made_here, keep = self._device_rows(batch, images)
        if made_here:
            pixels = np.ascontiguousarray(batch["image"][made_here])
            index = torch.as_tensor(made_here, device=self.device)
            images.index_copy_(0, index, torch.from_numpy(pixels).to(self.device))
        return images, keep

    def _device_rows(self, batch: Batch, images: torch.Tensor) -> tuple[list[int], Any]:
        """Decode the rows planned for the device into ``images``; returns the rows whose
        pixels are made on the CPU (``batch["image"]``, the refused ones filled in there)
        and what the device's work still reads."""
        on_cpu = np.asarray(batch["plan/on_cpu"]).astype(bool)
        planned = np.flatnonzero(~on_cpu).tolist()
        made_here = np.flatnonzero(on_cpu).tolist()
        if not planned:
            return made_here, None
        boxes = np.asarray(batch["plan/box"])
        flips = np.asarray(batch["plan/flip"]).astype(bool)
        decoded, mode = self._decode_rows(batch, planned, boxes)
        ok, refused, parts, origin, pitch, start = [], [], [], [], [], 0
        hw_all = np.asarray(batch["plan/image_hw"]).tolist()
        box_list = boxes.tolist()  # Python ints once, not four numpy scalars a row
        for row, tensor in zip(planned, decoded):
            y, x, bh, bw = box_list[row]
            want = (bh, bw) if mode == "region" else tuple(hw_all[row])
            if tensor is None or tensor.shape != (*want, 3) or tensor.dtype != torch.uint8:
                refused.append(row)
                continue
            ok.append(row)
            parts.append(tensor.reshape(-1, 3))
            offset = 0 if mode == "region" else y * want[1] + x
            origin.append(start + offset)
            pitch.append(want[1])
            start += want[0] * want[1]
        if ok:
            self._resize_into(images, ok, parts, origin, pitch, boxes, flips)
        if refused:
            batch["image"] = np.array(batch["image"])  # the loader's memory stays as it was
            for row in refused:
                self._on_cpu(batch, row)
            self.fallbacks += len(refused)
        return sorted(made_here + refused), parts

    def _resize_into(self, images: torch.Tensor, ok: list[int], parts: list[torch.Tensor],
                     origin: list[int], pitch: list[int], boxes: np.ndarray,
                     flips: np.ndarray) -> None:
        device = self.device
        flat = torch.cat(parts) if len(parts) > 1 else parts[0]  # one copy, not one a row
        # the rows' numbers in one pinned buffer, one copy that does not wait on the stream
        # (a list copied to the device waits for the decode queued before it, five times)
        table = np.stack([np.asarray(origin, np.int64), np.asarray(pitch, np.int64),
                          boxes[ok][:, 2].astype(np.int64), boxes[ok][:, 3].astype(np.int64),
                          flips[ok].astype(np.int64), np.asarray(ok, np.int64)])
        host = torch.empty(table.shape, dtype=torch.int64, pin_memory=device.type == "cuda")
        host.numpy()[:] = table
        numbers = host.to(device, non_blocking=True)
        longest_hw = (int(table[2].max()), int(table[3].max()))
        made = resize_boxes(flat, numbers[0], numbers[1], numbers[2:4].T, numbers[4] != 0,
                            self.plan.size, scratch_bytes=self.scratch_bytes,
                            longest=longest_hw)
        images.index_copy_(0, numbers[5], made)
        longest = boxes[ok][:, 2:4].max(axis=0)
        per_row = row_scratch_bytes(int(longest[0]), int(longest[1]), *self.plan.size)
        rows_fit = max(1, self.scratch_bytes // per_row)
        self.peak_scratch_bytes = max(self.peak_scratch_bytes, min(len(ok), rows_fit) * per_row)

    def _decode_rows(self, batch: Batch, planned: list[int],
                     boxes: np.ndarray) -> tuple[list[torch.Tensor | None], StreamMode]:
        """The planned rows decoded in one call: the streams the loader's threads parsed
        (parsed here where they did not); whole images if the region decode raises."""
        encoded, mode = batch["plan/encoded"], self.mode
        given = batch.get("plan/stream") or [None] * len(encoded)
        streams = [given[r] if self.plan.streams == mode and given[r] is not None
                   else parse_stream(encoded[r], boxes[r], mode) for r in planned]
        try:
            return self._decode(streams), mode
        except RuntimeError:  # the decoder's failure: whole images, cut here
            if mode == "whole":
                return [None] * len(planned), mode
        self.whole_batches += 1
        whole = [parse_stream(encoded[r], boxes[r], "whole") for r in planned]
        try:
            return self._decode(whole), "whole"
        except RuntimeError:  # refused whole too: row by row on the CPU
            return [None] * len(planned), "whole"

    def _decode(self, streams: list[Any]) -> list[torch.Tensor | None]:
        """Each parsed stream decoded in one batched call (HWC uint8 on the device), None
        where unparsed or refused."""
        present = [i for i, code in enumerate(streams) if code is not None]
        images = self.decoder.decode([streams[i] for i in present], params=self.params,
                                     cuda_stream=self.streams.handle) if present else []
        result: list[torch.Tensor | None] = [None] * len(streams)
        total = 0
        for i, image in zip(present, images):
            if image is not None:
                result[i] = self._as_tensor(image)
                total += result[i].numel()  # type: ignore[union-attr]
        self.peak_decoded_bytes = max(self.peak_decoded_bytes, 2 * total)  # + their concat
        return result

    def _as_tensor(self, image: Any) -> torch.Tensor:
        if self.device.type == "cuda":
            # the capsule, ordered after the decode on the stage's stream: torch's
            # protocol path asks for the current stream again for every image (~30 µs)
            return from_dlpack(image.to_dlpack(self.streams.handle))
        return torch.from_numpy(np.asarray(image.cpu()))

    def _on_cpu(self, batch: Batch, row: int) -> None:
        names = batch.get("image/filename")
        where = (f"batch row {row} (file name {names[row]!r})"
                 if isinstance(names, list) and row < len(names) else f"batch row {row}")
        try:
            decode_planned(self.plan, batch["plan/encoded"][row], batch["plan/box"][row],
                           batch["plan/image_hw"][row], bool(batch["plan/flip"][row]),
                           batch["image"][row], where=where)
        except DecodeError as exc:
            raise DecodeError(
                f"{exc}; the GPU decoder refused it too. Find the record with "
                "`shardfeed verify --decode`, or load with on_error='skip' on the CPU path "
                "(decode_on='cpu')"
            ) from None

    def _tail(self, images: torch.Tensor) -> torch.Tensor:
        tail = self.plan.tail
        result = images
        if tail.normalize is not None or tail.dtype == "float32":
            result = images.float().div_(255.0)
            if tail.normalize == "imagenet":
                result = result.sub_(self.mean).div_(self.std)
            elif tail.normalize == "symmetric":
                result = result.mul_(2.0).sub_(1.0)
        if self.channels_first:
            result = result.permute(0, 3, 1, 2)
        return result.contiguous()


class _NoStream:
    """Stands in for ``torch.cuda.stream(...)`` on a CPU device."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _as_handed(batch: Batch) -> Batch:
    return batch  # the stage made it: torch tensors on the device already


class DeviceAdapted(AdaptedLoader):
    """A loader whose plan batches are made on the device by ``decode``; its
    ``memory_budget()`` adds the device's bytes (``device_bytes``)."""

    def __init__(self, loader: Any, decode: DeviceDecode, /) -> None:
        super().__init__(loader, _as_handed)
        self.decode = decode

    def memory_budget(self) -> MemoryBudget:
        budget: MemoryBudget = self.loader.memory_budget()
        batch_size = int(self.loader.options.batch_size)
        return dataclasses.replace(budget, device_bytes=self.decode.device_bytes(batch_size))


def device_stage(loader: Any, plan: DevicePlan, device: torch.device | str, *,
                 channels_first: bool = False, region_decode: bool = True) -> DeviceDecode:
    """A :class:`DeviceDecode` for ``loader``'s ``plan``, added to the loader's batch stages;
    with thread workers, the plan's threads parse the code streams (a process worker's
    batches come back pickled, and parsed streams do not pickle)."""
    options = getattr(loader, "options", None)
    threads = getattr(options, "workers", "threads") == "threads"
    # process workers plan under their own GILs: every one of them may plan at once
    stage = DeviceDecode(plan, torch.device(device), channels_first=channels_first,
                         region_decode=region_decode,
                         plan_threads=PLAN_THREADS if threads else
                         max(1, int(getattr(options, "num_threads", 1))))
    if threads:
        plan.streams = stage.mode
    loader.add_batch_stage(stage)
    return stage
