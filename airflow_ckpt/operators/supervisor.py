"""Supervision of one checkpointed job run: the one home of both supervision paths.

:class:`Supervisor` is rebuilt from the operator's validated arguments and the job's
storage at every (re)entry of the task - the blocking ``execute``, and the deferrable
path's every resume - so nothing lives in the operator between deferrals and a worker
restart loses nothing. It owns the order of the steps on both paths; the operator only
submits, defers and returns:

* blocking: :meth:`Supervisor.run_blocking` loops submit, wait, decide, wait the delay,
  resubmit, with a submit callable;
* deferred: :meth:`~Supervisor.submit_detached` records the ``JOB_SUBMITTED`` event
  (the detached driver's log and exit file included) and returns the trigger that
  watches it; :meth:`~Supervisor.after` turns the trigger's event into a :class:`Step`
  - :class:`Done` (the XCom) or :class:`Restart` (the next attempt and its delay) - or
  raises :class:`CheckpointedJobFailedError`; after the delay (deferred as well)
  :meth:`~Supervisor.resume` gives the submission that follows.

Both paths decide in one place (:meth:`Supervisor._decide`): a submission whose run
wrote a terminal event after it (in history order, see
:attr:`~airflow_ckpt.runtime.history.restart_log.RunState.attempt_end`) ended with that
event, even when its driver then died or was declared dead before the event landed;
otherwise the failure is recorded and the restart strategy decides (history-backed: the
window and backoff hold across deferrals, worker restarts and the runtime's in-process
restarts). A resubmission starts from ``latest`` only once *this* run has a checkpoint
of its own (:func:`~airflow_ckpt.supervision.resubmit_restore`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from airflow.sdk.exceptions import AirflowException, AirflowFailException

from airflow_ckpt.detached import (
    LOCAL_PROCESSES,
    DetachedDriver,
    HostProcesses,
    detached_log_path,
    exit_path_of,
)
from airflow_ckpt.errors import RestartsExhaustedError
from airflow_ckpt.guard import KillSwitch
from airflow_ckpt.hooks.checkpoint_store import CheckpointStoreHook
from airflow_ckpt.metrics import count_restart, watching
from airflow_ckpt.operators.arguments import ValidatedArgs
from airflow_ckpt.runtime.checkpoint.catalog import CheckpointCatalog
from airflow_ckpt.runtime.history.events import (
    JOB_FAILED,
    JOB_STOPPED,
    JOB_SUBMITTED,
    HistoryEvent,
)
from airflow_ckpt.runtime.history.journal import JobHistory
from airflow_ckpt.runtime.history.restart_log import RestartLog, format_restart_history
from airflow_ckpt.runtime.lease.record import lease_epochs, read_lease
from airflow_ckpt.supervision import (
    RESTORE_LATEST,
    DriverFailure,
    RunCheckpoints,
    Verdict,
    resubmit_restore,
)
from airflow_ckpt.triggers.supervision import DriverSupervisionTrigger


class CheckpointedJobFailedError(RestartsExhaustedError, AirflowFailException):
    """The restart strategy declined another restart; the message has the last error."""


#: one blocking submission: (attempt, restore) -> None on exit 0, else the failure
SubmitOnce = Callable[[int, str], DriverFailure | None]


class Submitter(Protocol):
    """What submits a driver (the operator's
    :class:`~airflow_ckpt.hooks.spark_submit.CheckpointedSparkSubmitHook`; the
    simulation's drivers)."""

    @property
    def master(self) -> str | None: ...

    @property
    def deploy_mode(self) -> str | None: ...

    def submit_detached(self, application: str, log_path: Any) -> DetachedDriver:
        """Start the driver in its own session; it outlives the caller."""


@dataclass(frozen=True, slots=True)
class Done:
    """The supervision ended cleanly: ``result`` is the task's XCom (see
    :meth:`Supervisor.result`)."""

    result: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Restart:
    """Submit ``attempt`` after ``delay_s`` seconds (the restart strategy's decision)."""

    attempt: int
    delay_s: float


#: what follows a submission's end
Step = Done | Restart


@dataclass(frozen=True, slots=True)
class Supervisor:
    """One supervision run (``run_id``) of ``args.job``; see the module docstring."""

    args: ValidatedArgs
    store: CheckpointStoreHook
    catalog: CheckpointCatalog
    history: JobHistory
    run_id: str
    restart_log: RestartLog
    run_checkpoints: RunCheckpoints
    first_restore: str
    log: Any  # the operator's logger (stdlib or Airflow's structlog one)
    processes: HostProcesses = LOCAL_PROCESSES  # the detached drivers as this host sees them

    @classmethod
    def open(cls, args: ValidatedArgs, *, store: CheckpointStoreHook, run_id: str,
             check_restore: Callable[[CheckpointCatalog, str], str], log: Any,
             processes: HostProcesses = LOCAL_PROCESSES) -> Supervisor:
        """Open the job's history and catalog in ``store``; ``check_restore`` resolves
        ``args.restore``."""
        history, catalog = store.history(args.job), store.catalog(args.job)
        return cls(args, store, catalog, history, run_id,
                   RestartLog(history, args.restart_params, run_id),
                   RunCheckpoints(history, run_id), check_restore(catalog, args.restore), log,
                   processes)

    # ------------------------------------------------------------------ submissions

    def next_attempt(self) -> int:
        """The attempt number of the next submission (see
        :meth:`~airflow_ckpt.runtime.history.restart_log.RestartLog.next_attempt`)."""
        return self.restart_log.next_attempt()

    def restore_for(self, attempt: int) -> str:
        """Attempt 1: the operator's target. Later: ``latest`` once this run has a
        checkpoint of its own, until then the original target again (a driver that died
        before its initial checkpoint never resumes another run's state)."""
        if attempt == 1:
            return self.first_restore
        restore = resubmit_restore(self.first_restore, self.run_checkpoints.progress())
        if restore != RESTORE_LATEST:
            self.log.info("this run has no completed checkpoint yet: resubmitting with "
                          "restore=%s", restore)
        return restore

    def record_submit(self, hook: Submitter, attempt: int, restore: str,
                      **extra: Any) -> HistoryEvent:
        """Append this submission's ``JOB_SUBMITTED`` (``extra``: application, airflow
        ids, the detached driver's host, log and exit file); durable when it returns."""
        self.log.info("submitting job %s, attempt %d, restore=%s, master %s", self.args.job,
                      attempt, restore, hook.master)
        return self.history.append(JOB_SUBMITTED, run_id=self.run_id, attempt=attempt,
                                   restore=restore, master=hook.master,
                                   deploy_mode=hook.deploy_mode, **extra)

    # ------------------------------------------------------------------ deferred path

    def submit_detached(self, hook: Submitter, attempt: int, restore: str,
                        *, application: str, log_dir: str | None,
                        settings: Mapping[str, Any], **extra: Any) -> DriverSupervisionTrigger:
        """Submit ``attempt`` of ``application`` detached (its own session and log file,
        it outlives the task) and return the trigger that watches it. The
        ``JOB_SUBMITTED`` event, durable before the driver starts, records where its log
        and exit file are (``extra``: the airflow ids); ``settings``: see :meth:`watch`."""
        epochs = lease_epochs(self.store.storage, self.args.job)
        log_path = detached_log_path(log_dir, self.args.job, self.run_id, attempt)
        submitted = self.record_submit(
            hook, attempt, restore, driver_log=str(log_path),
            driver_exit=exit_path_of(log_path), driver_host=self.processes.hostname(),
            detached=True, application=application, **extra)
        driver = hook.submit_detached(application, log_path)
        self.log.info("job %s attempt %d submitted detached (pid %d, log %s); deferring",
                      self.args.job, attempt, driver.pid, driver.log_path)
        return self.watch(submitted, epochs[-1] if epochs else 0, driver_pid=driver.pid,
                          settings=settings)

    def watch(self, submitted: HistoryEvent, epoch_before: int, *, driver_pid: int | None,
              settings: Mapping[str, Any]) -> DriverSupervisionTrigger:
        """The trigger that watches the submission ``submitted`` (its ``JOB_SUBMITTED``,
        which names the attempt, the detached driver's host, log and exit file);
        ``epoch_before``: the newest lease epoch before it; ``settings``: the trigger's
        ``conn_id``, ``health``, ``poll_interval``, ``startup_timeout_s`` and
        ``stop_timeout_s``."""
        data = submitted.data
        return DriverSupervisionTrigger(
            storage_uri=self.args.storage_uri, job=self.args.job, run_id=self.run_id,
            submitted_key=submitted.key, lease_epoch_before=epoch_before,
            driver_pid=driver_pid, driver_host=data.get("driver_host"),
            exit_path=data.get("driver_exit"), attempt=data.get("attempt"),
            driver_log=data.get("driver_log"), **settings)

    def reattach(self, settings: Mapping[str, Any]) -> DriverSupervisionTrigger | None:
        """A retried task whose detached driver of the last attempt (this run) still holds
        the job's lease: the trigger to watch it again - resubmitting would start a second
        driver, which the lease refuses as final. None when there is nothing to watch."""
        attempt = self.next_attempt() - 1
        if attempt < 1:
            return None
        self.log.info("continuing supervision %s after submission attempt %d", self.run_id,
                      attempt)
        record = read_lease(self.store.storage, self.args.job)
        if record is None or record.released or record.owner != self.run_id:
            return None
        submits = [e for e in self.history.events([JOB_SUBMITTED])
                   if e.data.get("run_id") == self.run_id and e.data.get("attempt") == attempt]
        if not submits:
            return None
        self.log.info("the driver of attempt %d still holds the job's lease (epoch %d): "
                      "watching it again instead of resubmitting", attempt, record.epoch)
        return self.watch(submits[-1], record.epoch - 1, driver_pid=None, settings=settings)

    def after(self, event: dict[str, Any]) -> Step:
        """The step after a supervision trigger's event (its :class:`Verdict` and the
        submission's ``attempt``, ``driver_host``, ``driver_pid`` and ``driver_log``).

        A stale driver on this host is killed before it is restarted; a dead one's log
        (on this host) gives the failure's last error. Raises
        :class:`CheckpointedJobFailedError` when no restart follows."""
        verdict = Verdict.from_payload(event)
        attempt = int(event.get("attempt") or self.restart_log.last_submit_attempt())
        if verdict.kind == "finished":
            return Done(self.result(attempt))
        local = event.get("driver_host") == self.processes.hostname()
        if verdict.kind == "stale" and local:
            self.log.warning("job %s: %s; killing the stuck driver to restart it",
                             self.args.job, verdict.cause)
            self.processes.kill(event.get("driver_pid"))
        lines = self.processes.log_tail(event.get("driver_log")) if local else []
        failure = DriverFailure.of_verdict(attempt, verdict, lines)
        if verdict.kind == "failed":
            self._fail(failure, f"the job failed for good: {verdict.cause}", write=False)
        return self._decide(failure)

    def resume(self) -> Step:
        """The step once a restart's delay has passed: the next submission, unless the
        last one ended meanwhile (a terminal event of the run after it)."""
        attempt = self.restart_log.last_submit_attempt()
        ended = self._ended(DriverFailure(attempt, None, "the job ended", []))
        return ended or Restart(attempt + 1, 0.0)

    # ------------------------------------------------------------------ decisions

    def _decide(self, failure: DriverFailure) -> Step:
        """After submission ``failure.attempt`` ended non-zero (or its driver was found
        dead): :class:`Done` if the run wrote a terminal event after that submission, else
        record the failure and ask the restart strategy; raises
        :class:`CheckpointedJobFailedError` when no restart follows.

        The terminal event is judged by its place in the history, not by when it was
        seen: a ``JOB_FINISHED`` whose write landed after the probe's last look (the
        driver gave up on the answer and died) still ends the submission, and one that
        lands between the first look and the ``FAILURE`` (so below it) is seen by the
        second look, once the decision is on top of everything below it. A decision the
        runtime's in-process strategy already took (it declined a restart) stands and is
        not counted twice.
        """
        ended = self._ended(failure)
        if ended is not None:
            return ended
        gave_up = self.restart_log.refresh().in_process_gave_up
        if gave_up is not None:
            self.log.info("the runtime's in-process restart strategy already gave up: %s",
                          gave_up)
            self._fail(failure, f"in-process restart declined ({gave_up})", write=False)
        decision = self.restart_log.record_failure(
            "driver", failure.cause, exit_code=failure.exit_code,
            error_lines=failure.error_lines, submit_attempt=failure.attempt)
        ended = self._ended(failure)
        if ended is not None:
            return ended
        if not decision.restart:
            self._fail(failure, decision.reason or "", write=True)
        count_restart(self.args.job)
        self.log.info("job %s attempt %d failed (%s); restarting in %.3f s (%s)",
                      self.args.job, failure.attempt, failure.cause, decision.delay_s,
                      decision.reason or "")
        return Restart(failure.attempt + 1, decision.delay_s)

    def _ended(self, failure: DriverFailure) -> Done | None:
        """:class:`Done` if the run's newest submission ended with a terminal event
        (``JOB_FAILED`` raises: the driver declared its failure final), else None."""
        end = self.restart_log.refresh().attempt_end
        if end is None:
            return None
        if end.type == JOB_FAILED:
            cause = str(end.data.get("cause") or "job failed")
            self._fail(failure, f"the job failed for good: {cause}", write=False)
        self.log.info("job %s attempt %d wrote %s before its end was seen: the run ended",
                      self.args.job, failure.attempt, end.type)
        return Done(self.result(failure.attempt))

    def _fail(self, failure: DriverFailure, reason: str, *, write: bool) -> None:
        if write:
            self.history.append(JOB_FAILED, run_id=self.run_id, cause=failure.cause,
                                exit_code=failure.exit_code, attempts=failure.attempt,
                                reason=reason)
        message = (
            f"job {self.args.job} failed after {failure.attempt} submission(s): {reason}\n"
            f"last error (exit code {failure.exit_code}): {failure.cause}\n"
            + "\n".join(f"    {line}" for line in failure.error_lines)
            + f"\nrestart history ({self.args.strategy.describe()}):\n"
            + format_restart_history(self.restart_log.restarts())
        )
        self.log.error("%s", message)
        raise CheckpointedJobFailedError(message)

    def result(self, attempt: int) -> dict[str, Any]:
        """The XCom of a clean end: the job, its last completed checkpoint, the attempts,
        ``outcome`` (``finished`` / ``stopped``) and the stop's ``savepoint_path``."""
        terminal = self.restart_log.refresh().attempt_end
        latest = self.catalog.latest_checkpoint()
        result: dict[str, Any] = {
            "job": self.args.job,
            "checkpoint_id": latest.checkpoint_id if latest else None,
            "checkpoint_path": self.catalog.uri_of(
                self.catalog.resolve(f"chk-{latest.checkpoint_id}")) if latest else None,
            "batch_id": latest.batch_id if latest else None,
            "attempts": attempt,
            "outcome": "stopped" if terminal is not None and terminal.type == JOB_STOPPED
            else "finished",
        }
        savepoint = terminal.data.get("savepoint") if terminal is not None else None
        if savepoint:
            result["savepoint_path"] = savepoint
        self.log.info("job %s ended cleanly after %d submission(s); last checkpoint %s",
                      self.args.job, attempt, result["checkpoint_path"])
        return result

    # ------------------------------------------------------------------ blocking path

    def run_blocking(self, submit: SubmitOnce, killed: KillSwitch) -> dict[str, Any]:
        """Submit, wait, decide, wait the delay, resubmit - until a clean end or a raise.

        ``killed`` (set by ``on_kill``) ends the loop with an error instead of a restart.
        """
        attempt = self.next_attempt()
        if attempt > 1:
            self.log.info("continuing supervision %s at submission attempt %d (earlier "
                          "attempts are in the job's history)", self.run_id, attempt)
        while True:
            restored_before = len(self.restart_log.refresh().restored)
            with watching(self.history):  # the driver's events, as metrics
                failure = submit(attempt, self.restore_for(attempt))
            for event in self.restart_log.refresh().restored[restored_before:]:
                if (event.data.get("run_id"), event.data.get("attempt")) != (self.run_id,
                                                                            attempt):
                    continue  # another driver's restore (a deposed one): not this attempt's
                self.log.info("attempt %d restored from %s %s (batch %s)", attempt,
                              event.data.get("kind", "checkpoint"), event.data.get("path"),
                              event.data.get("batch_id"))
            if failure is None:
                return self.result(attempt)
            if killed.is_set():
                raise AirflowException(f"job {self.args.job}: killed while attempt {attempt} ran")
            step = self._decide(failure)
            if isinstance(step, Done):
                return step.result
            if killed.wait(step.delay_s):
                raise AirflowException(f"job {self.args.job}: killed while waiting to restart")
            attempt = step.attempt
