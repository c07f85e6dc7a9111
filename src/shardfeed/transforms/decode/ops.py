"""Decode ops: turn a sample's stored image (and mask) into arrays.

``DecodeImage`` decodes the whole picture: embedded JPEG/PNG bytes, raw arrays with their
stored shape, or referenced files read relative to the dataset root. It writes
``sample["image"]`` (H×W×C uint8, or uint16 with ``image_dtype="uint16"``) and
``sample["mask"]`` (H×W class ids: grey values or palette indices, see
:mod:`shardfeed.transforms.decode.masks`) and drops the encoded features. A mask of another
size than its image is a DecodeError, and so is an image or mask whose header claims more
than ``max_pixels`` pixels (refused before decoding). The crop-aware ops in
:mod:`shardfeed.transforms.decode.crop` share this base.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal, TypedDict

import cv2
import numpy as np

from shardfeed.errors import DecodeError, SchemaError
from shardfeed.format.columns import FilledColumn
from shardfeed.transforms.base import ArraySpec, Sample, SchemaLike, Specs, TransformBase
from shardfeed.transforms.decode.fields import Encoding, ImageField
from shardfeed.transforms.decode.image import ImageDtype, check_image_dtype
from shardfeed.transforms.decode.masks import Color, MaskDtype, MaskLabels
from shardfeed.transforms.decode.orientation import (
    ExifOrientation,
    check_exif_orientation,
    orientation_of,
)
from shardfeed.transforms.decode.png_rows import decode_png_into, decode_pngs_into
from shardfeed.transforms.decode.raw_rows import raw_rows_into, raw_rows_target
from shardfeed.transforms.decode.sizes import DEFAULT_MAX_PIXELS, decode_peak_bytes

Channels = Literal["rgb", "gray"]


def check_channels(image: np.ndarray) -> None:
    """DecodeError unless ``image`` (H×W or …×H×W×C) has 1, 3 or 4 channels: what every
    decode op takes."""
    c = image.shape[-1] if image.ndim >= 3 else 1
    if c not in (1, 3, 4):
        raise _channels_error(c)


def _channels_error(c: int) -> DecodeError:
    return DecodeError(
        f"the image has {c} channels; shardfeed decodes images with 1, 3 or 4 channels "
        "(store RGB, RGBA or grayscale)"
    )


class FieldOptions(TypedDict, total=False):
    """Where a sample's image and mask are and how they are stored: the options of
    :class:`DecoderBase` that the presets take too (see its doc)."""

    key: str | None
    encoding: Encoding
    height_key: str | None
    width_key: str | None
    channels_key: str | None
    shape: Sequence[int] | None
    mask: bool | None
    mask_key: str | None
    mask_encoding: Encoding
    mask_height_key: str | None
    mask_width_key: str | None
    mask_shape: Sequence[int] | None
    root: str | None


class DecodeOptions(FieldOptions, total=False):
    """The keyword options of :class:`DecoderBase`, as the ops built on it pass them on."""

    mask_colors: Mapping[Color, int] | None
    mask_unlisted: int | None
    mask_dtype: MaskDtype
    channels: Channels
    keep_encoded: bool
    fast_dct: bool
    fast_upsample: bool
    max_pixels: int
    image_dtype: ImageDtype
    exif_orientation: ExifOrientation


class DecoderBase(TransformBase):
    """Shared configuration of every decode op: where the image and mask are, how to read.

    Keyword options (all optional):

    - ``key``, ``encoding`` (``"auto"`` sniffs JPEG/PNG/…, ``"raw"``, ``"path"``),
      ``height_key``/``width_key``/``channels_key`` (raw shapes): where the image is. Left
      out, they come from the schema at ``bind`` or from the standard feature names. Bytes
      under ``key`` that fail to decode and read as a file path are a SchemaError saying
      so: pass ``encoding="path"``.
    - ``shape``: the fixed ``(height, width, channels)`` (or ``(height, width)``, channels
      from the byte count) of raw pixels whose records store no shape features, e.g.
      ``shape=(28, 28, 1)`` for MNIST-like bytes; it makes the image raw, and each record's
      byte count is checked against it (a DecodeError naming the record and the shape).
    - ``mask``: ``None`` decodes a mask when there is one, ``False`` never, ``True`` requires
      one. ``mask_key``/``mask_encoding`` say where it is. A mask decodes to class ids: grey
      values, or a palette PNG's indices (never its colours turned into grey levels).
    - ``mask_height_key``/``mask_width_key``: the features of a raw mask's height and width.
      Left out, a raw mask takes ``mask/height``/``mask/width``, else its image's height and
      width features (``height_key``/``width_key`` where given: TensorFlow's guide layout
      ``height``, ``width``, ``image_raw``, ``mask_raw`` needs only the image's), else the
      image's ``shape``. ``mask_shape=(height, width)``: a raw mask's fixed shape.
    - ``mask_colors``: ``{(r, g, b): id, ...}`` gives colour (RGB) masks their ids (and
      palette masks, by their palette colours); without it a colour mask is a DecodeError.
      ``mask_unlisted``: the id of pixels whose colour is not listed (default: an error).
    - ``mask_dtype``: ``"uint8"`` (default; a 16-bit mask is a DecodeError, never cut to 8
      bits) or ``"uint16"`` (16-bit masks keep their values; every mask is uint16).
    - ``root``: folder or URL that referenced (``"path"``) images are relative to.
    - ``channels``: ``"rgb"`` (H×W×3) or ``"gray"`` (H×W×1).
    - ``keep_encoded``: keep the encoded features in the sample (default: dropped).
    - ``fast_dct``: libjpeg's fast IDCT, as TensorFlow uses (default True); ``False``: the
      accurate one. They differ by about a level on average, up to 36 levels at a few
      pixels of photos saved at quality 95-100, and up to 255 on synthetic sharp edges at
      that quality (see :func:`~shardfeed.transforms.decode.image.decode_image`).
    - ``fast_upsample``: upsample JPEG chroma by replication instead of libjpeg's smooth filter
      (about 5 % faster decodes, slightly blockier colour edges; default False, as
      TensorFlow). Masks are gray and unaffected.
    - ``max_pixels``: the most pixels one image (or mask) may have, read from its header
      before decoding (default 2^27 = 134,217,728: 16384×8192, a 100-megapixel photo fits);
      a larger one raises DecodeError naming the record and its size, which
      ``on_error="skip"`` replaces. It bounds the decode's memory (:attr:`decode_bytes`,
      counted by ``Loader.memory_budget()``): lower it to your largest image for a tighter
      bound.
    - ``image_dtype``: the type of ``sample["image"]``.

      ``"uint8"`` (default): 8-bit images as they are. A 16-bit image is **not** an error:
      it is cut to 8 bits, as OpenCV decodes it. A 16-bit PNG (or PNM) keeps the high byte
      of each sample, ``v >> 8`` (TensorFlow's ``decode_png(dtype=tf.uint8)`` does the same;
      0x12FF gives 0x12, never rounded up); a 16-bit TIFF gives ``round(v / 257)``. Either
      way its low 8 bits are lost: pass ``"uint16"`` to keep them. Raw images keep their
      stored dtype.

      ``"uint16"``: every image is uint16. A 16-bit image keeps its exact samples; an 8-bit
      one (every JPEG, an 8-bit PNG, raw uint8 pixels) is widened ``v × 257``, so 255 becomes
      65535, the top of a 16-bit file's scale (as TensorFlow's
      ``decode_png(dtype=tf.uint16)``). Crops and resizes then work on the 16-bit samples.
      Images take twice the memory, and :attr:`decode_bytes` counts 2 bytes a sample.
      Masks follow ``mask_dtype``, not this.
    - ``exif_orientation``: what a JPEG's EXIF Orientation tag does, the same on every
      decode path (whole, DCT-scaled, region, GPU, masks).

      ``"ignore"`` (default): the stored pixels, tag or not, as ``tf.io.decode_jpeg`` and
      torchvision's ``decode_jpeg`` give them; a tagged photo and a stripped copy give the
      same bytes.

      ``"apply"``: the pixels turned as the tag says (as photo viewers and Pillow's
      ``ImageOps.exif_transpose`` show them); for orientations 5-8 height and width swap,
      and the crop ops draw their boxes, move ``boxes`` and cut in the turned image. A
      mask follows its own file's tag (a PNG mask drawn on the turned photo stays as it
      is). See :mod:`~shardfeed.transforms.decode.orientation`.
    """

    __slots__ = (
        "channels", "fast_dct", "fast_upsample", "image_field", "keep_encoded", "mask",
        "mask_field",
    )

    def __init__(
        self,
        *,
        key: str | None = None,
        encoding: Encoding = "auto",
        height_key: str | None = None,
        width_key: str | None = None,
        channels_key: str | None = None,
        shape: Sequence[int] | None = None,
        mask: bool | None = None,
        mask_key: str | None = None,
        mask_encoding: Encoding = "auto",
        mask_height_key: str | None = None,
        mask_width_key: str | None = None,
        mask_shape: Sequence[int] | None = None,
        mask_colors: Mapping[Color, int] | None = None,
        mask_unlisted: int | None = None,
        mask_dtype: MaskDtype = "uint8",
        root: str | None = None,
        channels: Channels = "rgb",
        keep_encoded: bool = False,
        fast_dct: bool = True,
        fast_upsample: bool = False,
        max_pixels: int = DEFAULT_MAX_PIXELS,
        image_dtype: ImageDtype = "uint8",
        exif_orientation: ExifOrientation = "ignore",
    ) -> None:
        if channels not in ("rgb", "gray"):
            raise ValueError(f"channels must be 'rgb' or 'gray', got {channels!r}")
        check_image_dtype(image_dtype)
        check_exif_orientation(exif_orientation)
        if mask is False:
            for name, value in (("mask_key", mask_key), ("mask_height_key", mask_height_key),
                                ("mask_width_key", mask_width_key), ("mask_shape", mask_shape)):
                if value is not None:
                    raise ValueError(f"mask=False contradicts {name}={value!r}; drop one of "
                                     "them")
        self.image_field = ImageField(
            key=key,
            encoding=encoding,
            height_key=height_key,
            width_key=width_key,
            channels_key=channels_key,
            root=root,
            max_pixels=max_pixels,
            image_dtype=image_dtype,
            exif_orientation=exif_orientation,
            shape=_shape_arg(shape),
        )
        labels = MaskLabels(colors=mask_colors, unlisted=mask_unlisted, dtype=mask_dtype)
        self.mask_field = ImageField(
            key=mask_key, encoding=mask_encoding, height_key=mask_height_key,
            width_key=mask_width_key, root=root, is_mask=True, mask_labels=labels,
            max_pixels=max_pixels, exif_orientation=exif_orientation,
            shape=_shape_arg(mask_shape), image=self.image_field,
        )
        self.mask = True if mask_key is not None and mask is None else mask
        self.channels: Channels = channels
        self.keep_encoded = bool(keep_encoded)
        self.fast_dct = bool(fast_dct)
        self.fast_upsample = bool(fast_upsample)

    @property
    def max_pixels(self) -> int:
        """The most pixels one decoded image (or mask) may have."""
        return self.image_field.max_pixels

    @property
    def image_dtype(self) -> ImageDtype:
        """The type of the decoded images: ``"uint8"`` or ``"uint16"`` (see the class doc)."""
        return self.image_field.image_dtype

    @property
    def exif_orientation(self) -> ExifOrientation:
        """``"ignore"`` or ``"apply"``: what a JPEG's EXIF orientation tag does (see the
        class doc)."""
        return self.image_field.exif_orientation

    @property
    def decode_bytes(self) -> int:
        """The most memory one call holds while it decodes (an image of ``max_pixels``
        pixels and its mask), in bytes: what ``Loader.memory_budget()`` counts a thread for
        decoding; twice as much for uint16 images."""
        sample_bytes = np.dtype(self.image_dtype).itemsize
        return decode_peak_bytes(self.max_pixels, sample_bytes=sample_bytes)

    # --- binding ------------------------------------------------------------------------

    def _copy(self) -> Any:
        clone = object.__new__(type(self))
        for cls in type(self).__mro__:
            for name in getattr(cls, "__slots__", ()):
                if hasattr(self, name):
                    setattr(clone, name, getattr(self, name))
        if hasattr(self, "__dict__"):  # a subclass's options set without __slots__
            clone.__dict__.update(self.__dict__)
        return clone

    def bind(self, schema: SchemaLike | None, *, root: str | None) -> Any:
        """A copy that knows the schema's image/mask features and the root of paths."""
        clone = self._copy()
        image_info = schema.image if schema is not None else None
        mask_info = schema.mask if schema is not None else None
        clone.image_field = self.image_field.bound(image_info, root=root)
        if self.mask is not False:
            mask_field = self.mask_field.bound(mask_info, root=root)
            clone.mask_field = mask_field.with_image(clone.image_field)
        return clone

    # --- helpers for subclasses -----------------------------------------------------------

    def _decode_full(self, sample: Sample) -> tuple[np.ndarray, str]:
        """The whole image (H×W×C, channels as configured) and the feature it came from."""
        key, _enc = self.image_field.require(sample)
        image = self.image_field.decode(
            sample, fast_dct=self.fast_dct, fast_upsample=self.fast_upsample
        )
        return self._fix_channels(image), key

    def _fix_channels(self, image: np.ndarray) -> np.ndarray:
        try:
            return self._convert_channels(image)
        except MemoryError:
            raise DecodeError(
                f"out of memory while converting a {image.shape} image to {self.channels}; "
                "lower num_threads or max_pixels"
            ) from None

    def _convert_channels(self, image: np.ndarray) -> np.ndarray:
        c = image.shape[-1]
        if self.channels == "rgb":
            if c == 3:
                return image
            if c == 1:
                return np.repeat(image, 3, axis=-1)
            if c == 4:
                return np.ascontiguousarray(image[..., :3])
        elif c == 1:
            return image
        elif c in (3, 4) and image.ndim == 3:
            return np.asarray(cv2.cvtColor(image[..., :3], cv2.COLOR_RGB2GRAY))[..., None]
        elif c in (3, 4):
            gray = [cv2.cvtColor(f[..., :3], cv2.COLOR_RGB2GRAY) for f in image]
            return np.stack(gray)[..., None]
        raise _channels_error(c)

    def _decode_mask(self, sample: Sample) -> tuple[np.ndarray | None, str | None]:
        """The mask (H×W class ids) and its feature, or (None, None) when there is none."""
        if self.mask is False:
            return None, None
        found = self.mask_field.locate(sample)
        if found is None:
            if self.mask:
                self.mask_field.require(sample)  # raises SchemaError naming the keys
            return None, None
        mask = self.mask_field.decode(sample, fast_dct=self.fast_dct)
        return mask, found[0]

    def _check_mask_size(
        self, sample: Sample, mask: np.ndarray, mask_key: str | None, image_hw: tuple[int, int]
    ) -> None:
        """DecodeError unless the mask has the image's height and width (a mask of another
        size would be cropped, flipped and resized out of line with its image), and unless a
        raw mask (which has no orientation tag) goes with an image that
        ``exif_orientation="apply"`` turns (whether it was drawn on the stored pixels or on
        the turned ones cannot be told: a half turn keeps the size, and would be handed back
        out of line)."""
        self._check_mask_turn(sample, mask_key)
        mask_hw = (int(mask.shape[-2]), int(mask.shape[-1]))
        if mask_hw != image_hw:
            turned = ""
            if mask_hw == image_hw[::-1]:
                other = "apply" if self.exif_orientation == "ignore" else "ignore"
                turned = (f" (height and width swapped: if the image has an EXIF orientation "
                          f"tag the mask was drawn for, decode with "
                          f"exif_orientation={other!r})")
            raise DecodeError(
                f"{self.mask_field.where(sample, mask_key or 'mask')}: the mask is "
                f"{mask_hw[0]}×{mask_hw[1]} (height×width) but its image is "
                f"{image_hw[0]}×{image_hw[1]}{turned}; a mask must have its image's size: "
                "re-create the mask at the image's size, or skip such records with "
                "on_error='skip'"
            )

    def _check_mask_turn(self, sample: Sample, mask_key: str | None) -> None:
        if self.exif_orientation != "apply":
            return
        mask = self.mask_field.locate(sample)
        if mask is None or mask[1] != "raw":  # an encoded mask follows its own tag
            return
        found = self.image_field.locate(sample)
        if found is None or found[1] == "raw":  # raw pixels have no tag either
            return
        # (a "path" image is read a second time here: only for raw masks under "apply")
        data = self.image_field.encoded_bytes(sample, *found)
        if orientation_of(data, "apply") == 1:
            return
        raise DecodeError(
            f"{self.mask_field.where(sample, mask_key or 'mask')}: the image has an EXIF "
            "orientation tag, which exif_orientation='apply' turns it by, but a raw mask has "
            "no tag: whether the mask was drawn on the stored pixels or on the turned image "
            "cannot be told. Decode with exif_orientation='ignore' (image and mask as stored, "
            "as tf.io.decode_jpeg reads them), store the mask as a PNG drawn on the turned "
            "image, or skip such records with on_error='skip'"
        )

    def _finish(
        self, sample: Sample, image: np.ndarray, mask: np.ndarray | None, keys: list[str | None]
    ) -> Sample:
        if not self.keep_encoded:
            for key in keys:
                if key is not None and key not in ("image", "mask"):
                    sample.pop(key, None)
        sample["image"] = image
        if mask is not None:
            sample["mask"] = mask
        return sample

    @staticmethod
    def _dtype(field: ImageField) -> np.dtype[Any]:
        """What ``field`` decodes to: a raw feature's stored dtype (raw uint8 images widened
        to uint16 with ``image_dtype="uint16"``), a mask's ``mask_dtype``, an encoded
        image's ``image_dtype``."""
        if field.encoding == "raw":
            stored = np.dtype(field.dtype)
            widened = not field.is_mask and field.image_dtype == "uint16" and stored == np.uint8
            return np.dtype(np.uint16) if widened else stored
        return np.dtype(field.mask_labels.dtype if field.is_mask else field.image_dtype)

    def _channel_count(self) -> int:
        return 3 if self.channels == "rgb" else 1

    def __repr__(self) -> str:
        depth = "" if self.image_dtype == "uint8" else f", image_dtype={self.image_dtype!r}"
        if self.exif_orientation != "ignore":
            depth += f", exif_orientation={self.exif_orientation!r}"
        return (
            f"{type(self).__name__}(key={self.image_field.key!r}, "
            f"encoding={self.image_field.encoding!r}, mask_key={self.mask_field.key!r}{depth})"
        )


def _shape_arg(shape: Sequence[int] | None) -> tuple[int, ...] | None:
    """A ``shape`` option as ImageField takes it (ImageField checks the values)."""
    if shape is None or isinstance(shape, tuple):
        return shape
    if isinstance(shape, (str, bytes)) or not isinstance(shape, Sequence):
        return shape  # type: ignore[return-value]  # ImageField names the wrong value
    return tuple(shape)


class DecodeImage(DecoderBase):
    """Decode the whole image and mask of a sample.

    Writes ``sample["image"]`` (H×W×3 uint8, or H×W×1 with ``channels="gray"``; uint16 with
    ``image_dtype="uint16"``; a list of encoded images gives T×H×W×C) and ``sample["mask"]``
    (H×W class ids, uint8 unless ``mask_dtype="uint16"``) when there is a mask. A mask whose
    height and width differ from the image's raises DecodeError (the Loader names the shard,
    record and offset).

    Determinism: a pure function of the stored bytes; draws nothing from the generator.
    State: none. Memory: the decoded image and mask.
    """

    __slots__ = ()
    draws_random = False

    def __call__(self, sample: Sample, rng: np.random.Generator, /) -> Sample:
        image, key = self._decode_full(sample)
        mask, mask_key = self._decode_mask(sample)
        if mask is not None:
            self._check_mask_size(sample, mask, mask_key, (image.shape[-3], image.shape[-2]))
        return self._finish(sample, image, mask, [key, mask_key])

    def apply_batch(
        self, columns: dict[str, Any], rngs: Sequence[np.random.Generator] | None,
        out: Mapping[str, np.ndarray],
    ) -> dict[str, Any] | None:
        """Each row's image decoded (or, raw, copied) straight into its batch row (see
        :meth:`TransformBase.apply_batch`): the same pixels as ``__call__``, without the
        per-sample dict. Only for one image a row and no mask; else None. Raw images: see
        :mod:`shardfeed.transforms.decode.raw_rows`."""
        image_out = out.get("image")
        present = dict.fromkeys(columns)
        if image_out is None or (self.mask is not False and self.mask_field.locate(present)):
            return None
        found = self.image_field.locate(present)
        if found is None or not isinstance(columns[found[0]], (list, FilledColumn)):
            return None
        key = found[0]
        if found[1] == "raw":
            if not raw_rows_into(self, key, columns, image_out):
                return None
        elif not self._encoded_rows_into(key, columns[key], image_out):
            return None
        result = dict(columns)
        if not self.keep_encoded and key not in ("image", "mask"):
            del result[key]
        result["image"] = image_out
        return result

    def bytes_into(self, names: Sequence[str], out: Mapping[str, np.ndarray]
                   ) -> dict[str, np.ndarray]:
        """A raw image copied as it is into the batch rows (see
        :meth:`TransformBase.bytes_into` and :func:`~.raw_rows.raw_rows_target`); none for
        an encoded image, with a mask, or keeping the stored bytes."""
        image_out = out.get("image")
        present = dict.fromkeys(names)
        if image_out is None or self.keep_encoded or (
                self.mask is not False and self.mask_field.locate(present)):
            return {}
        found = self.image_field.locate(present)
        if found is None or found[1] != "raw":
            return {}
        rows = raw_rows_target(self, image_out)
        return {} if rows is None else {found[0]: rows}

    def _encoded_rows_into(self, key: str, values: list[Any], image_out: np.ndarray) -> bool:
        """Decode each row's encoded image into its row of ``image_out``; False (nothing
        written) for a list of frames or a value of another kind."""
        if len(values) != len(image_out) or not all(type(v) is bytes for v in values):
            return False
        # The PNG rows write 8-bit samples: only for uint8 images (uint16 rows are decoded,
        # kept or widened, by _decode_full).
        direct = (self.image_field.encoding == "auto" and self.image_dtype == "uint8"
                  and image_out.dtype == np.uint8
                  and image_out.shape[-1] == self._channel_count())
        max_pixels = self.max_pixels
        rows: Iterable[int] = range(len(values))
        if direct:
            rows = decode_pngs_into(values, image_out, max_pixels=max_pixels)
        for row in rows:
            data = values[row]
            target = image_out[row]
            if direct and decode_png_into(data, target, max_pixels=max_pixels):
                continue
            image, _ = self._decode_full({key: data})
            if image.shape != target.shape or image.dtype != target.dtype:
                raise SchemaError(  # the sample-by-sample path names the record
                    f"image {image.dtype} {image.shape} does not fit the batch's "
                    f"{target.dtype} {target.shape}"
                )
            target[...] = image
        return True

    def output_spec(self, specs: Specs) -> Specs:
        """Image H×W×C (``image_dtype``; raw: as stored) with varying H, W; mask H×W
        (``mask_dtype``) if there is one."""
        result = dict(specs)
        result["image"] = ArraySpec(
            (None, None, self._channel_count()), self._dtype(self.image_field)
        )
        if self.mask is not False and (self.mask or self.mask_field.key is not None):
            result["mask"] = ArraySpec((None, None), self._dtype(self.mask_field))
        return result


__all__ = [
    "Channels", "DecodeImage", "DecodeOptions", "DecoderBase", "FieldOptions", "check_channels",
]
