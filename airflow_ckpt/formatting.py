"""Human-readable sizes and durations, shared by the CLI and the UI."""

from __future__ import annotations


def human_bytes(n: int) -> str:
    """``1536`` -> ``"1.5 KiB"``."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            return f"{int(size)} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def human_ms(ms: int) -> str:
    """``950`` -> ``"950 ms"``, ``12_500`` -> ``"12.5 s"``."""
    return f"{ms} ms" if ms < 10_000 else f"{ms / 1000:.1f} s"
