"""Supervision of one checkpointed job run: the one home of both supervision paths.

:class:`Supervisor` is rebuilt from the operator's validated arguments and the job's
storage at every (re)entry of the task - the blocking ``execute``, and the deferrable
path's every resume - so nothing lives in the operator between deferrals and a worker
restart loses nothing. Both paths ask it the same questions:

* :meth:`Supervisor.next_attempt` / :meth:`~Supervisor.restore_for`: which submission
  comes next and where it starts (``latest`` only once *this* run has a checkpoint of
  its own, see :func:`~airflow_ckpt.supervision.resubmit_restore`);
* :meth:`~Supervisor.record_submit`: the ``JOB_SUBMITTED`` event; deferred, the trigger
  that watches it (:meth:`~Supervisor.watch`, :meth:`~Supervisor.reattach`);
* :meth:`~Supervisor.restart_delay`: after a driver failure, record it and ask the
  restart strategy (history-backed: the window and backoff hold across deferrals,
  worker restarts and the runtime's in-process restarts); returns the delay or raises
  :class:`CheckpointedJobFailedError`;
* :meth:`~Supervisor.result`: the XCom of a clean end.

The blocking path loops over these in :meth:`Supervisor.run_blocking` with a submit
callable; the deferrable path runs the same steps one resume at a time (submit, defer
on the supervision trigger, resume with its verdict, defer the delay, resubmit).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from airflow.sdk.exceptions import AirflowException, AirflowFailException

from airflow_ckpt.errors import RestartsExhaustedError
from airflow_ckpt.hooks.checkpoint_store import CheckpointStoreHook
from airflow_ckpt.hooks.spark_submit import CheckpointedSparkSubmitHook
from airflow_ckpt.metrics import count_restart, watching
from airflow_ckpt.operators.arguments import ValidatedArgs
from airflow_ckpt.runtime.checkpoint.catalog import CheckpointCatalog
from airflow_ckpt.runtime.history.events import (
    JOB_FAILED,
    JOB_FINISHED,
    JOB_STOPPED,
    JOB_SUBMITTED,
    HistoryEvent,
)
from airflow_ckpt.runtime.history.journal import JobHistory
from airflow_ckpt.runtime.history.restart_log import RestartLog, format_restart_history
from airflow_ckpt.runtime.lease.record import read_lease
from airflow_ckpt.supervision import (
    RESTORE_LATEST,
    DriverFailure,
    RunCheckpoints,
    resubmit_restore,
)
from airflow_ckpt.triggers.supervision import DriverSupervisionTrigger


class CheckpointedJobFailedError(RestartsExhaustedError, AirflowFailException):
    """The restart strategy declined another restart; the message has the last error."""


#: one blocking submission: (attempt, restore) -> None on exit 0, else the failure
SubmitOnce = Callable[[int, str], DriverFailure | None]


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

    @classmethod
    def open(cls, args: ValidatedArgs, *, conn_id: str | None, run_id: str,
             check_restore: Callable[[CheckpointCatalog, str], str],
             log: Any) -> Supervisor:
        """Open the job's storage and history; ``check_restore`` resolves ``args.restore``."""
        store = CheckpointStoreHook(args.storage_uri, conn_id=conn_id)
        history, catalog = store.history(args.job), store.catalog(args.job)
        return cls(args, store, catalog, history, run_id,
                   RestartLog(history, args.restart_params, run_id),
                   RunCheckpoints(history, run_id), check_restore(catalog, args.restore), log)

    # ------------------------------------------------------------------ submissions

    def next_attempt(self) -> int:
        """The attempt number of the next submission (the history knows the last)."""
        return self.restart_log.last_submit_attempt() + 1

    def restore_for(self, attempt: int) -> str:
        """Attempt 1: the operator's target. Later: ``latest`` once this run has a
        checkpoint of its own, until then the original target again (issue 8 defect 4)."""
        if attempt == 1:
            return self.first_restore
        restore = resubmit_restore(self.first_restore, self.run_checkpoints.progress())
        if restore != RESTORE_LATEST:
            self.log.info("this run has no completed checkpoint yet: resubmitting with "
                          "restore=%s", restore)
        return restore

    def record_submit(self, hook: CheckpointedSparkSubmitHook, attempt: int, restore: str,
                      **extra: Any) -> HistoryEvent:
        """Append this submission's ``JOB_SUBMITTED`` (``extra``: application, airflow
        ids, the detached driver's log and host)."""
        self.log.info("submitting job %s, attempt %d, restore=%s, master %s", self.args.job,
                      attempt, restore, hook.master)
        return self.history.append(JOB_SUBMITTED, run_id=self.run_id, attempt=attempt,
                                   restore=restore, master=hook.master,
                                   deploy_mode=hook.deploy_mode, **extra)

    def watch(self, submitted: HistoryEvent, epoch_before: int, *, driver_pid: int | None,
              settings: Mapping[str, Any]) -> DriverSupervisionTrigger:
        """The trigger that watches the submission ``submitted`` (its ``JOB_SUBMITTED``,
        which names the attempt, the detached driver's host and log); ``epoch_before``:
        the newest lease epoch before it; ``settings``: the trigger's ``conn_id``,
        ``health``, ``poll_interval``, ``startup_timeout_s`` and ``stop_timeout_s``."""
        log = submitted.data.get("driver_log")
        return DriverSupervisionTrigger(
            storage_uri=self.args.storage_uri, job=self.args.job, run_id=self.run_id,
            submitted_key=submitted.key, lease_epoch_before=epoch_before,
            driver_pid=driver_pid, driver_host=submitted.data.get("driver_host"),
            exit_path=f"{log}.exit" if log else None, attempt=submitted.data.get("attempt"),
            driver_log=log, **settings)

    def reattach(self, attempt: int, settings: Mapping[str, Any]
                 ) -> DriverSupervisionTrigger | None:
        """A retried task whose detached driver of ``attempt`` (this run) still holds the
        job's lease: the trigger to watch it again - resubmitting would start a second
        driver, which the lease refuses as final. None when there is nothing to watch."""
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

    # ------------------------------------------------------------------ decisions

    def restart_delay(self, failure: DriverFailure, *, final_cause: str | None = None) -> float:
        """After a driver failure: the delay before the next submission, or raise.

        ``final_cause``: the driver itself declared the failure final (``job_failed`` of
        this run: invalid settings, state that does not fit the query, another driver
        owns the job, or its in-process strategy gave up) - resubmitting cannot help.
        A decision the runtime's in-process strategy already took (it declined a
        restart) stands and is not counted twice. Otherwise the failure is recorded and
        the strategy decides. Raises :class:`CheckpointedJobFailedError` (after writing
        ``JOB_FAILED`` unless the driver did) when no restart follows.
        """
        if final_cause is not None:
            self._fail(failure, f"the job failed for good: {final_cause}", write=False)
        gave_up = self.restart_log.refresh().in_process_gave_up
        if gave_up is not None:
            self.log.info("the runtime's in-process restart strategy already gave up: %s",
                          gave_up)
            self._fail(failure, f"in-process restart declined ({gave_up})", write=False)
        decision = self.restart_log.record_failure(
            "driver", failure.cause, exit_code=failure.exit_code,
            error_lines=failure.error_lines, submit_attempt=failure.attempt)
        if not decision.restart:
            self._fail(failure, decision.reason or "", write=True)
        count_restart(self.args.job)
        self.log.info("job %s attempt %d failed (%s); restarting in %.3f s (%s)",
                      self.args.job, failure.attempt, failure.cause, decision.delay_s,
                      decision.reason or "")
        return decision.delay_s

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
        terminal = self.restart_log.refresh().last_terminal or self._terminal_of_this_run()
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

    def _terminal_of_this_run(self) -> HistoryEvent | None:
        """The job's newest terminal event if it came after this run's last submission.

        A supervisor rebuilt after the end (the deferred resume) reads the history
        backwards from the end, and a terminal event ends the scan there: it is not in
        the run state, but it is how this run ended (``job_stopped``: its savepoint).
        """
        found, _ = self.history.newest_until(
            lambda event: True, (JOB_FINISHED, JOB_STOPPED, JOB_FAILED, JOB_SUBMITTED))
        newest = found[0] if found else None
        if newest is None or newest.type == JOB_SUBMITTED \
                or newest.data.get("run_id") not in (None, self.run_id):
            return None
        return newest

    # ------------------------------------------------------------------ blocking path

    def run_blocking(self, submit: SubmitOnce, killed: threading.Event) -> dict[str, Any]:
        """Submit, wait, decide, wait the delay, resubmit - until a clean end or a raise.

        ``killed`` (set by ``on_kill``) ends the loop with an error instead of a restart.
        """
        attempt = self.next_attempt()
        if attempt > 1:
            self.log.info("continuing supervision %s at submission attempt %d (earlier "
                          "attempts are in the job's history)", self.run_id, attempt)
        while True:
            before = self.restart_log.refresh()
            restored_before, terminal_before = len(before.restored), before.last_terminal
            with watching(self.history):  # the driver's events, as metrics
                failure = submit(attempt, self.restore_for(attempt))
            state = self.restart_log.refresh()
            for event in state.restored[restored_before:]:
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
            delay_s = self.restart_delay(
                failure, final_cause=state.failed_for_good(self.run_id, terminal_before))
            if killed.wait(delay_s):
                raise AirflowException(f"job {self.args.job}: killed while waiting to restart")
            attempt += 1
