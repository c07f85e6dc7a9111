"""``tf.train.Example`` encode/decode without TensorFlow.

The message classes are built at import from a ``FileDescriptorProto`` constructed here,
with TensorFlow's package (``tensorflow``), message names and field numbers (feature.proto,
example.proto; proto3, so int64/float lists are packed). They live in a private descriptor
pool, so they never clash with TensorFlow's own classes in the same process.

Decoded values:

- ``int64_list`` -> ``np.ndarray[int64]`` (1-D)
- ``float_list`` -> ``np.ndarray[float32]`` (1-D)
- ``bytes_list`` -> ``bytes`` when it holds exactly one value, else ``list[bytes]``
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

import numpy as np
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError as _ProtoDecodeError

from shardfeed.errors import SchemaError

Kind = Literal["bytes", "int64", "float"]
KINDS: tuple[Kind, ...] = ("bytes", "int64", "float")
Value: TypeAlias = "bytes | list[bytes] | np.ndarray"
FeatureInput: TypeAlias = (
    "bytes | bytearray | memoryview | str | int | float | np.ndarray "
    "| Sequence[bytes] | Sequence[str] | Sequence[int] | Sequence[float]"
)

_FDP = descriptor_pb2.FieldDescriptorProto


def _field(
    msg: descriptor_pb2.DescriptorProto, name: str, number: int, ftype: int, *,
    label: int = _FDP.LABEL_OPTIONAL, type_name: str = "", oneof: int | None = None,
    packed: bool | None = None,
) -> None:
    f = msg.field.add(name=name, number=number, type=ftype, label=label)
    if type_name:
        f.type_name = type_name
    if oneof is not None:
        f.oneof_index = oneof
    if packed is not None:
        f.options.packed = packed


def _build_classes() -> dict[str, Any]:
    """Build BytesList, FloatList, Int64List, Feature, Features, Example in a private pool."""
    feature = descriptor_pb2.FileDescriptorProto(
        name="tensorflow/core/example/feature.proto", package="tensorflow", syntax="proto3"
    )
    rep = _FDP.LABEL_REPEATED
    m = feature.message_type.add(name="BytesList")
    _field(m, "value", 1, _FDP.TYPE_BYTES, label=rep)
    m = feature.message_type.add(name="FloatList")
    _field(m, "value", 1, _FDP.TYPE_FLOAT, label=rep, packed=True)
    m = feature.message_type.add(name="Int64List")
    _field(m, "value", 1, _FDP.TYPE_INT64, label=rep, packed=True)
    m = feature.message_type.add(name="Feature")
    m.oneof_decl.add(name="kind")
    msg = _FDP.TYPE_MESSAGE
    _field(m, "bytes_list", 1, msg, type_name=".tensorflow.BytesList", oneof=0)
    _field(m, "float_list", 2, msg, type_name=".tensorflow.FloatList", oneof=0)
    _field(m, "int64_list", 3, msg, type_name=".tensorflow.Int64List", oneof=0)
    m = feature.message_type.add(name="Features")
    entry = m.nested_type.add(name="FeatureEntry")
    entry.options.map_entry = True
    _field(entry, "key", 1, _FDP.TYPE_STRING)
    _field(entry, "value", 2, msg, type_name=".tensorflow.Feature")
    _field(m, "feature", 1, msg, label=rep, type_name=".tensorflow.Features.FeatureEntry")

    example = descriptor_pb2.FileDescriptorProto(
        name="tensorflow/core/example/example.proto", package="tensorflow", syntax="proto3",
        dependency=["tensorflow/core/example/feature.proto"],
    )
    m = example.message_type.add(name="Example")
    _field(m, "features", 1, msg, type_name=".tensorflow.Features")

    pool = descriptor_pool.DescriptorPool()
    pool.Add(feature)
    pool.Add(example)
    names = ("BytesList", "FloatList", "Int64List", "Feature", "Features", "Example")
    return {
        n: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"tensorflow.{n}"))
        for n in names
    }


_CLASSES = _build_classes()
Example: Any = _CLASSES["Example"]
"""The ``tensorflow.Example`` message class."""
Features: Any = _CLASSES["Features"]
Feature: Any = _CLASSES["Feature"]
BytesList: Any = _CLASSES["BytesList"]
FloatList: Any = _CLASSES["FloatList"]
Int64List: Any = _CLASSES["Int64List"]

_ONEOF_TO_KIND: dict[str, Kind] = {
    "bytes_list": "bytes", "int64_list": "int64", "float_list": "float",
}
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


@dataclass(frozen=True, slots=True)
class FeatureSpec:
    """What a feature must look like when decoded (like TF's FixedLen/VarLenFeature).

    ``kind``: ``"bytes"``, ``"int64"`` or ``"float"``. ``shape``: a fixed shape the values are
    reshaped to (the value count must equal its product; ``()`` means one scalar), or None for
    any count. ``default``: used when the feature is missing (or holds no value list); without
    it, a missing feature raises :class:`SchemaError`.

    With a fixed ``shape`` the spec is ``tf.io.FixedLenFeature(shape, dtype, default_value)``:
    every record's value is an array of exactly that shape, int64 or float32 (bytes: one
    ``bytes`` for ``()``, else a flat list of ``bytes``), so a batch holds it as one dense
    ``(B, *shape)`` column. The default is made that value once, here: as many values as the
    shape holds are reshaped to it (nested or flat, as TF does), and one value fills the
    whole shape (TF refuses a lone value for a shape of more than one). With ``shape=None``
    the default is returned as given.

    Raises:
        ValueError: an unknown kind, a shape that is not a tuple of non-negative ints, or a
            default that does not fit a fixed shape (another count of values; a float or
            text for ``"int64"``; text for ``"float"``; a number for ``"bytes"``).
    """

    kind: Kind
    shape: tuple[int, ...] | None = None
    default: Any = None
    # the default as every record that lacks the feature gets it (fixed shapes only)
    _missing: Any = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"FeatureSpec kind must be one of {KINDS}, got {self.kind!r}")
        if self.shape is not None and not (
            isinstance(self.shape, tuple)
            and all(isinstance(d, int) and d >= 0 for d in self.shape)
        ):
            raise ValueError(
                f"FeatureSpec shape must be a tuple of non-negative ints or None, got "
                f"{self.shape!r}"
            )
        if self.shape is not None and self.default is not None:
            object.__setattr__(
                self, "_missing", _fixed_default(self.kind, self.shape, self.default)
            )

    def missing_value(self) -> Value:
        """The value of a record that lacks the feature: the default, shaped as
        :attr:`shape` (a fresh copy each call, so a transform may change it in place), or
        as given with ``shape=None``; None when there is no default."""
        made = self._missing
        if made is None:
            return self.default  # type: ignore[no-any-return]
        if isinstance(made, np.ndarray):
            return made.copy()
        return list(made) if isinstance(made, list) else made


def _fixed_default(kind: Kind, shape: tuple[int, ...], default: Any) -> Value:
    """``default`` as the value of a record of ``shape`` (see :class:`FeatureSpec`)."""
    want = math.prod(shape)
    if kind == "bytes":
        text = (bytes, bytearray, memoryview, str, np.bytes_, np.str_)
        given = [default] if isinstance(default, text) else np.asarray(
            default, dtype=object).ravel().tolist()
        if not all(isinstance(v, text) for v in given):
            raise ValueError(
                f"FeatureSpec('bytes') default must be bytes or str (or a list of them), got "
                f"{default!r}"
            )
        items = [_to_bytes("default", v) for v in given]
        items = items * want if len(items) == 1 else items
        _check_count(len(items), shape, want, default)
        return items[0] if shape == () else items
    array = np.asarray(default)
    allowed = "biu" if kind == "int64" else "biuf"
    if array.dtype.kind not in allowed:
        wanted = "integers" if kind == "int64" else "numbers"
        raise ValueError(
            f"FeatureSpec({kind!r}) default must hold {wanted}, got {default!r} "
            f"({array.dtype}); give a default of the feature's kind"
        )
    if kind == "int64":
        _check_int64("default", array)
    dtype = _INT64 if kind == "int64" else _FLOAT32
    if array.size == 1:
        return np.full(shape, array.reshape(()), dtype=dtype)
    _check_count(array.size, shape, want, default)
    return array.astype(dtype).reshape(shape)


def _check_count(count: int, shape: tuple[int, ...], want: int, default: Any) -> None:
    if count != want:
        raise ValueError(
            f"FeatureSpec default {default!r} has {count} values but shape {shape} holds "
            f"{want}: give {want} values (they are reshaped to the shape) or one value (it "
            "fills the shape)"
        )


# --- encode -----------------------------------------------------------------------------------


def _classify_sequence(name: str, values: Sequence[Any]) -> Kind:
    if len(values) == 0:
        raise ValueError(
            f"feature {name!r}: an empty list has no kind; pass an empty NumPy array with a "
            "dtype instead, e.g. np.array([], dtype=np.int64)"
        )
    if all(isinstance(v, (bytes, bytearray, memoryview, str)) for v in values):
        return "bytes"
    if all(isinstance(v, (numbers.Integral, np.bool_)) for v in values):
        return "int64"
    if all(isinstance(v, numbers.Real) for v in values):
        return "float"
    raise TypeError(
        f"feature {name!r}: a list must hold only bytes/str, only ints, or only numbers, got "
        f"{sorted({type(v).__name__ for v in values})}"
    )


def _to_bytes(name: str, value: object) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytes, bytearray, memoryview, np.bytes_)):
        return bytes(value)
    raise TypeError(f"feature {name!r}: expected bytes or str, got {type(value).__name__}")


def _check_int64(name: str, arr: np.ndarray) -> None:
    big = arr.size and arr.dtype.kind == "u" and arr.dtype.itemsize >= 8
    if big and int(arr.max()) > _INT64_MAX:
        raise ValueError(f"feature {name!r}: value {int(arr.max())} does not fit int64")


def _fill(feature: Any, name: str, value: Any) -> None:
    """Set one Feature message from a Python/NumPy value."""
    if isinstance(value, (bytes, bytearray, memoryview, str, np.bytes_)):
        feature.bytes_list.value.append(_to_bytes(name, value))
        return
    if isinstance(value, (bool, np.bool_, numbers.Integral)):
        iv = int(value)
        if not _INT64_MIN <= iv <= _INT64_MAX:
            raise ValueError(f"feature {name!r}: value {iv} does not fit int64")
        feature.int64_list.value.append(iv)
        return
    if isinstance(value, numbers.Real):
        feature.float_list.value.append(float(value))
        return
    if isinstance(value, np.ndarray):
        kind = value.dtype.kind
        if kind in "iub":
            _check_int64(name, value)
            feature.int64_list.value.extend(value.astype(np.int64, copy=False).ravel().tolist())
            feature.int64_list.SetInParent()
        elif kind == "f":
            feature.float_list.value.extend(
                value.astype(np.float32, copy=False).ravel().tolist()
            )
            feature.float_list.SetInParent()
        elif kind in "SUO":
            feature.bytes_list.value.extend(_to_bytes(name, v) for v in value.ravel().tolist())
            feature.bytes_list.SetInParent()
        else:
            raise TypeError(
                f"feature {name!r}: cannot store an array of dtype {value.dtype}; use an "
                "integer, float or bytes dtype (raw pixels: pass arr.tobytes())"
            )
        return
    if isinstance(value, Sequence):
        kind_s = _classify_sequence(name, value)
        if kind_s == "bytes":
            feature.bytes_list.value.extend(_to_bytes(name, v) for v in value)
        elif kind_s == "int64":
            ints = [int(v) for v in value]
            if any(not _INT64_MIN <= v <= _INT64_MAX for v in ints):
                raise ValueError(f"feature {name!r}: a value does not fit int64")
            feature.int64_list.value.extend(ints)
        else:
            feature.float_list.value.extend(float(v) for v in value)
        return
    raise TypeError(
        f"feature {name!r}: cannot encode a {type(value).__name__}; use bytes, str, int, "
        "float, a list of one of those, or a NumPy array"
    )


def encode_example(features: Mapping[str, Any]) -> bytes:
    """Serialize a ``tf.train.Example`` from a mapping of feature name to value.

    ints (and integer/bool arrays) -> ``int64_list``; floats (float arrays) -> ``float_list``
    (stored as float32); bytes/str (and lists of them) -> ``bytes_list``. Arrays are
    flattened. Serialization is deterministic (features sorted by name), so the same input
    gives the same bytes in every run.
    """
    if not isinstance(features, Mapping):
        raise TypeError(
            f"encode_example expects a mapping of feature name to value, got "
            f"{type(features).__name__}"
        )
    ex = Example()
    fmap = ex.features.feature
    for name, value in features.items():
        if not isinstance(name, str):
            raise TypeError(f"feature names must be str, got {name!r}")
        _fill(fmap[name], name, value)
    ex.features.SetInParent()
    data: bytes = ex.SerializeToString(deterministic=True)
    return data


# --- decode -----------------------------------------------------------------------------------


def _parse(payload: bytes | bytearray | memoryview, where: str) -> Any:
    ex = Example()
    try:
        ex.ParseFromString(payload)
    except _ProtoDecodeError as exc:
        raise SchemaError(
            f"{where or 'record'}: payload is not a tf.train.Example ({exc}); the shard holds "
            "other records, or the record is damaged (run `shardfeed verify`)"
        ) from None
    return ex


_INT64 = np.dtype(np.int64)
_FLOAT32 = np.dtype(np.float32)


def _value_of(feature: Any) -> tuple[Kind | None, Value]:
    oneof = feature.WhichOneof("kind")
    if oneof == "int64_list":
        # a slice of the repeated field is a list: one C conversion, cheaper than fromiter
        return "int64", np.array(feature.int64_list.value[:], _INT64)
    if oneof == "float_list":
        return "float", np.array(feature.float_list.value[:], _FLOAT32)
    if oneof == "bytes_list":
        vals = feature.bytes_list.value
        if len(vals) == 1:
            return "bytes", vals[0]
        return "bytes", list(vals)
    return None, []


def _decode_all(fmap: Any) -> dict[str, Value]:
    """Every feature of a parsed Example's map (the per-record hot path: kept inline)."""
    out: dict[str, Value] = {}
    for name in fmap:  # indexing by key: the map's items() is a Python-level generator
        feature = fmap[name]
        oneof = feature.WhichOneof("kind")
        if oneof == "bytes_list":
            vals = feature.bytes_list.value
            out[name] = vals[0] if len(vals) == 1 else list(vals)
        elif oneof == "int64_list":
            out[name] = np.array(feature.int64_list.value[:], _INT64)
        elif oneof == "float_list":
            out[name] = np.array(feature.float_list.value[:], _FLOAT32)
        else:
            out[name] = []
    return out


def _empty_of(kind: Kind) -> Value:
    if kind == "int64":
        return np.zeros(0, dtype=np.int64)
    if kind == "float":
        return np.zeros(0, dtype=np.float32)
    return []


def _apply_spec(name: str, kind: Kind | None, value: Value, spec: FeatureSpec, where: str) -> Value:
    if kind is None:
        kind, value = spec.kind, _empty_of(spec.kind)
    if kind != spec.kind:
        raise SchemaError(
            f"{where or 'record'}: feature {name!r} is {kind} but the spec asks for "
            f"{spec.kind}; fix the feature spec"
        )
    if spec.shape is None:
        return value
    want = math.prod(spec.shape)
    if kind == "bytes":
        items = [value] if isinstance(value, bytes) else list(value)
        if len(items) != want:
            raise SchemaError(
                f"{where or 'record'}: feature {name!r} has {len(items)} values but the spec "
                f"shape {spec.shape} needs {want}; fix the feature spec (shape=None for any "
                "count)"
            )
        return items[0] if spec.shape == () else items
    value = np.asarray(value)  # int64/float kinds always decode to arrays
    if value.size != want:
        raise SchemaError(
            f"{where or 'record'}: feature {name!r} has {value.size} values but the spec "
            f"shape {spec.shape} needs {want}; fix the feature spec (shape=None for any count)"
        )
    return value.reshape(spec.shape)


def decode_example(
    payload: bytes | bytearray | memoryview,
    *,
    spec: Mapping[str, FeatureSpec] | None = None,
    where: str = "",
) -> dict[str, Value]:
    """Parse a serialized ``tf.train.Example`` into ``{name: value}``.

    Without ``spec``: every feature, decoded as described in the module docstring (a feature
    with no value list set decodes to ``[]``). With ``spec``: only the named features, each
    checked and shaped by its :class:`FeatureSpec`; a missing one (or one with no value list
    set) takes its ``default`` (shaped, see :meth:`FeatureSpec.missing_value`) or raises
    :class:`SchemaError` naming ``where`` (the record) and the feature.
    """
    ex = _parse(payload, where)
    fmap = ex.features.feature
    if spec is None:
        return _decode_all(fmap)
    out: dict[str, Value] = {}
    for name, fspec in spec.items():
        kind, value = _value_of(fmap[name]) if name in fmap else (None, [])
        if kind is not None:
            out[name] = _apply_spec(name, kind, value, fspec, where)
        elif fspec.default is not None:  # missing, or no value list set (TF reads it so)
            out[name] = fspec.missing_value()
        elif name in fmap:  # no value list set, no default: no values
            out[name] = _apply_spec(name, kind, value, fspec, where)
        else:
            raise SchemaError(
                f"{where or 'record'}: feature {name!r} is missing (the record has "
                f"{sorted(fmap.keys())}); give the FeatureSpec a default, or fix the name"
            )
    return out


def example_kinds(payload: bytes | bytearray | memoryview) -> dict[str, str]:
    """``{name: "bytes" | "int64" | "float"}`` for every feature that has a value list set."""
    ex = _parse(payload, "")
    out: dict[str, str] = {}
    for name, feat in ex.features.feature.items():
        oneof = feat.WhichOneof("kind")
        if oneof is not None:
            out[name] = _ONEOF_TO_KIND[oneof]
    return out
