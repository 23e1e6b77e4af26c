"""Flink-style durations ("500 ms", "10 s", "1 min", "1 h") as float seconds."""

from __future__ import annotations

import re

# Unit spellings accepted by Flink's TimeUtils.parseDuration.
_UNITS: dict[str, float] = {}
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
        _UNITS[_name] = _seconds

_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zµ]*)\s*$", re.IGNORECASE)

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
        match = _PATTERN.match(value)
        if match:
            number, unit = match.groups()
            scale = _UNITS.get(unit.lower() or "s")
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
