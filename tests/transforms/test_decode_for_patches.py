"""decode_for_patches: what it keeps of a record besides the image, and which fault it names
first (the image's, then a missing mask's), whatever it works out before the decode."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
import simplejpeg

from shardfeed.errors import DecodeError, SchemaError
from shardfeed.transforms.decode.fields import ImageField
from shardfeed.transforms.decode.patches import decode_for_patches, meta_kinds

JPEG = simplejpeg.encode_jpeg(np.full((40, 60, 3), 90, np.uint8), quality=95)


def _png(mask: np.ndarray) -> bytes:
    ok, data = cv2.imencode(".png", mask)
    assert ok
    return bytes(data)


def _decode(record: dict[str, object], require_mask: bool | None = None) -> object:
    return decode_for_patches(record, image_field=ImageField(),
                              mask_field=ImageField(is_mask=True), denominator=2,
                              max_pixels=1 << 20, require_mask=require_mask)


def test_the_mask_and_image_leave_the_features_and_the_kinds_are_the_rest() -> None:
    record = {"image/encoded": JPEG, "mask/encoded": _png(np.ones((40, 60), np.uint8)),
              "label": np.array([3]), "name": b"a.jpg"}
    decoded = _decode(record, require_mask=True)
    assert list(decoded.meta) == ["label", "name"]  # type: ignore[attr-defined]
    assert decoded.kinds is meta_kinds(decoded.meta)  # type: ignore[attr-defined]
    assert decoded.dims == (20, 30, 40, 60)  # type: ignore[attr-defined]
    assert decoded.mask.shape == (40, 60)  # type: ignore[attr-defined]


def test_a_missing_mask_is_named_and_a_bad_image_is_named_first() -> None:
    with pytest.raises(SchemaError, match="mask"):
        _decode({"image/encoded": JPEG, "label": np.array([1])}, require_mask=True)
    # no mask asked for: none needed
    plain = _decode({"image/encoded": JPEG, "label": np.array([1])})
    assert plain.mask is None  # type: ignore[attr-defined]
    # a bad image and no mask: the image's fault, as the decode meets it first; a header
    # that does not read, and one that reads with its pixels cut short
    scan = JPEG.find(b"\xff\xda") + 40
    for bad in (JPEG[:200], JPEG[:scan]):
        with pytest.raises(DecodeError):
            _decode({"image/encoded": bad, "label": np.array([1])}, require_mask=True)
