"""Flink-style memory sizes ("32 mb", "512kb", "1 gb", or a number of bytes) as ints."""

from __future__ import annotations

import re

# Unit spellings accepted by Flink's MemorySize.parse (binary multiples, as in Flink).
_UNITS: dict[str, int] = {}
for _names, _bytes in (
    (("", "b", "bytes"), 1),
    (("k", "kb", "kibibytes"), 1 << 10),
    (("m", "mb", "mebibytes"), 1 << 20),
    (("g", "gb", "gibibytes"), 1 << 30),
    (("t", "tb", "tebibytes"), 1 << 40),
):
    for _name in _names:
        _UNITS[_name] = _bytes

_PATTERN = re.compile(r"^\s*(\d+)\s*([a-z]*)\s*$", re.IGNORECASE)

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
        match = _PATTERN.match(value)
        if match:
            number, unit = match.groups()
            scale = _UNITS.get(unit.lower())
            if scale is not None:
                return int(number) * scale
    raise ValueError(f"expected a memory size ({MEMORY_SIZE_FORMS}), got {value!r}")


def format_memory_size(size: int) -> str:
    """Render bytes in the largest unit that keeps it a whole number ("32 mb")."""
    for unit, scale in (("tb", 1 << 40), ("gb", 1 << 30), ("mb", 1 << 20), ("kb", 1 << 10)):
        if size and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} bytes"
