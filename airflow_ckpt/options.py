"""One option toolkit: Flink's value forms, parsed the same way everywhere.

The checkpoint config (:mod:`airflow_ckpt.runtime.checkpoint.config`), the restart strategies
(:mod:`airflow_ckpt.restart.params`) and the operators' and sensors' arguments read
durations (``"500 ms"``, ``"10 s"``, ``"1 min"``), memory sizes (``"32 mb"``), integers,
numbers, booleans and choices with these functions. Each returns the value or raises
``ValueError`` naming the accepted forms; the caller adds which option it was.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Any

#: integers as Flink's ``Integer.parseInt`` / ``Long.parseLong`` read them (and the
#: JSON schema of the DAG params checks strings against)
INT_PATTERN = r"^\s*[+-]?\d+\s*$"
#: numbers as Java's ``Double.parseDouble`` reads them (finite only)
FLOAT_PATTERN = r"^\s*[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?\s*$"

# ----------------------------------------------------------------------------- durations

#: unit spellings accepted by Flink's TimeUtils.parseDuration -> seconds
DURATION_UNITS: dict[str, float] = {}
for _names, _seconds in (
    (("ns", "nano", "nanos", "nanosecond", "nanoseconds"), 1e-9),
    (("us", "µs", "micro", "micros", "microsecond", "microseconds"), 1e-6),
    (("ms", "milli", "millis", "millisecond", "milliseconds"), 1e-3),
    (("s", "sec", "secs", "second", "seconds"), 1.0),
    (("m", "min", "mins", "minute", "minutes"), 60.0),
    (("h", "hour", "hours"), 3600.0),
    (("d", "day", "days"), 86400.0),
):
    for _name in _names:
        DURATION_UNITS[_name] = _seconds

_DURATION_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zµ]*)\s*$", re.IGNORECASE)

DURATION_FORMS = '"500 ms", "10 s", "1 min", "1 h" or a number of seconds'


def parse_duration(value: object) -> float:
    """Return ``value`` as seconds.

    Accepts Flink's duration strings and plain non-negative numbers (seconds).
    Raises ``ValueError`` with the accepted forms for anything else.
    """
    if isinstance(value, bool):
        raise ValueError(f"expected a duration ({DURATION_FORMS}), got {value!r}")
    if isinstance(value, int | float):
        if value < 0 or value != value:  # negative or NaN
            raise ValueError(f"a duration must be >= 0, got {value!r}")
        return float(value)
    if isinstance(value, str):
        match = _DURATION_PATTERN.match(value)
        if match:
            number, unit = match.groups()
            scale = DURATION_UNITS.get(unit.lower() or "s")
            if scale is not None:
                return float(number) * scale
    raise ValueError(f"expected a duration ({DURATION_FORMS}), got {value!r}")


def format_duration(seconds: float) -> str:
    """Render seconds in the largest Flink unit that keeps it a whole number."""
    ms = round(seconds * 1000)
    for unit, size in (("h", 3_600_000), ("min", 60_000), ("s", 1000)):
        if ms and ms % size == 0:
            return f"{ms // size} {unit}"
    return f"{ms} ms"

# --------------------------------------------------------------------------- memory sizes

#: unit spellings accepted by Flink's MemorySize.parse (binary multiples, as in Flink)
_MEMORY_UNITS: dict[str, int] = {}
for _names, _bytes in (
    (("", "b", "bytes"), 1),
    (("k", "kb", "kibibytes"), 1 << 10),
    (("m", "mb", "mebibytes"), 1 << 20),
    (("g", "gb", "gibibytes"), 1 << 30),
    (("t", "tb", "tebibytes"), 1 << 40),
):
    for _name in _names:
        _MEMORY_UNITS[_name] = _bytes

_MEMORY_PATTERN = re.compile(r"^\s*(\d+)\s*([a-z]*)\s*$", re.IGNORECASE)

MEMORY_SIZE_FORMS = '"32 mb", "512 kb", "1 gb" or a number of bytes'


def parse_memory_size(value: object) -> int:
    """Return ``value`` as bytes.

    Accepts Flink's memory-size strings (``k``/``kb``, ``m``/``mb``, ``g``/``gb``,
    ``t``/``tb``: powers of 1024) and non-negative integers (bytes). Raises
    ``ValueError`` naming the accepted forms for anything else.
    """
    if isinstance(value, bool):
        raise ValueError(f"expected a memory size ({MEMORY_SIZE_FORMS}), got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"a memory size must be >= 0, got {value!r}")
        return value
    if isinstance(value, str):
        match = _MEMORY_PATTERN.match(value)
        if match:
            number, unit = match.groups()
            scale = _MEMORY_UNITS.get(unit.lower())
            if scale is not None:
                return int(number) * scale
    raise ValueError(f"expected a memory size ({MEMORY_SIZE_FORMS}), got {value!r}")


def format_memory_size(size: int) -> str:
    """Render bytes in the largest unit that keeps it a whole number ("32 mb")."""
    for unit, scale in (("tb", 1 << 40), ("gb", 1 << 30), ("mb", 1 << 20), ("kb", 1 << 10)):
        if size and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} bytes"


# ------------------------------------------------------------- integers, numbers, choices


def parse_bool(value: Any) -> bool:
    """``True``/``False`` or the strings ``"true"``/``"false"`` (any case)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise ValueError(f"expected true or false, got {value!r}")


def parse_int(value: Any, minimum: int, maximum: int | None = None) -> int:
    """An integer in ``[minimum, maximum]``: an int, a whole float or an integer string."""
    allowed = (f"an integer >= {minimum}" if maximum is None
               else f"an integer in [{minimum}, {maximum}]")
    if isinstance(value, float) and value.is_integer():
        number = int(value)
    elif isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and re.match(INT_PATTERN, value):
        number = int(value)
    else:
        raise ValueError(f"expected {allowed}, got {value!r}")
    if number < minimum or (maximum is not None and number > maximum):
        raise ValueError(f"expected {allowed}, got {value!r}")
    return number


def parse_float(value: Any, minimum: float = -math.inf, maximum: float | None = None, *,
                exclusive_minimum: bool = False) -> float:
    """A finite number in the range: an int, a float or a number string."""
    low = f"> {minimum}" if exclusive_minimum else f">= {minimum}"
    allowed = f"a number {low}" + (f" and <= {maximum}" if maximum is not None else "")
    if isinstance(value, bool) or not (
        isinstance(value, int | float)
        or (isinstance(value, str) and re.match(FLOAT_PATTERN, value))
    ):
        raise ValueError(f"expected {allowed}, got {value!r}")
    number = float(value)
    too_low = number <= minimum if exclusive_minimum else number < minimum
    if not math.isfinite(number) or too_low or (maximum is not None and number > maximum):
        raise ValueError(f"expected {allowed}, got {value!r}")
    return number


def parse_choice(value: Any, allowed: Iterable[str]) -> str:
    """One of ``allowed`` (upper case), in any case."""
    choices = tuple(allowed)
    if isinstance(value, str) and value.strip().upper() in choices:
        return value.strip().upper()
    raise ValueError(f"expected one of {', '.join(choices)}, got {value!r}")
