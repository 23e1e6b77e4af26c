"""Java ``long`` arithmetic, so backoff maths matches Flink bit for bit.

Flink computes backoffs with ``long`` (64-bit, wrapping) and ``double`` values;
Python integers never overflow. These helpers reproduce the Java operations the
strategies use:

* ``(long) d`` — truncation toward zero, NaN -> 0, saturating at the long range
  (JLS 5.1.3);
* ``a + b`` / ``a - b`` on longs — two's-complement wrap-around;
* ``Math.pow`` — returns ``inf`` where Python raises ``OverflowError``.
"""

from __future__ import annotations

import math

LONG_MIN = -(2**63)
LONG_MAX = 2**63 - 1
INT_MIN = -(2**31)
INT_MAX = 2**31 - 1


def wrap_long(value: int) -> int:
    """Reduce ``value`` to a Java ``long`` the way overflowing arithmetic does."""
    return (value - LONG_MIN) % 2**64 + LONG_MIN


def long_add(a: int, b: int) -> int:
    """Java ``a + b`` on two longs."""
    return wrap_long(a + b)


def long_sub(a: int, b: int) -> int:
    """Java ``a - b`` on two longs."""
    return wrap_long(a - b)


def double_to_long(value: float) -> int:
    """Java ``(long) value``."""
    if math.isnan(value):
        return 0
    if value >= 2.0**63:
        return LONG_MAX
    if value <= -(2.0**63):
        return LONG_MIN
    return int(value)  # int() truncates toward zero, like the Java cast


def pow_(base: float, exponent: float) -> float:
    """Java ``Math.pow`` for the finite, positive bases used here (overflow -> inf)."""
    try:
        return math.pow(base, exponent)
    except OverflowError:
        return math.inf
