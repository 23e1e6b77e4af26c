"""One run per job: before spark-submit, look whether another supervision holds the job.

Two supervisions of one job (a double click, a manual DAG run beside a scheduled one, a
second DAG with the same ``job_name``) would start two drivers; the job's lease lets
exactly one of them write, and the other fails with a lease error after its first
heartbeat. That is safe but confusing. :class:`RunningJobGuard` tells the user before
anything is submitted: it reads the job's lease record and history (read-only) and
either refuses with :class:`~airflow_ckpt.errors.JobHeldError` naming the DAG run,
task and submission attempt that hold the job (``on_running_job="fail"``), or waits
until they let go (``"wait"``).

**This is a courtesy, not the safety.** Two tasks can look at the same moment and both
find the job free; the lease still decides which driver writes. The guard never
refuses on a guess: a holder counts as alive only once this process *saw its lease
heartbeat move* (two looks at the lease record, one clock), the rule the lease's own
observers use. So:

* a lease released, provably dead on this host, or silent for one full expiry
  (``ttl_s + max_write_s`` on this process's clock) is no holder: the task proceeds;
* a lease of this supervision (``owner`` = this task's supervision id: a retried task)
  is no other holder either: the supervisor re-attaches to it;
* another supervision that *submitted* a driver which holds no lease yet (its newest
  supervision event is ``job_submitted``) is named in a warning, not waited for: a
  worker that died right after spark-submit leaves the same trace, and no look at the
  storage tells the two apart without comparing clocks. Two runs started within the
  same seconds are the lease's to settle (the example DAGs set ``max_active_runs=1``,
  so one DAG's runs queue instead).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from airflow_ckpt.errors import JobHeldError
from airflow_ckpt.runtime.history.events import (
    JOB_STOPPED,
    JOB_SUBMITTED,
    RUN_EVENTS,
    TERMINAL_EVENTS,
    HistoryEvent,
)
from airflow_ckpt.runtime.history.journal import JobHistory
from airflow_ckpt.runtime.history.reader import HistoryReader
from airflow_ckpt.runtime.lease.observer import LeaseObserver, LeaseState
from airflow_ckpt.runtime.lease.record import DEFAULT_HEARTBEAT_S, read_lease
from airflow_ckpt.runtime.storage.base import CheckpointStorage

OnRunningJob = Literal["fail", "wait"]
ON_RUNNING_JOB: tuple[str, ...] = ("fail", "wait")


def validate_on_running_job(value: str) -> OnRunningJob:
    """``value`` if it is one of :data:`ON_RUNNING_JOB`, else a ``ValueError``."""
    if value == "fail":
        return "fail"
    if value == "wait":
        return "wait"
    raise ValueError(f"on_running_job must be one of {ON_RUNNING_JOB}, got {value!r}")


@dataclass(frozen=True, slots=True)
class JobClaim:
    """Another supervision that holds the job (or is starting it).

    :param run_id: its supervision id (``<dag_id>/<run_id>/<task_id>``, the lease owner)
    :param submitted: its newest ``job_submitted`` event, if the history has one (names
        the DAG run, task, try and submission attempt)
    :param epoch: the lease epoch it holds (None: starting, no lease yet)
    :param host: the host of its lease holder (the driver)
    :param pid: the pid of its lease holder
    :param seq: the lease record's heartbeat sequence number at this look
    """

    run_id: str
    submitted: HistoryEvent | None = None
    epoch: int | None = None
    host: str = ""
    pid: int = 0
    seq: int = 0

    @property
    def starting(self) -> bool:
        return self.epoch is None

    def describe(self) -> str:
        """Who holds the job, in the user's terms (DAG run, task, attempt, driver)."""
        data: dict[str, Any] = self.submitted.data if self.submitted else {}
        airflow = data.get("airflow") or {}
        if airflow.get("dag_id") and airflow.get("run_id"):
            who = (f"DAG run {airflow['run_id']!r} of DAG {airflow['dag_id']!r} "
                   f"(task {airflow.get('task_id')!r}, try {airflow.get('try_number')})")
        else:
            who = f"supervision {self.run_id!r}"
        if data.get("attempt") is not None:
            who += f", submission attempt {data['attempt']}"
        if self.starting:
            return who + ": its driver was submitted and has not started yet"
        return (who + f": its driver (pid {self.pid} on {self.host}) holds lease epoch "
                      f"{self.epoch} and its heartbeat is moving")


@dataclass
class RunningJobGuard:
    """Looks for another supervision of ``job`` (see the module docstring).

    :param storage: the job's storage (read only)
    :param job: the job name
    :param run_id: this task's supervision id
    :param poll_s: seconds between looks at the lease (default: the lease heartbeat)
    :param clock: monotonic clock of the looks; ``sleep``: how to wait between them
    :param log: where progress is reported (the operator's logger)
    """

    storage: CheckpointStorage
    job: str
    run_id: str
    log: Any
    poll_s: float = DEFAULT_HEARTBEAT_S
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    history: HistoryReader = field(init=False)

    def __post_init__(self) -> None:
        self.history = HistoryReader(self.storage, self.job)

    def ensure_free(self, on_running_job: OnRunningJob) -> None:
        """Return once no other supervision is seen holding the job.

        ``"fail"``: raise :class:`JobHeldError` naming the holder as soon as its
        heartbeat was seen moving. ``"wait"``: keep looking every ``poll_s`` until it
        let go (bounded by the task's ``execution_timeout``). Returns at once when the
        lease is free or this supervision's own; durable: nothing (read-only).
        """
        observer = LeaseObserver(self.storage, self.job, clock=self.clock)
        first_version: tuple[int, int] | None = None
        reported: str | None = None
        while True:
            state = observer.poll()
            claim = self.claim(state)
            if claim is None:
                return
            if claim.starting:
                self.log.warning("job %s: %s (or its worker died); proceeding: the job's "
                                 "lease decides which driver runs", self.job,
                                 claim.describe())
                return
            version = (claim.epoch or 0, claim.seq)
            first_version = first_version or version
            if version != first_version:  # its heartbeat moved: alive
                if on_running_job == "fail":
                    raise JobHeldError(
                        f"job {self.job!r} is running in another supervision, "
                        f"{claim.describe()}. Nothing was submitted. Wait for that run to "
                        "end, stop it (TriggerSavepointOperator with stop=True), or set "
                        "on_running_job='wait' to wait for it; the example DAGs set "
                        "max_active_runs=1 so a DAG's runs queue instead")
                if reported != claim.run_id:
                    self.log.warning("job %s: waiting while %s", self.job, claim.describe())
                    reported = claim.run_id
            self.sleep(self.poll_s)

    def claim(self, state: LeaseState) -> JobClaim | None:
        """One look: the lease as ``state`` shows it, then the history.

        A held lease of another owner is a claim (alive or not: the caller decides from
        two looks); otherwise another run whose newest supervision event is
        ``job_submitted`` is a starting claim; else None.
        """
        record = state.record
        if record is not None and state.status == "held":
            if record.owner == self.run_id:
                return None
            return JobClaim(record.owner, self._submission_of(record.owner), record.epoch,
                            record.host, record.pid, record.seq)
        newest = self.history.last_of(RUN_EVENTS | TERMINAL_EVENTS)
        if newest is None or newest.type != JOB_SUBMITTED:
            return None
        run = str(newest.data.get("run_id") or "")
        if not run or run == self.run_id:
            return None
        return JobClaim(run, newest)

    def _submission_of(self, run_id: str) -> HistoryEvent | None:
        found, _ = self.history.newest_until(
            lambda e: e.data.get("run_id") == run_id, {JOB_SUBMITTED})
        return found[-1] if found and found[-1].data.get("run_id") == run_id else None


def record_killed(history: JobHistory, run_id: str, *, attempt: int, by: str,
                  log: Any) -> HistoryEvent | None:
    """Record that supervision ``run_id`` was killed at ``attempt``: ``job_stopped``
    with ``killed=True`` (Flink's CANCELED), so the job's page, the savepoint operator
    and :class:`RunningJobGuard` see that the run let go of the job.

    Not written (None) when the job's newest lease record is held by another
    supervision: that run owns the job's state, and a killed loser must not end it.
    Durable when it returns an event.
    """
    record = read_lease(history.storage, history.layout.job)
    if record is not None and not record.released and record.owner != run_id:
        log.warning("job %s: killed, but supervision %r holds the job's lease: recording "
                    "nothing for the job", history.layout.job, record.owner)
        return None
    return history.append(JOB_STOPPED, run_id=run_id, attempt=attempt, killed=True,
                          cancelled=True, cause=f"task killed ({by})")


class KillSwitch(Protocol):
    """Set by a blocking task's ``on_kill`` (a :class:`threading.Event`; the simulation
    passes one that waits on virtual time)."""

    def set(self) -> None: ...

    def is_set(self) -> bool: ...

    def wait(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds; True once set."""


@contextlib.contextmanager
def recording_kill(history: JobHistory, run_id: str, killed: KillSwitch,
                   attempt: Callable[[], int], log: Any) -> Iterator[None]:
    """Around a blocking supervision: when it ends with an error after ``killed`` was
    set (the task's ``on_kill``), :func:`record_killed` at ``attempt()`` (the last
    submitted attempt), then re-raise."""
    try:
        yield
    except BaseException:
        if killed.is_set():
            record_killed(history, run_id, attempt=attempt(), by="on_kill", log=log)
        raise


__all__ = ["ON_RUNNING_JOB", "JobClaim", "KillSwitch", "OnRunningJob", "RunningJobGuard",
           "record_killed", "recording_kill", "validate_on_running_job"]
