"""What state a job is in, for the jobs index and the job page: owner DAG and health.

Read from the history's ``events`` stream (never the checkpoint statistics) and the
job's lease record, both through the storage API; pure rules in :mod:`airflow_ckpt.health`.

Health (one badge per job, newest lifecycle event first):

* ``finished`` - ``job_finished`` (or ``job_stopped``, labelled "stopped");
* ``failing`` - ``job_failed`` (labelled "failed"), or running with a ``failure`` since the
  driver started that no checkpoint has completed after;
* ``dead`` - running according to the history, but the driver's lease says otherwise
  (see :func:`driver_silence`);
* ``stale`` - running, driver alive, and the last completed checkpoint (or the start) is
  older than ``stale_multiple`` x the checkpoint interval of its ``job_started`` event
  (:func:`airflow_ckpt.health.checkpoints_stale`);
* ``running`` - otherwise; ``unknown`` when the history has no lifecycle event.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from airflow_ckpt.errors import AirflowCkptError
from airflow_ckpt.health import DEFAULT_MULTIPLE, checkpoint_age_s, checkpoints_stale
from airflow_ckpt.plugins.redact import driver_text
from airflow_ckpt.runtime.checkpoint.config import CheckpointConfig
from airflow_ckpt.runtime.history import events as ev
from airflow_ckpt.runtime.history.events import HistoryEvent
from airflow_ckpt.runtime.history.reader import EventCache, HistoryReader
from airflow_ckpt.runtime.lease.record import DEFAULT_TTL_S, read_lease
from airflow_ckpt.runtime.storage.base import CheckpointStorage

#: The driver lease's default TTL when its record has none.
DEFAULT_LEASE_TTL_S = DEFAULT_TTL_S
#: Extra silence tolerated on top of the TTL before a driver is called dead: stands in for
#: the lease's ``max_write_s`` (a slow heartbeat PUT) and for clock skew between hosts.
DEAD_SLACK_S = 30.0

_STATE_TYPES = frozenset({ev.JOB_SUBMITTED, ev.JOB_STARTED, ev.JOB_FINISHED, ev.JOB_STOPPED,
                          ev.JOB_FAILED, ev.FAILURE, ev.RESTART})


@dataclass(frozen=True, slots=True)
class LeaseView:
    """The newest lease record of a job, as stored (``<job>/lease/<epoch>.json``)."""

    epoch: int
    heartbeat_ts: float
    released: bool
    ttl_s: float
    seq: int | None = None


def read_lease_view(storage: CheckpointStorage, job: str) -> LeaseView | None:
    """The newest lease record of ``job``, as the page shows it, or None.

    Read through :func:`airflow_ckpt.runtime.lease.record.read_lease`, the one reader of the
    lease layout.
    """
    record = read_lease(storage, job)
    if record is None:
        return None
    return LeaseView(epoch=record.epoch, heartbeat_ts=record.heartbeat_ts,
                     released=record.released, ttl_s=record.ttl_s or DEFAULT_LEASE_TTL_S,
                     seq=record.seq)


def driver_silence(lease: LeaseView | None, now: float,
                   slack_s: float = DEAD_SLACK_S) -> str | None:
    """Why the lease says the driver is dead (``"no heartbeat for 95 s"``), else None.

    An approximation for a stateless page view: the lease's own rule watches the
    heartbeat ``seq`` for ``ttl_s + max_write_s`` of the *observer's* time, which a
    request cannot do. Instead this compares the record's ``heartbeat_ts`` (the driver
    host's clock) with the api-server's clock and allows ``ttl_s + slack_s``; clock skew
    between the two hosts shifts the verdict by the skew. A released lease (the driver
    let go without a final history event) is dead at once. No lease: no verdict.
    """
    if lease is None:
        return None
    if lease.released:
        return "driver released its lease"
    silent = now - lease.heartbeat_ts
    if silent > lease.ttl_s + slack_s:
        return f"no heartbeat for {silent:.0f} s"
    return None


@dataclass(frozen=True, slots=True)
class JobState:
    """The newest state events of a job (None: not in the history read)."""

    job: str
    submitted: HistoryEvent | None  # newest job_submitted (the current Airflow task)
    started: HistoryEvent | None  # newest job_started
    lifecycle: HistoryEvent | None  # newest job_started/_finished/_stopped/_failed
    last_failure: HistoryEvent | None  # newest failure since the newest start

    @property
    def dag_id(self) -> str | None:
        """The DAG of the newest submission; None for a job not submitted by Airflow."""
        ids = self.submitted.data.get("airflow") if self.submitted else None
        dag = ids.get("dag_id") if isinstance(ids, dict) else None
        return str(dag) if dag else None

    @property
    def interval_s(self) -> float | None:
        """The checkpoint interval the running driver was started with."""
        config = self.started.data.get("checkpoint_config") if self.started else None
        if not isinstance(config, dict):
            return None
        try:
            return CheckpointConfig.from_dict(config).interval_s
        except (AirflowCkptError, ValueError, TypeError):
            return None


def job_state(
    storage: CheckpointStorage,
    job: str,
    cache: EventCache | None = None,
    on_error: Callable[[str], None] | None = None,
) -> JobState:
    """Read the newest state events, newest first, back to the newest ``job_submitted``
    (or past a second ``job_started``: that start was not submitted by Airflow).
    Unreadable events go to ``on_error`` (default: ignored; the pages list them)."""
    history = HistoryReader(storage, job, cache=cache)
    starts: set[str] = set()

    def stop(event: HistoryEvent) -> bool:
        if event.type == ev.JOB_STARTED:
            starts.add(event.key)
        return event.type == ev.JOB_SUBMITTED or len(starts) >= 2

    found, _ = history.newest_until(stop, _STATE_TYPES,
                                    on_error=on_error or (lambda _: None))
    return state_of(job, found)


def state_of(job: str, newest_first: list[HistoryEvent]) -> JobState:
    """:class:`JobState` from events, newest first."""

    def first(types: frozenset[str] | set[str]) -> HistoryEvent | None:
        return next((e for e in newest_first if e.type in types), None)

    started = first({ev.JOB_STARTED})
    failure = first({ev.FAILURE})
    if failure is not None and started is not None and failure.key < started.key:
        failure = None
    return JobState(job, first({ev.JOB_SUBMITTED}), started, first(ev.LIFECYCLE_EVENTS), failure)


@dataclass(frozen=True, slots=True)
class Health:
    """One job's badge: ``status`` (a CSS-safe word), ``label`` and a ``detail`` line."""

    status: str
    label: str
    detail: str
    last_completed_age_s: float | None

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status, "label": self.label, "detail": self.detail,
                "last_completed_age_s": self.last_completed_age_s}


def job_health(
    state: JobState,
    last_completed_ts: float | None,
    lease: LeaseView | None,
    now: float,
    stale_multiple: float = DEFAULT_MULTIPLE,
) -> Health:
    """The badge of the module docstring."""
    age = checkpoint_age_s(last_completed_ts, None, now)
    lifecycle = state.lifecycle
    if lifecycle is None:
        return Health("unknown", "no lifecycle event", "", age)
    if lifecycle.type == ev.JOB_FINISHED:
        return Health("finished", "finished", "", age)
    if lifecycle.type == ev.JOB_STOPPED:
        return Health("finished", "stopped", "", age)
    if lifecycle.type == ev.JOB_FAILED:
        return Health("failing", "failed", driver_text(lifecycle.data.get("cause")), age)
    silence = driver_silence(lease, now)
    if silence is not None:
        return Health("dead", "dead driver", silence, age)
    started_ts = state.started.ts if state.started else None
    failure = state.last_failure
    if failure is not None and (last_completed_ts is None or failure.ts > last_completed_ts):
        level = failure.data.get("level") or "?"
        cause = driver_text(failure.data.get("cause"))
        return Health("failing", "failing", f"{level} failure: {cause}", age)
    ref = max(x for x in (last_completed_ts, started_ts, 0.0) if x is not None)
    interval = state.interval_s
    if checkpoints_stale(ref or None, interval, now, stale_multiple):
        return Health("stale", "stale checkpoints",
                      f"none completed for {now - ref:.0f} s (interval {interval:g} s)", age)
    return Health("running", "running", "", age)
