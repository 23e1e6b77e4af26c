"""Checkpoint metrics under Flink's names, through Airflow's own metrics (StatsD / OTel).

Airflow sends its metrics to StatsD (plain, DogStatsD, or InfluxDB-tagged) or to an
OpenTelemetry collector, as ``[metrics]`` configures it; this module emits through the
same ``Stats`` object, so the checkpoint metrics go wherever Airflow's go, with no setting
of their own. The table of metrics (type, unit, Flink equivalent, emitter) is
docs/metrics.md.

**Names.** Like Airflow's own per-DAG metrics (``ti.finish`` with tags; the per-DAG name
``ti.finish.<dag_id>...`` while ``[metrics] legacy_names_on`` is true, its default), each
value goes out twice:

* ``airflow_ckpt.<metric>`` with the tag ``job_name=<job>`` (OTel attributes, DogStatsD
  tags, InfluxDB-style StatsD tags; Flink's Prometheus reporter names its label so too);
* ``airflow_ckpt.<job>.<metric>`` (dots in the job name become ``__``, as Airflow does),
  for plain StatsD, which has no tags - only with ``legacy_names_on``.

StatsD and OTel add Airflow's own prefix (``[metrics] statsd_prefix`` / ``otel_prefix``,
``airflow``): ``airflow.airflow_ckpt.orders.lastCheckpointDuration``.

**Who emits what: every event counted once.** Gauges (the newest checkpoint's figures)
are idempotent: any watcher may set them. Counters are not, so each history event has
exactly one counting watcher:

* the history events a *driver* writes (checkpoints and savepoints completed or failed,
  in-process restarts) are counted by the supervision that watches that driver: the
  deferrable operator's supervision trigger (its probe, for the events it reads anyway:
  one extra listing, when it starts) or, in the blocking operator, :func:`watching` around the
  submission (a listing every :data:`WATCH_INTERVAL_S` and after the driver exited);
* the restarts the *supervisor* decides (a driver died, the strategy restarts it) are
  counted by the supervisor when it writes the decision (:func:`count_restart`), outside
  every watcher's window;
* a watcher counts only the events written after it started (:class:`EventMetrics`):
  what the history held already is not counted (the probe, which reads it anyway, sets
  the gauges from it). A triggerer restart therefore
  never re-counts a long-running job's past; what the job wrote while no triggerer ran
  is not counted (at most once - StatsD over UDP is at most once anyway);
* sensors and the ``CheckpointEventTrigger`` read manifests, not events: they set
  gauges only (:func:`report_snapshot`).

Nothing here reads storage by itself but through :class:`HistoryReader`'s public reads.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Mapping
from typing import Any

from airflow.providers.common.compat.sdk import Stats
from airflow.sdk import conf

from airflow_ckpt.runtime.history.events import (
    CHECKPOINT_COMPLETED,
    CHECKPOINT_FAILED,
    RESTART,
    RESTORED,
    SAVEPOINT_COMPLETED,
    SAVEPOINT_FAILED,
    HistoryEvent,
)
from airflow_ckpt.runtime.history.reader import HistoryReader

log = logging.getLogger(__name__)

NAMESPACE = "airflow_ckpt"
JOB_TAG = "job_name"  # Flink's scope variable <job_name>, its Prometheus label

# Gauges: Flink's CheckpointStatsTracker names (job scope), the newest completed
# checkpoint or savepoint, as in Flink.
LAST_CHECKPOINT_DURATION = "lastCheckpointDuration"  # ms, end to end
LAST_CHECKPOINT_SIZE = "lastCheckpointSize"  # bytes uploaded (incremental)
LAST_CHECKPOINT_FULL_SIZE = "lastCheckpointFullSize"  # bytes referenced (full state)
LAST_COMPLETED_CHECKPOINT_ID = "lastCompletedCheckpointId"
LAST_CHECKPOINT_RESTORE_TIMESTAMP = "lastCheckpointRestoreTimestamp"  # epoch ms
LAST_CHECKPOINT_COMPLETED_TIMESTAMP = "lastCheckpointCompletedTimestamp"  # epoch ms (ours)
# Counters: Flink's gauges of running totals; counted here per event.
NUMBER_OF_COMPLETED_CHECKPOINTS = "numberOfCompletedCheckpoints"
NUMBER_OF_FAILED_CHECKPOINTS = "numberOfFailedCheckpoints"
TOTAL_NUMBER_OF_CHECKPOINTS = "totalNumberOfCheckpoints"
NUM_RESTARTS = "numRestarts"
NUMBER_OF_COMPLETED_SAVEPOINTS = "numberOfCompletedSavepoints"  # ours
NUMBER_OF_FAILED_SAVEPOINTS = "numberOfFailedSavepoints"  # ours

GAUGES = (
    LAST_CHECKPOINT_DURATION, LAST_CHECKPOINT_SIZE, LAST_CHECKPOINT_FULL_SIZE,
    LAST_COMPLETED_CHECKPOINT_ID, LAST_CHECKPOINT_COMPLETED_TIMESTAMP,
    LAST_CHECKPOINT_RESTORE_TIMESTAMP,
)
COUNTERS = (
    NUMBER_OF_COMPLETED_CHECKPOINTS, NUMBER_OF_FAILED_CHECKPOINTS, TOTAL_NUMBER_OF_CHECKPOINTS,
    NUM_RESTARTS, NUMBER_OF_COMPLETED_SAVEPOINTS, NUMBER_OF_FAILED_SAVEPOINTS,
)

#: the blocking supervisor's look at the history while a driver runs (seconds)
WATCH_INTERVAL_S = 60.0


def _conf_bool(key: str, fallback: bool) -> bool:
    return bool(conf.getboolean("metrics", key, fallback=fallback))


def metrics_enabled() -> bool:
    """Whether Airflow sends metrics anywhere (StatsD, DogStatsD or OpenTelemetry)."""
    return any(_conf_bool(key, False)
               for key in ("statsd_on", "statsd_datadog_enabled", "otel_on"))


class CheckpointMetrics:
    """Emits one job's metrics through Airflow's ``Stats`` (names: the module docstring).

    Emitting never raises: metrics must not fail a supervision.
    """

    def __init__(self, job: str) -> None:
        self.job = job
        self.tags = {JOB_TAG: job}
        self.per_job_prefix = (f"{NAMESPACE}.{job.replace('.', '__')}."
                               if _conf_bool("legacy_names_on", True) else None)

    def _emit(self, kind: str, metric: str, value: int) -> None:
        try:
            send = Stats.gauge if kind == "gauge" else Stats.incr
            send(f"{NAMESPACE}.{metric}", value, tags=self.tags)
            if self.per_job_prefix is not None:
                send(f"{self.per_job_prefix}{metric}", value)
        except Exception:
            log.warning("could not emit metric %s of job %s", metric, self.job, exc_info=True)

    def gauge(self, metric: str, value: int) -> None:
        self._emit("gauge", metric, value)

    def incr(self, metric: str, count: int = 1) -> None:
        self._emit("counter", metric, count)

    def completed(self, figures: Mapping[str, Any], completed_ms: int) -> None:
        """The gauges of a completed checkpoint or savepoint (Flink counts both) from its
        Flink history entry fields (``id``, ``end_to_end_duration``, ``checkpointed_size``,
        ``state_size``): a ``checkpoint_completed`` event or a snapshot summary."""
        self.gauge(LAST_CHECKPOINT_DURATION, int(figures.get("end_to_end_duration") or 0))
        self.gauge(LAST_CHECKPOINT_SIZE, int(figures.get("checkpointed_size") or 0))
        self.gauge(LAST_CHECKPOINT_FULL_SIZE, int(figures.get("state_size") or 0))
        self.gauge(LAST_COMPLETED_CHECKPOINT_ID, int(figures.get("id") or 0))
        self.gauge(LAST_CHECKPOINT_COMPLETED_TIMESTAMP, completed_ms)

    def event(self, event: HistoryEvent, *, count: bool) -> None:
        """The metrics of one history event; counters only when ``count``."""
        data = event.data
        savepoint = event.type in (SAVEPOINT_COMPLETED, SAVEPOINT_FAILED)
        if event.type in (CHECKPOINT_COMPLETED, SAVEPOINT_COMPLETED):
            self.completed(data, int(data.get("latest_ack_timestamp")
                                     or round(event.ts * 1000)))
            if count:
                self.incr(NUMBER_OF_COMPLETED_CHECKPOINTS)
                self.incr(TOTAL_NUMBER_OF_CHECKPOINTS)
                if savepoint:
                    self.incr(NUMBER_OF_COMPLETED_SAVEPOINTS)
        elif event.type in (CHECKPOINT_FAILED, SAVEPOINT_FAILED):
            if count:
                self.incr(NUMBER_OF_FAILED_CHECKPOINTS)
                self.incr(TOTAL_NUMBER_OF_CHECKPOINTS)
                if savepoint:
                    self.incr(NUMBER_OF_FAILED_SAVEPOINTS)
        elif event.type == RESTORED:
            self.gauge(LAST_CHECKPOINT_RESTORE_TIMESTAMP, round(event.ts * 1000))
        elif event.type == RESTART and data.get("restart") and count:
            self.incr(NUM_RESTARTS)


class EventMetrics:
    """The metrics of the history events one watcher reads, counting from its start.

    ``count_after`` is the job's newest event key when the watcher started: events up to
    it were there before and set gauges only; later ones are counted (the module
    docstring says why). Costs one listing, at start.
    """

    def __init__(self, history: HistoryReader) -> None:
        self.metrics = CheckpointMetrics(history.layout.job)
        self.count_after = history.listing().newest_key

    @classmethod
    def start(cls, history: HistoryReader) -> EventMetrics | None:
        """None while Airflow's metrics are off: nothing to emit, nothing to read."""
        return cls(history) if metrics_enabled() else None

    def observe(self, event: HistoryEvent) -> None:
        self.metrics.event(event, count=self.count_after is None
                           or event.key > self.count_after)


def report_snapshot(summary: Mapping[str, Any]) -> None:
    """The gauges of the snapshot a sensor matched or a trigger fired, from its summary
    (:func:`~airflow_ckpt.triggers.matching.summarize`)."""
    CheckpointMetrics(str(summary["job"])).completed(
        summary, round(float(summary["completed_ts"]) * 1000))


def count_restart(job: str) -> None:
    """The supervisor decided to restart a dead driver (its ``RESTART`` event)."""
    if metrics_enabled():
        CheckpointMetrics(job).incr(NUM_RESTARTS)


@contextlib.contextmanager
def watching(history: HistoryReader, interval_s: float = WATCH_INTERVAL_S) -> Iterator[None]:
    """Emit the metrics of the events written while the block runs (blocking supervisor).

    A thread reads the events appended since the last look every ``interval_s`` and
    once more when the block ends (the driver has exited: all its events are written),
    so every event written during the block is counted, whatever the interval.
    """
    observer = EventMetrics.start(history)
    if observer is None:
        yield
        return
    cursor = observer.count_after
    done = threading.Event()

    def look() -> None:
        nonlocal cursor
        try:
            events, cursor = history.events_after(cursor)
        except Exception:
            log.warning("reading the history of %s for metrics failed", history.layout.job,
                        exc_info=True)
            return
        for event in events:
            observer.observe(event)

    def loop() -> None:
        while not done.wait(interval_s):
            look()

    thread = threading.Thread(target=loop, name="ckpt-metrics", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        look()
