"""Order keys as times: reading a column of timestamps in a declared or detected unit.

``pack`` stores an order key (``--csv-order``) as an int64 feature in **nanoseconds** (float32,
the only float an Example holds, rounds a Unix time to about two minutes), and the manifest's
``order.npy`` sidecar holds float64 **seconds** (what ``Windows(stride_seconds=...)`` reads).

The unit of a column is declared (``--time-unit s|ms|us|ns|iso``) or detected (``auto``):

- every value an ISO 8601 timestamp (naive ones are UTC)  ->  ``iso``;
- every value a number, all Unix times of 1980-2100 in one unit  ->  that unit (the ranges
  of ``s``, ``ms``, ``us`` and ``ns`` do not overlap, so they cannot be confused);
- anything else is ambiguous (small numbers may be seconds or milliseconds since the start
  of something; a mix of ISO and numbers, or of units) and is refused, asking for the unit.

Conversions are exact (decimal arithmetic, integer nanoseconds); values round to the
nearest nanosecond.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation
from typing import Literal

import numpy as np

from shardfeed.errors import PackError

TimeUnit = Literal["auto", "s", "ms", "us", "ns", "iso"]
TIME_UNITS: tuple[str, ...] = ("auto", "s", "ms", "us", "ns", "iso")
NumericUnit = Literal["s", "ms", "us", "ns"]

NANOS: dict[str, int] = {"s": 10**9, "ms": 10**6, "us": 10**3, "ns": 1}
"""Nanoseconds per unit."""
NUMERIC_UNITS: tuple[NumericUnit, ...] = ("s", "ms", "us", "ns")

STORED_UNIT = "ns"
"""The unit of the int64 order feature ``pack`` writes."""

# Unix times from 1980-01-01 to 2100-01-01, in seconds: the span in which a number is taken
# as a timestamp when detecting its unit.
_EPOCH_LOW, _EPOCH_HIGH = 315_532_800, 4_102_444_800
_INT64_MAX = 2**63 - 1
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def check_time_unit(unit: str, *, allowed: Sequence[str] = TIME_UNITS) -> None:
    """Raise ValueError unless ``unit`` is one of ``allowed``."""
    if unit not in allowed:
        raise ValueError(f"time unit must be one of {', '.join(allowed)}, got {unit!r}")


@dataclass(frozen=True, slots=True)
class TimeValue:
    """One parsed cell: ``number`` (a Decimal) or ``nanos`` from an ISO timestamp."""

    number: Decimal | None = None
    nanos: int | None = None


def parse_cell(text: str) -> TimeValue:
    """A number or an ISO 8601 timestamp; raises ValueError for anything else."""
    value = text.strip()
    try:
        number = Decimal(value)
    except InvalidOperation:
        pass
    else:
        if not number.is_finite():
            raise ValueError(f"{text!r} is not finite")
        return TimeValue(number=number)
    return TimeValue(nanos=iso_nanos(value))


def iso_nanos(text: str) -> int:
    """Nanoseconds since the Unix epoch of an ISO 8601 timestamp (naive = UTC), exactly."""
    try:
        stamp = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"{text!r} is neither a number nor an ISO 8601 timestamp (e.g. 2024-05-01T12:00:08)"
        ) from None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=timezone.utc)
    delta = stamp - _EPOCH
    return ((delta.days * 86_400 + delta.seconds) * 10**6 + delta.microseconds) * 1000


def epoch_unit(number: Decimal) -> str | None:
    """The unit in which ``number`` is a Unix time of 1980-2100, or None."""
    for unit, nanos in NANOS.items():
        seconds = number * nanos / 10**9
        if _EPOCH_LOW <= seconds <= _EPOCH_HIGH:
            return unit
    return None


def detect_unit(numbers: Sequence[Decimal]) -> tuple[str | None, str]:
    """The one unit in which every number is a Unix time, or ``(None, why not)``."""
    units = {epoch_unit(n) for n in numbers}
    if len(units) == 1 and None not in units:
        return units.pop(), ""
    low, high = min(numbers), max(numbers)
    if units == {None}:
        why = (f"its numbers ({_short(low)} to {_short(high)}) are not Unix times, so their "
               "unit (seconds? milliseconds?) cannot be told")
    else:
        why = (f"its numbers ({_short(low)} to {_short(high)}) are not Unix times in one "
               "unit")
    return None, why


def _short(number: Decimal) -> str:
    return f"{float(number):.6g}"


def to_nanos(value: TimeValue, unit: str) -> int:
    """``value`` in integer nanoseconds, reading numbers in ``unit`` (``s``, ``ms``, ...).

    Raises ValueError when the value does not fit int64 nanoseconds (years 1677-2262 for
    Unix times) or is of the other kind than ``unit`` says."""
    if value.nanos is not None:
        if unit != "iso":
            raise ValueError(f"it is an ISO timestamp, but the time unit is {unit!r}")
        return value.nanos
    if unit == "iso" or value.number is None:
        raise ValueError("it is a number, but the time unit is 'iso'")
    nanos = int((value.number * NANOS[unit]).to_integral_value(rounding=ROUND_HALF_EVEN))
    if abs(nanos) > _INT64_MAX:
        raise ValueError(
            f"{_short(value.number)} {unit} does not fit in int64 nanoseconds (about 292 "
            "years either side of 1970); check the time unit"
        )
    return nanos


def column_nanos(
    where: str, col: str, unit: str, cells: list[tuple[int, str]]
) -> tuple[dict[int, int], str]:
    """Every line's time in nanoseconds, and the unit the column was read in (``unit``, or
    the detected one for ``auto``). Raises PackError naming the CSV, line and column."""
    parsed: dict[int, TimeValue] = {}
    for line, text in cells:
        try:
            parsed[line] = parse_cell(text)
        except ValueError as exc:
            raise PackError(
                f"CSV file '{where}', line {line}, column '{col}': {exc}; fix the value or "
                "choose another column"
            ) from None
    if unit == "auto":
        isos = [ln for ln, v in parsed.items() if v.nanos is not None]
        numbers = [ln for ln, v in parsed.items() if v.number is not None]
        if isos and numbers:
            raise PackError(
                f"CSV file '{where}', column '{col}' mixes ISO timestamps (line {isos[0]}) and "
                f"numbers (line {numbers[0]}); write every time the same way"
            )
        if isos:
            unit = "iso"
        else:
            found, why = detect_unit(
                [v.number for v in parsed.values() if v.number is not None]
            )
            if found is None:
                raise PackError(
                    f"CSV file '{where}', column '{col}': {why}; pass --time-unit s, ms, us or "
                    "ns (time_unit= in CsvColumns) to say what the numbers are"
                )
            unit = found
    nanos: dict[int, int] = {}
    for line, value in parsed.items():
        try:
            nanos[line] = to_nanos(value, unit)
        except ValueError as exc:
            raise PackError(
                f"CSV file '{where}', line {line}, column '{col}': {exc}; fix the value or "
                "the --time-unit"
            ) from None
    return nanos, unit


def nanos_to_seconds(nanos: int) -> float:
    """Float64 seconds of integer nanoseconds (split first: exact to the float's precision)."""
    whole, rest = divmod(nanos, 10**9)
    return whole + rest / 1e9


def detect_array_unit(values: np.ndarray) -> NumericUnit | None:
    """For ``shardfeed index``: the one unit in which every value is a Unix time; None when
    no value is one (read as seconds, as before units were declared). Raises ValueError when
    some are and some are not, or they are of several units."""
    if values.size == 0:
        return None
    anywhere = np.zeros(values.shape, dtype=bool)
    for unit in NUMERIC_UNITS:
        seconds = values.astype(np.float64) * (NANOS[unit] / 1e9)
        inside = (seconds >= _EPOCH_LOW) & (seconds <= _EPOCH_HIGH)
        if inside.all():
            return unit
        anywhere |= inside
    if not anywhere.any():
        return None
    low, high = float(values.min()), float(values.max())
    raise ValueError(
        f"its values ({low:.6g} to {high:.6g}) are not Unix times in one unit, so their unit "
        "cannot be told"
    )


def array_seconds(values: np.ndarray, unit: NumericUnit) -> np.ndarray:
    """Float64 seconds of ``values`` in ``unit`` (integers split first: exact to the float's
    precision)."""
    nanos = NANOS[unit]
    if values.dtype.kind in "iu" and nanos < 10**9:
        per = 10**9 // nanos
        whole, rest = np.divmod(values.astype(np.int64), per)
        return whole.astype(np.float64) + rest.astype(np.float64) / per
    return values.astype(np.float64) * (nanos / 1e9)
