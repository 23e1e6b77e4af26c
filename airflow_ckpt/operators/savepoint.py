"""TriggerSavepointOperator: take a savepoint of a running job as an Airflow task.

The operator writes a savepoint request under ``<job>/control/``; the job's runtime
picks it up at its next micro-batch boundary, writes a self-contained savepoint
``savepoints/sp-<id>/`` (``_metadata`` last) and answers the request with the
savepoint's path or the reason it failed. With ``stop=True`` the job then stops
cleanly (stop-with-savepoint) and its supervisor task ends successfully.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from airflow.sdk import BaseOperator, Context, conf

from airflow_ckpt.errors import SavepointError
from airflow_ckpt.hooks.checkpoint_store import DEFAULT_CONN_ID, CheckpointStoreHook
from airflow_ckpt.jobnames import unknown_job_hint
from airflow_ckpt.options import parse_duration
from airflow_ckpt.runtime.control.savepoints import ensure_job_running, expire_request
from airflow_ckpt.runtime.storage.layout import validate_savepoint_id
from airflow_ckpt.triggers.checkpoint import CheckpointTrigger
from airflow_ckpt.triggers.matching import (
    CheckpointCondition,
    MatchResult,
    poll_once,
    wait_for_match,
)

#: default of ``defer_after``: how long the task polls in the worker before deferring. An
#: idle job answers in one lease heartbeat plus one micro-batch (6.4 s on S3), well
#: within this, so the usual savepoint never defers (see the class docstring)
DEFAULT_DEFER_AFTER_S = 30.0
#: default of ``worker_poll_interval``: seconds between checks during that brief wait
DEFAULT_WORKER_POLL_INTERVAL_S = 0.5

#: extra seconds the deferral may outlive the request's own deadline (the trigger fires
#: a ``timeout`` event at the deadline; this is only a safety net)
DEFERRAL_GRACE_S = 120.0


def as_bool(value: object, name: str = "stop") -> bool:
    """A bool from a bool or a rendered template (``"True"``, ``"false"``, ``"1"``...)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "1", "yes", "on"):
        return True
    if isinstance(value, str) and value.strip().lower() in ("false", "0", "no", "off", ""):
        return False
    raise SavepointError(f"{name} must be a boolean, got {value!r}")


def _seconds(value: float | str | timedelta, name: str, *, allow_zero: bool = False) -> float:
    seconds = value.total_seconds() if isinstance(value, timedelta) else parse_duration(value)
    if seconds < 0 or (seconds == 0 and not allow_zero):
        raise ValueError(f"{name} must be {'>= 0' if allow_zero else 'positive'}, "
                         f"got {value!r}")
    return seconds


class TriggerSavepointOperator(BaseOperator):
    """Take a savepoint of a running checkpointed job; return its path (XCom).

    1. Checks that the job is running: the newest of its ``job_started`` /
       ``job_finished`` / ``job_stopped`` / ``job_failed`` history events must be
       ``job_started``; otherwise the task fails with "job X is not running (last event
       ...)" and no request is written.
    2. Writes the request (pushed as XCom ``request_id``). It expires after
       ``timeout``: a job that sees it later ignores it.
    3. Waits for the job's answer. ``deferrable=True``: first polls in the worker every
       ``worker_poll_interval`` seconds for up to ``defer_after`` seconds, and defers
       to the triggerer (the worker slot is released) only if the job has not answered
       by then. An answer within that window never defers, which keeps the task clear
       of Airflow's short-deferral race (a trigger firing within seconds of the
       deferral can leave the task failed with "finished with state success, but the
       task instance's state attribute is queued", apache/airflow#72716).
       ``deferrable=False``: polls every ``poll_interval`` seconds until the answer.
    4. Returns the savepoint's full URI (``s3://.../<job>/savepoints/sp-<id>``), also
       pushed with the savepoint's summary as XCom ``savepoint``. Fails with the job's
       ``failure_message`` if the savepoint failed, or with a timeout error; on timeout
       the request is also answered "failed" (create-only), so a late job cannot act on
       it; if the job's answer won that race, its answer is used.

    :param job_name: the job (templated)
    :param checkpoint_storage: its storage root (templated)
    :param storage_conn_id: ``aws``-type connection for the storage
    :param stop: stop-with-savepoint: the job stops after the savepoint (templated; a
        bool or a rendered ``"{{ params.stop }}"``)
    :param timeout: how long the job has to complete the savepoint (seconds,
        ``"10 min"`` or ``timedelta``; default 10 minutes)
    :param savepoint_id: the savepoint's id (``sp-<id>``); default: the job picks one
        (templated)
    :param deferrable: wait in the triggerer (default) instead of on a worker
    :param poll_interval: seconds between checks of the storage (blocking wait and
        trigger)
    :param defer_after: deferrable only: how long to poll in the worker before
        deferring (seconds, ``"30 s"`` or ``timedelta``; default 30 s; 0 defers at once)
    :param worker_poll_interval: seconds between checks during that brief wait
        (default 0.5)
    :param wait_for_completion: False returns the request id right after writing the
        request (wait with ``CheckpointSensor(request_id=...)``)
    """

    template_fields: Sequence[str] = ("job_name", "checkpoint_storage", "stop", "savepoint_id")
    ui_color = "#f3e3c3"

    def __init__(
        self,
        *,
        job_name: str,
        checkpoint_storage: str,
        storage_conn_id: str | None = DEFAULT_CONN_ID,
        stop: bool | str = False,
        timeout: float | str | timedelta = 600.0,
        savepoint_id: str | None = None,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        poll_interval: float = 2.0,
        defer_after: float | str | timedelta = DEFAULT_DEFER_AFTER_S,
        worker_poll_interval: float = DEFAULT_WORKER_POLL_INTERVAL_S,
        wait_for_completion: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.job_name = job_name
        self.checkpoint_storage = checkpoint_storage
        self.storage_conn_id = storage_conn_id
        self.stop = stop
        self.timeout_s = _seconds(timeout, "timeout")
        self.savepoint_id = savepoint_id
        self.deferrable = deferrable
        if poll_interval <= 0:
            raise ValueError(f"poll_interval must be positive, got {poll_interval!r}")
        self.poll_interval = float(poll_interval)
        self.defer_after_s = _seconds(defer_after, "defer_after", allow_zero=True)
        if worker_poll_interval <= 0:
            raise ValueError(
                f"worker_poll_interval must be positive, got {worker_poll_interval!r}")
        self.worker_poll_interval = float(worker_poll_interval)
        self.wait_for_completion = wait_for_completion

    def _hook(self) -> CheckpointStoreHook:
        return CheckpointStoreHook(self.checkpoint_storage, self.storage_conn_id)

    def execute(self, context: Context) -> str:
        stop = as_bool(self.stop)
        savepoint_id = validate_savepoint_id(self.savepoint_id) if self.savepoint_id else None
        ti = context["ti"]
        hook = self._hook()
        try:
            try:
                started = ensure_job_running(hook.storage, self.job_name)
            except SavepointError as exc:
                hint = unknown_job_hint(hook.storage, self.job_name)
                if hint:
                    raise SavepointError(f"{exc}; {hint}") from exc
                raise
            self.log.info("job %s is running (started %s)", self.job_name,
                          time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started.ts)))
            request = hook.control(self.job_name).request_savepoint(
                stop=stop,
                timeout_s=self.timeout_s,
                savepoint_id=savepoint_id,
                requested_by=f"airflow:{ti.dag_id}/{ti.run_id}/{ti.task_id}",
            )
            self.log.info("requested %s of job %s: request %s (expires in %.0f s)",
                          "stop-with-savepoint" if stop else "a savepoint", self.job_name,
                          request.request_id, self.timeout_s)
            ti.xcom_push(key="request_id", value=request.request_id)
            if not self.wait_for_completion:
                return request.request_id
            condition = CheckpointCondition(job=self.job_name, kind="savepoint",
                                            request_id=request.request_id)
            if self.deferrable:
                result = wait_for_match(
                    hook.catalog(self.job_name), condition,
                    poll_interval=self.worker_poll_interval,
                    wait_started_ts=request.created_ts, deadline_ts=request.expires_ts,
                    until_ts=request.created_ts + self.defer_after_s)
                if result.status != "waiting":
                    return self._finish(context, hook, request.request_id, result)
                self.log.info("no answer within %g s: deferring the wait to the triggerer",
                              self.defer_after_s)
                self.defer(
                    trigger=CheckpointTrigger(
                        storage_uri=self.checkpoint_storage,
                        condition=condition.to_dict(),
                        conn_id=self.storage_conn_id,
                        poll_interval=self.poll_interval,
                        wait_started_ts=request.created_ts,
                        deadline_ts=request.expires_ts,
                    ),
                    method_name="execute_complete",
                    kwargs={"request_id": request.request_id},
                    timeout=timedelta(seconds=self.timeout_s + DEFERRAL_GRACE_S),
                )
            result = wait_for_match(
                hook.catalog(self.job_name), condition, poll_interval=self.poll_interval,
                wait_started_ts=request.created_ts, deadline_ts=request.expires_ts)
            return self._finish(context, hook, request.request_id, result)
        finally:
            hook.close()

    def execute_complete(self, context: Context, event: dict[str, Any],
                         request_id: str | None = None) -> str:
        """Resume after the trigger fired.

        ``request_id`` comes from the deferral's kwargs; ``dag.test()`` does not pass
        those on (it resumes with the event only), so it falls back to the XCom pushed
        before deferring.
        """
        if request_id is None:
            request_id = context["ti"].xcom_pull(task_ids=self.task_id, key="request_id")
        if not request_id:
            raise SavepointError("resumed without the savepoint request id")
        hook = self._hook()
        try:
            return self._finish(context, hook, request_id, MatchResult.from_payload(event))
        finally:
            hook.close()

    def _finish(self, context: Context, hook: CheckpointStoreHook, request_id: str,
                result: MatchResult) -> str:
        job = self.job_name
        if result.status == "timeout":
            ti = context["ti"]
            answer = expire_request(
                hook.storage, job, request_id,
                f"expired: no savepoint within {self.timeout_s:g} s; cancelled by "
                f"airflow:{ti.dag_id}/{ti.run_id}/{ti.task_id}",
            )
            if answer is not None:
                # the job answered just as the wait ended: its answer decides
                self.log.info("the job answered request %s as the wait timed out", request_id)
                result = poll_once(hook.catalog(job), CheckpointCondition(
                    job=job, kind="savepoint", request_id=request_id),
                    wait_started_ts=result.checked_ts)
            else:
                raise SavepointError(
                    f"savepoint of job {job!r} timed out after {self.timeout_s:g} s: the job "
                    f"did not answer request {request_id} (it takes savepoints at micro-batch "
                    "boundaries: is it processing batches?). The request was cancelled, so the "
                    "job will not act on it later."
                )
        if result.status != "matched" or result.summary is None:
            raise SavepointError(result.message or f"savepoint of job {job!r} failed")
        summary = result.summary
        context["ti"].xcom_push(key="savepoint", value=summary)
        self.log.info("savepoint of job %s completed: %s (checkpoint %s, batch %s)", job,
                      summary["path"], summary.get("id"), summary.get("batch_id"))
        return str(summary["path"])
