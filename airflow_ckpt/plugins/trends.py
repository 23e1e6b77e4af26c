"""Trends of a job's checkpoints: Flink's checkpoint summary and server-rendered SVG charts.

The pages allow no script (their CSP is ``default-src 'none'``), so the charts are inline
SVG computed here and drawn by ``templates/charts.html`` with CSS classes only (no inline
styles). Geometry only: every label is rendered by Jinja with autoescaping.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from airflow_ckpt.formatting import human_bytes, human_ms
from airflow_ckpt.plugins.redact import driver_text
from airflow_ckpt.runtime.history import events as ev
from airflow_ckpt.runtime.history.events import HistoryEvent

SUMMARY_FIELDS = ("end_to_end_duration", "checkpointed_size", "state_size")
WIDTH, HEIGHT = 720, 220
LEFT, RIGHT, TOP, BOTTOM = 70, 12, 12, 28  # plot margins
#: events drawn as vertical markers on every chart
MARKER_EVENTS = frozenset({ev.RESTART, ev.JOB_FAILED, ev.RESTORED})


def percentile(values: Sequence[int | float], q: float) -> int | float | None:
    """Nearest-rank percentile (``q`` in 0..100), as Flink's summary reports it."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def summary(entries: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Flink's checkpoint summary (min / avg / p50 / p99 / max) of completed entries."""
    out = {}
    for name in SUMMARY_FIELDS:
        values = [e[name] for e in entries
                  if e.get("status") == "COMPLETED" and isinstance(e.get(name), int)]
        out[name] = {
            "min": min(values) if values else None,
            "avg": round(sum(values) / len(values)) if values else None,
            "p50": percentile(values, 50),
            "p99": percentile(values, 99),
            "max": max(values) if values else None,
            "count": len(values),
        }
    return out


@dataclass(slots=True)
class Series:
    name: str
    css: str  # CSS class: colour
    points: str  # SVG polyline points
    dots: list[tuple[float, float]] = field(default_factory=list)


@dataclass(slots=True)
class Marker:
    x: float
    css: str
    label: str  # tooltip (<title>)


@dataclass(slots=True)
class Chart:
    id: str
    title: str
    width: int = WIDTH
    height: int = HEIGHT
    series: list[Series] = field(default_factory=list)
    markers: list[Marker] = field(default_factory=list)
    y_ticks: list[tuple[float, str]] = field(default_factory=list)
    x_ticks: list[tuple[float, str]] = field(default_factory=list)
    empty: bool = True
    left: int = LEFT
    right: int = WIDTH - RIGHT
    top: int = TOP
    bottom: int = HEIGHT - BOTTOM


def _nice_max(value: float) -> float:
    if value <= 0:
        return 1.0
    exp = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        if value <= step * exp:
            return step * exp
    return 10 * exp


def _time_label(ms: float, span_ms: float) -> str:
    fmt = "%H:%M:%S" if span_ms < 86_400_000 else "%m-%d %H:%M"
    return datetime.fromtimestamp(ms / 1000, timezone.utc).strftime(fmt)


def _chart(
    chart_id: str,
    title: str,
    series: list[tuple[str, str, list[tuple[float, float]]]],
    markers: list[tuple[float, str, str]],
    x_range: tuple[float, float],
    fmt: Callable[[float], str],
) -> Chart:
    chart = Chart(chart_id, title)
    x0, x1 = x_range
    span = max(x1 - x0, 1.0)
    y_max = _nice_max(max((y for _, _, pts in series for _, y in pts), default=0.0))
    width, height = chart.right - chart.left, chart.bottom - chart.top

    def px(x: float) -> float:
        return round(chart.left + (x - x0) / span * width, 1)

    def py(y: float) -> float:
        return round(chart.bottom - y / y_max * height, 1)

    for name, css, pts in series:
        if not pts:
            continue
        chart.empty = False
        coords = [(px(x), py(y)) for x, y in sorted(pts)]
        chart.series.append(Series(name, css, " ".join(f"{a},{b}" for a, b in coords),
                                   coords if len(coords) <= 120 else []))
    chart.markers = [Marker(px(x), css, label) for x, css, label in markers if x0 <= x <= x1]
    chart.y_ticks = [(py(y_max * i / 4), fmt(y_max * i / 4)) for i in range(5)]
    chart.x_ticks = [(px(x0 + span * i / 4), _time_label(x0 + span * i / 4, span))
                     for i in range(5)]
    return chart


def charts(history: Sequence[dict[str, Any]], events: Sequence[HistoryEvent]) -> list[Chart]:
    """End-to-end duration and checkpointed/state size of completed checkpoints over time
    (completion time), with restarts, restores and terminal failures as markers on the
    same time axis. ``history``: the checkpoint stats entries; ``events``: the window."""
    done = [e for e in history if e.get("status") == "COMPLETED" and not e.get("is_savepoint")
            and isinstance(e.get("latest_ack_timestamp"), int | float)]
    failed = [e for e in history if e.get("status") == "FAILED"
              and isinstance(e.get("failure_timestamp"), int | float)]
    marks: list[tuple[float, str, str]] = []
    for event in events:
        if event.type in MARKER_EVENTS:
            d = event.data
            if event.type == ev.RESTART:
                verdict = "restart" if d.get("restart") else "no restart"
                label = f"{d.get('level') or ''} {verdict}: {driver_text(d.get('cause'))}"
            elif event.type == ev.RESTORED:
                label = f"restored from {d.get('kind') or ''} {d.get('checkpoint_id') or ''}"
            else:
                label = f"job failed: {driver_text(d.get('cause'))}"
            marks.append((event.ts * 1000, f"m-{event.type}", label.strip()))
    marks += [(float(e["failure_timestamp"]), "m-checkpoint_failed",
               f"checkpoint {e.get('id')} failed: {driver_text(e.get('failure_message'))}")
              for e in failed]
    xs = [float(e["latest_ack_timestamp"]) for e in done] + [m[0] for m in marks]
    x_range = (min(xs), max(xs)) if xs else (0.0, 1.0)

    def pts(name: str) -> list[tuple[float, float]]:
        return [(float(e["latest_ack_timestamp"]), float(e[name])) for e in done
                if isinstance(e.get(name), int | float)]

    return [
        _chart("chart-duration", "End-to-end duration",
               [("end to end", "s-duration", pts("end_to_end_duration"))], marks, x_range,
               lambda v: human_ms(int(v))),
        _chart("chart-size", "Checkpointed and state size",
               [("state size", "s-state", pts("state_size")),
                ("checkpointed (uploaded)", "s-checkpointed", pts("checkpointed_size"))],
               marks, x_range, lambda v: human_bytes(int(v))),
    ]
