"""Supervision decisions shared by the blocking and the deferrable supervisor (no Airflow).

Typed predicates over the job's history, read through :class:`HistoryReader` (the one
reader of ``history/``): the operator and the supervision trigger ask these objects
instead of reading raw event dicts.

* :class:`RunCheckpoints` answers "has *this* supervision run completed a checkpoint of
  its own?". A run started from a savepoint or ``none`` must keep
  that target on resubmission until its own ``initial`` checkpoint exists; the job's
  catalog may hold an *older* run's checkpoints, and ``restore=latest`` would resume
  those instead. One driver per job runs at a time (the lease), so a
  ``checkpoint_completed`` event written after this run's first ``job_submitted`` is
  this run's.
* :func:`resubmit_restore` turns that answer into the resubmission's restore target.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from airflow_ckpt.driver_output import exit_cause, summarize_driver_output
from airflow_ckpt.health import DEFAULT_MULTIPLE
from airflow_ckpt.runtime.checkpoint.catalog import CheckpointCatalog
from airflow_ckpt.runtime.history.events import (
    CHECKPOINT_COMPLETED,
    JOB_FAILED,
    JOB_FINISHED,
    JOB_STOPPED,
    JOB_SUBMITTED,
    RUN_EVENTS,
    HistoryEvent,
)
from airflow_ckpt.runtime.history.reader import HistoryReader
from airflow_ckpt.runtime.lease.observer import LeaseObserver

if TYPE_CHECKING:
    from airflow_ckpt.metrics import EventMetrics

RESTORE_LATEST = "latest"
RESTORE_NONE = "none"



@dataclass(frozen=True, slots=True)
class RunProgress:
    """What the history says about one supervision run's own progress."""

    submitted: bool  # the run's first ``job_submitted`` was found
    own_checkpoint: bool  # a checkpoint completed after the run's first submission

    @property
    def may_restore_latest(self) -> bool:
        """True once ``restore=latest`` resumes this run's state, not an older run's."""
        return self.own_checkpoint


class RunCheckpoints:
    """Incrementally watches the history for the run's first submit and own checkpoints.

    The first :meth:`progress` scans newest-first (raw events and segments: compaction
    hides nothing) down to the run's first ``job_submitted`` (attempt 1) or another
    run's event; later calls read only the events appended since (history keys are
    sequence numbers: the cursor misses nothing, whatever the hosts' clocks).
    """

    def __init__(self, history: HistoryReader, run_id: str) -> None:
        self.history = history
        self.run_id = run_id
        self._cursor: str | None = None
        self._submitted = False
        self._own_checkpoint = False

    def progress(self) -> RunProgress:
        if self._cursor is None:
            checkpoints_seen = False

            def stop(event: HistoryEvent) -> bool:
                nonlocal checkpoints_seen
                run = event.data.get("run_id")
                if event.type in RUN_EVENTS and run is not None and run != self.run_id:
                    return True  # an earlier supervision: nothing older is ours
                if event.type == CHECKPOINT_COMPLETED:
                    checkpoints_seen = True
                elif event.type == JOB_SUBMITTED and run == self.run_id:
                    self._submitted = True
                    self._own_checkpoint = self._own_checkpoint or checkpoints_seen
                    return int(event.data.get("attempt") or 0) <= 1 or self._own_checkpoint
                return False

            _, listing = self.history.newest_until(stop, RUN_EVENTS | {CHECKPOINT_COMPLETED})
            self._cursor = listing.newest_key or ""
        else:
            events, self._cursor = self.history.events_after(self._cursor or None)
            for event in events:
                if event.type == JOB_SUBMITTED and event.data.get("run_id") == self.run_id:
                    self._submitted = True
                elif event.type == CHECKPOINT_COMPLETED and self._submitted:
                    self._own_checkpoint = True
            self._cursor = self._cursor or ""
        return RunProgress(self._submitted, self._own_checkpoint)


def resubmit_restore(first_restore: str, progress: RunProgress) -> str:
    """The restore target of a resubmission after a driver death.

    ``latest`` once the run has a checkpoint of its own; until then the original target
    (a savepoint/checkpoint URI, ``none`` or ``latest``) again, so a driver that died
    during restore or before its initial checkpoint never resumes another run's state.
    """
    if first_restore == RESTORE_LATEST or progress.may_restore_latest:
        return RESTORE_LATEST
    return first_restore


# ====================================================================== watching a driver

VerdictKind = Literal["finished", "failed", "driver_died", "stale"]


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the supervision probe concluded about one submission (a trigger event payload).

    * ``finished``: the job ended cleanly (``job_finished`` / ``job_stopped``, or the
      submission exited 0); ``outcome`` is ``finished`` or ``stopped``.
    * ``failed``: the driver itself declared the failure final (``job_failed`` of this
      run): no restart, nothing more to count.
    * ``driver_died``: heartbeat gone (``expired`` / ``dead``) or the submission ended
      non-zero, with no terminal event: record a driver failure and ask the strategy.
    * ``stale``: the heartbeat is alive but checkpoints stopped progressing (health rule).
    """

    kind: VerdictKind
    cause: str
    exit_code: int | None = None
    outcome: str | None = None

    @property
    def needs_restart_decision(self) -> bool:
        return self.kind in ("driver_died", "stale")

    def to_payload(self) -> dict[str, Any]:
        return {"kind": self.kind, "cause": self.cause, "exit_code": self.exit_code,
                "outcome": self.outcome}

    @classmethod
    def from_payload(cls, payload: dict[str, Any]) -> Verdict:
        kind = payload.get("kind")
        if kind not in ("finished", "failed", "driver_died", "stale"):
            raise ValueError(f"not a supervision event: {payload!r}")
        code = payload.get("exit_code")
        return cls(kind, str(payload.get("cause") or ""),
                   None if code is None else int(code), payload.get("outcome"))


@dataclass(frozen=True, slots=True)
class DriverFailure:
    """One non-zero end of a submission: exit code (None if unknown), cause, error lines."""

    attempt: int
    exit_code: int | None
    cause: str
    error_lines: list[str]

    @classmethod
    def of_output(cls, attempt: int, exit_code: int | None, lines: Sequence[str],
                  driver_status: str | None = None) -> DriverFailure:
        """The failure as the driver's output tells it (its last error, see
        :func:`~airflow_ckpt.driver_output.summarize_driver_output`)."""
        cause, error_lines = summarize_driver_output(lines, exit_code)
        if driver_status and driver_status != "FINISHED":
            cause = f"{cause} (driver status {driver_status})"
        return cls(attempt, exit_code, cause, error_lines)

    @classmethod
    def of_verdict(cls, attempt: int, verdict: Verdict, lines: Sequence[str]) -> DriverFailure:
        """The failure a supervision verdict reports; the driver's log (``lines``, empty
        when it is on another host) adds the last error when the driver exited."""
        failure = cls.of_output(attempt, verdict.exit_code, lines)
        if verdict.kind != "failed" and (not lines or verdict.exit_code is None):
            return cls(attempt, verdict.exit_code, verdict.cause, failure.error_lines)
        return failure


@dataclass(frozen=True, slots=True)
class HealthRule:
    """Flink's ``checkpoint-progress`` check: stale after ``multiple`` x ``interval_s``."""

    interval_s: float
    multiple: float = DEFAULT_MULTIPLE
    restart: bool = False  # restart a stale job (counted by the restart strategy)


class SupervisionProbe:
    """One submission's observed state, polled by the trigger (sync; run it in a thread).

    Keep one probe across polls: the lease observer judges liveness by the heartbeat
    sequence *not moving* for ``ttl_s + max_write_s`` of this process's monotonic
    clock. A new probe (a restarted triggerer) therefore waits one full expiry again
    before calling a silent driver dead; terminal events and the exit code are read
    from storage / the exit file and need no memory.

    :param lease_epoch_before: the newest lease epoch when the submission started;
        records of that epoch or older belong to an earlier driver
    :param startup_timeout_s: a submission whose driver takes no lease within this
        long (probe clock) is dead
    :param exit_pending: True while the submission's exit code may still arrive (the
        detached launcher on this host is alive). A driver found dead by its lease while
        its launcher lives is reported once the exit code is there (at most
        ``exit_grace_s`` later): a driver that exited non-zero is reported with its
        code and last error, not as a silent death
    :param metrics: emits the metrics of this run's events as the probe reads them
        (it counts the checkpoints, savepoints and in-process restarts of the driver it
        watches; see :mod:`airflow_ckpt.metrics`)
    """

    def __init__(
        self,
        history: HistoryReader,
        run_id: str,
        *,
        submitted_key: str,
        lease_epoch_before: int,
        exit_code: Callable[[], int | None] = lambda: None,
        health: HealthRule | None = None,
        catalog: CheckpointCatalog | None = None,
        startup_timeout_s: float = 300.0,
        exit_pending: Callable[[], bool] = lambda: False,
        exit_grace_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        metrics: EventMetrics | None = None,
    ) -> None:
        self.history = history
        self.run_id = run_id
        self.submitted_key = submitted_key
        self.lease_epoch_before = lease_epoch_before
        self.exit_code = exit_code
        self.health = health
        self.catalog = catalog
        self.startup_timeout_s = startup_timeout_s
        self.exit_pending = exit_pending
        self.exit_grace_s = exit_grace_s
        self.clock = clock
        # (newest checkpoint id, probe clock when it became the newest)
        self._progress: tuple[int | None, float] | None = None
        self.metrics = metrics
        self.observer = LeaseObserver(history.storage, history.layout.job, clock=clock)
        self._started = clock()
        self._cursor: str | None = submitted_key
        self._released_polls = 0
        self._gone_since: float | None = None

    def poll(self) -> Verdict | None:
        """A verdict, or None while the driver runs healthily (or is still starting).

        Terminal events are read *after* the evidence of an end (the exit code, the lease
        state): a driver appends its terminal event before it exits or releases, so a
        ``job_failed`` written just before the exit is never taken for a silent death.
        """
        code = self.exit_code()
        terminal = self._terminal()
        if terminal is not None:
            return terminal
        if code is not None:
            if code == 0:
                return Verdict("finished", "spark-submit exited 0", 0, "finished")
            return Verdict("driver_died", exit_cause(code), code)
        lease = self.observer.poll()
        ours = lease.record is not None and lease.record.epoch > self.lease_epoch_before
        if not ours:
            if self.clock() - self._started >= self.startup_timeout_s:
                return self._terminal() or Verdict(
                    "driver_died", f"the driver took no lease within "
                    f"{self.startup_timeout_s:.0f} s of its submission")
            return None
        if lease.status in ("expired", "dead"):
            if self._awaiting_exit_code():
                return None
            return self._terminal() or Verdict(
                "driver_died", f"driver heartbeat {lease.status} (unchanged for "
                f"{lease.unchanged_for_s:.1f} s) without a terminal event")
        if lease.status == "released":
            self._released_polls += 1
            if self._released_polls >= 2 and not self._awaiting_exit_code():
                return self._terminal() or Verdict(
                    "driver_died", "driver released its lease without a terminal event")
            return None
        return self._health()

    def _awaiting_exit_code(self) -> bool:
        """The driver is gone but its launcher lives: its exit code is on the way."""
        if self._gone_since is None:
            self._gone_since = self.clock()
        return self.clock() - self._gone_since < self.exit_grace_s and self.exit_pending()

    def _health(self) -> Verdict | None:
        """Flink's ``checkpoint-progress`` on this probe's own clock: stale when the
        newest completed checkpoint stayed the same for ``multiple`` x ``interval_s``
        of probe time. The checkpoint's own timestamps (the driver's clock) are never
        compared with ours, so skewed hosts never make a healthy job look stale; a new
        probe (a restarted triggerer) watches one full window before it judges."""
        if self.health is None or self.catalog is None:
            return None
        latest = self.catalog.latest_checkpoint()
        newest = latest.checkpoint_id if latest is not None else None
        now = self.clock()
        if self._progress is None or self._progress[0] != newest:
            self._progress = (newest, now)
        unchanged = now - self._progress[1]
        window = self.health.multiple * self.health.interval_s
        if latest is not None and unchanged > window:
            return Verdict("stale", f"no checkpoint completed for more than "
                           f"{self.health.multiple:g} x {self.health.interval_s:g} s "
                           f"(the newest, chk-{latest.checkpoint_id}, unchanged for "
                           f"{unchanged:.0f} s) while the driver's heartbeat is alive")
        return None

    def _terminal(self) -> Verdict | None:
        events, self._cursor = self.history.events_after(self._cursor)
        for event in events:
            run = event.data.get("run_id")
            if run is not None and run != self.run_id:
                continue
            if self.metrics is not None:
                self.metrics.observe(event)
            if event.type in (JOB_FINISHED, JOB_STOPPED):
                outcome = "stopped" if event.type == JOB_STOPPED else "finished"
                return Verdict("finished", f"the job {outcome}", None, outcome)
            if event.type == JOB_FAILED and run == self.run_id:
                return Verdict("failed", str(event.data.get("cause") or "job failed"))
        return None
