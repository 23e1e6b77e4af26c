"""The three benchmarks, computed from the runs of one ``python -m bench`` invocation.

Each compares a subject against a baseline of the same invocation and reports the
ratio subject / baseline. Medians are taken over repeats (wall times) or over every
checkpoint of every repeat (per-checkpoint timings).
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.harness import RunResult


@dataclass(frozen=True, slots=True)
class Row:
    """One line of the results table: ``subject / baseline = ratio``."""

    bench: str
    metric: str
    unit: str
    baseline: str
    baseline_value: float
    subject: str
    subject_value: float
    #: lowest and highest ratio of the repeats paired by index (run back to back), where
    #: the figure has repeats: how far one pair can stray on this machine
    spread: tuple[float, float] | None = None

    @property
    def ratio(self) -> float | None:
        if self.baseline_value == 0:
            return None
        return self.subject_value / self.baseline_value

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["baseline_value"] = round(self.baseline_value, 3)
        out["subject_value"] = round(self.subject_value, 3)
        out["ratio"] = None if self.ratio is None else round(self.ratio, 3)
        out["spread"] = None if self.spread is None else [round(x, 3) for x in self.spread]
        return out


def paired_spread(subject: Sequence[float], baseline: Sequence[float]
                  ) -> tuple[float, float] | None:
    """(min, max) of ``subject[i] / baseline[i]`` over the repeats; None for fewer than 2."""
    ratios = [s / b for s, b in zip(subject, baseline, strict=False) if b]
    return (min(ratios), max(ratios)) if len(ratios) >= 2 else None


def _fmt(value: float) -> str:
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.2f}"


def table(rows: Sequence[Row], *, ratio_digits: int = 2,
          value: Callable[[float], str] = _fmt) -> str:
    """A compact text table: one row per figure, ratio = subject / baseline."""
    width = 5 + ratio_digits
    spreads = any(r.spread for r in rows)
    lines = [f"{'benchmark':<14} {'metric':<26} {'unit':<4} {'baseline':>22} "
             f"{'subject':>23} {'ratio':>{width}}" + ("  paired min-max" if spreads else "")]
    lines.append("-" * len(lines[0]))
    for r in rows:
        ratio = "-" if r.ratio is None else f"{r.ratio:.{ratio_digits}f}x"
        lines.append(
            f"{r.bench:<14} {r.metric:<26} {r.unit:<4} "
            f"{r.baseline:>13} {value(r.baseline_value):>8} "
            f"{r.subject:>14} {value(r.subject_value):>8} {ratio:>{width}}"
            + (f"  {r.spread[0]:.2f}-{r.spread[1]:.2f}" if r.spread else "")
        )
    return "\n".join(lines)


def write_report(path: Path, document: dict[str, Any], wrong: Sequence[str]) -> int:
    """Write the JSON report to ``path``; the exit status: 1 (said on stderr) if a run's
    output differed from its ground truth, else 0."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=1, default=str) + "\n")
    print(f"\nwritten: {path}")
    if wrong:
        print(f"ERROR: runs whose output differs from the ground truth: {list(wrong)}",
              file=sys.stderr)
        return 1
    return 0


def _runs(results: Sequence[RunResult], variant: str, backend: str) -> list[RunResult]:
    runs = [r for r in results if r.variant == variant and r.backend == backend]
    if not runs:
        raise ValueError(f"no {variant}/{backend} run")
    return runs


def _median(values: Iterable[float]) -> float:
    data = list(values)
    return float(statistics.median(data)) if data else 0.0


def throughput_overhead(results: Sequence[RunResult]) -> list[Row]:
    """Benchmark 1: wall time and batches/s, plain Spark (baseline) vs. checkpointed.

    Both over the same input, the sink on the S3 endpoint; the checkpointed run with a
    1 s interval and incremental checkpoints. Medians over the repeats; "same repeat" is
    the median over repeats of the ratio of the two runs of one repeat (they run back to
    back, so a change in the machine's load affects both).
    """
    plain = _runs(results, "plain", "s3")
    ckpt = _runs(results, "incremental", "s3")
    name = "1 throughput"
    return [
        Row(name, "wall time (median)", "s", "plain", _median(r.wall_s for r in plain),
            "checkpointed", _median(r.wall_s for r in ckpt)),
        Row(name, "wall time, same repeat", "x", "plain", 1.0,
            "checkpointed", _median(paired_wall_ratios(results))),
        Row(name, "batches/s (median)", "1/s", "plain", _median(r.batches_per_s for r in plain),
            "checkpointed", _median(r.batches_per_s for r in ckpt)),
        Row(name, "checkpoints per run", "", "plain", 0.0,
            "checkpointed", _median(len(r.checkpoints) for r in ckpt)),
    ]


def paired_wall_ratios(results: Sequence[RunResult]) -> list[float]:
    """Benchmark 1 per repeat: checkpointed wall time / plain wall time of the same repeat."""
    plain = {r.repeat: r.wall_s for r in _runs(results, "plain", "s3")}
    return [round(r.wall_s / plain[r.repeat], 3) for r in _runs(results, "incremental", "s3")
            if plain.get(r.repeat)]


def _per_checkpoint(runs: Sequence[RunResult], value: Callable[[RunResult], float]) -> float:
    checkpoints = sum(len(r.checkpoints) for r in runs)
    return sum(value(r) for r in runs) / checkpoints if checkpoints else 0.0


def _upload_ms(run: RunResult) -> float:
    return float(sum(m.timings.async_duration_ms for m in run.checkpoints))


def incremental_vs_full(results: Sequence[RunResult]) -> list[Row]:
    """Benchmark 2: bytes uploaded and upload (async phase) time, full vs. incremental.

    Bytes: the sum of ``checkpointed_size`` over the ``checkpoint_completed`` events of
    the job's history. Upload time: the sum of the async phases (hash + upload + the
    ``_metadata`` marker). Totals are medians over repeats; per-checkpoint figures divide
    the sums over all repeats by the number of checkpoints (the count depends on timing,
    so per-checkpoint figures are the fairer comparison). The runs' wall times show what
    the extra uploads cost the query itself.
    """
    incr = _runs(results, "incremental", "s3")
    full = _runs(results, "full", "s3")
    name = "2 incremental"
    return [
        Row(name, "bytes uploaded per run", "KiB", "incremental",
            _median(r.uploaded_bytes / 1024 for r in incr),
            "full", _median(r.uploaded_bytes / 1024 for r in full)),
        Row(name, "bytes uploaded per ckpt", "KiB", "incremental",
            _per_checkpoint(incr, lambda r: r.uploaded_bytes / 1024),
            "full", _per_checkpoint(full, lambda r: r.uploaded_bytes / 1024)),
        Row(name, "upload time per run", "ms", "incremental", _median(map(_upload_ms, incr)),
            "full", _median(map(_upload_ms, full))),
        Row(name, "upload time per ckpt", "ms", "incremental",
            _per_checkpoint(incr, _upload_ms), "full", _per_checkpoint(full, _upload_ms)),
        Row(name, "checkpoints per run", "", "incremental",
            _median(len(r.checkpoints) for r in incr),
            "full", _median(len(r.checkpoints) for r in full)),
        Row(name, "run wall time (median)", "s", "incremental",
            _median(r.wall_s for r in incr), "full", _median(r.wall_s for r in full)),
    ]


def phase_costs(results: Sequence[RunResult]) -> list[Row]:
    """Benchmark 3: per-checkpoint sync phase, async phase and end-to-end duration.

    Medians over every checkpoint of every repeat, from the manifests' timings
    (``sync_duration_ms``: hard-link capture; ``async_duration_ms``: hash + upload +
    marker; ``end_to_end_duration_ms``: trigger to completion, including the wait for
    the barrier, ``start_delay_ms``, which depends on where in a batch the trigger fell;
    "barrier to done": from reaching the barrier to completion, without that wait).
    Incremental checkpoints, file backend (baseline) vs. S3 endpoint; and, per backend,
    the async phase against the sync phase.
    """
    name = "3 phases"
    medians: dict[str, dict[str, float]] = {}
    for backend in ("file", "s3"):
        manifests = [m for r in _runs(results, "incremental", backend) for m in r.checkpoints]
        medians[backend] = {
            "sync": _median(m.timings.sync_duration_ms for m in manifests),
            "async": _median(m.timings.async_duration_ms for m in manifests),
            "e2e": _median(m.timings.end_to_end_duration_ms for m in manifests),
            "delay": _median(m.timings.start_delay_ms for m in manifests),
            "after": _median((m.timings.completed_ts - m.timings.barrier_ts) * 1000
                             for m in manifests),
        }
    file, s3 = medians["file"], medians["s3"]
    rows = [
        Row(name, "sync phase (median)", "ms", "file", file["sync"], "s3", s3["sync"]),
        Row(name, "async phase (median)", "ms", "file", file["async"], "s3", s3["async"]),
        Row(name, "end-to-end (median)", "ms", "file", file["e2e"], "s3", s3["e2e"]),
        Row(name, "start delay (median)", "ms", "file", file["delay"], "s3", s3["delay"]),
        Row(name, "barrier to done (median)", "ms", "file", file["after"], "s3", s3["after"]),
    ]
    for backend in ("file", "s3"):
        m = medians[backend]
        rows.append(Row(name, f"async vs sync, {backend}", "ms", "sync", m["sync"],
                        "async", m["async"]))
    return rows
