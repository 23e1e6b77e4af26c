"""CheckpointSensor: wait for a completed checkpoint or savepoint of a job.

The completion marker (``_metadata``, written last) is what the sensor watches; a
snapshot without it is still in flight and never matches.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from airflow.sdk import BaseSensorOperator, Context, PokeReturnValue, conf
from airflow.sdk.exceptions import AirflowFailException, AirflowSensorTimeout

from airflow_ckpt.health import DEFAULT_MULTIPLE
from airflow_ckpt.hooks.checkpoint_store import DEFAULT_CONN_ID, CheckpointStoreHook
from airflow_ckpt.metrics import report_snapshot
from airflow_ckpt.options import parse_duration
from airflow_ckpt.triggers.checkpoint import CheckpointTrigger
from airflow_ckpt.triggers.matching import (
    CheckpointCondition,
    KindFilter,
    MatchResult,
    describe,
    poll_once,
    take_baseline,
)


def match_outcome(result: MatchResult) -> dict[str, Any]:
    """The summary of a ``matched`` result; otherwise raise the Airflow error for it.

    ``failed`` (request failed, stale job, unreadable storage) raises
    ``AirflowFailException``: waiting longer or retrying would not change the verdict.
    ``timeout`` raises ``AirflowSensorTimeout``. With ``soft_fail`` both skip the task.
    A match sets the job's checkpoint gauges (:func:`~airflow_ckpt.metrics.report_snapshot`).
    """
    if result.status == "matched" and result.summary is not None:
        report_snapshot(result.summary)
        return result.summary
    if result.status == "timeout":
        raise AirflowSensorTimeout(result.message)
    raise AirflowFailException(result.message or f"unexpected result {result!r}")


class CheckpointSensor(BaseSensorOperator):
    """Wait for a completed checkpoint or savepoint of a job that matches a condition.

    Conditions (all given ones must hold):

    * ``new_only``: only snapshots completed after the sensor started (the baseline is
      recorded when the task starts). Default: True unless ``min_checkpoint_id`` or
      ``request_id`` is given;
    * ``min_checkpoint_id``: checkpoint id >= N (templated);
    * ``request_id``: the savepoint answering that savepoint request, e.g.
      ``"{{ ti.xcom_pull(task_ids='savepoint', key='request_id') }}"`` from a
      ``TriggerSavepointOperator(wait_for_completion=False)`` (templated). A failed
      request fails the sensor with the job's reason;
    * ``kind``: ``"checkpoint"``, ``"savepoint"`` or ``"any"``.

    ``max_checkpoint_age`` adds a health check, after the Flink Kubernetes operator's
    checkpoint-progress check: the sensor fails (``AirflowFailException``) as soon as the
    newest completed checkpoint is older than this (a job without any checkpoint gets
    this long from the sensor's start). ``"10 min"``, seconds or a ``timedelta``.

    ``wait_for_healthy`` (with ``checkpoint_interval``) waits for "healthy" as well: a
    match counts only while the job's newest completed checkpoint is no older than
    ``checkpoint_progress_multiple`` x ``checkpoint_interval`` (the supervisor's
    checkpoint-progress rule, :func:`airflow_ckpt.health.checkpoint_progress`). Use it
    with ``new_only=False`` to wait until a running job is healthy.

    ``deferrable=True`` (default) releases the worker slot: the wait runs in the
    triggerer (:class:`~airflow_ckpt.triggers.checkpoint.CheckpointTrigger`) and the
    sensor's ``timeout`` becomes the deferral's timeout. ``deferrable=False`` pokes
    every ``poke_interval`` seconds (``mode="poke"``); ``mode="reschedule"`` cannot keep
    the ``new_only`` baseline between pokes and is refused for it.

    Returns (XCom) the matching snapshot's summary: ``path`` (full URI), ``job``,
    ``kind``, ``id`` (checkpoint id), ``savepoint_id``, ``batch_id``, ``trigger``,
    ``completed_ts``, ``state_size``, ``checkpointed_size``. When several match, the
    newest.

    :param job_name: the job (templated)
    :param checkpoint_storage: the storage root, ``s3://bucket/prefix`` (templated)
    :param storage_conn_id: ``aws``-type connection for the storage
    """

    template_fields: Sequence[str] = (
        "job_name", "checkpoint_storage", "min_checkpoint_id", "request_id",
    )
    ui_color = "#d9ecf2"

    def __init__(
        self,
        *,
        job_name: str,
        checkpoint_storage: str,
        storage_conn_id: str | None = DEFAULT_CONN_ID,
        kind: KindFilter = "any",
        new_only: bool | None = None,
        min_checkpoint_id: int | str | None = None,
        request_id: str | None = None,
        max_checkpoint_age: float | str | timedelta | None = None,
        wait_for_healthy: bool = False,
        checkpoint_interval: float | str | timedelta | None = None,
        checkpoint_progress_multiple: float = DEFAULT_MULTIPLE,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        poke_interval: float | timedelta = 5.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(poke_interval=poke_interval, **kwargs)
        self.job_name = job_name
        self.checkpoint_storage = checkpoint_storage
        self.storage_conn_id = storage_conn_id
        self.kind = kind
        self.min_checkpoint_id = min_checkpoint_id
        self.request_id = request_id
        self.new_only = (min_checkpoint_id is None and request_id is None
                         if new_only is None else new_only)
        if isinstance(max_checkpoint_age, timedelta):
            max_checkpoint_age = max_checkpoint_age.total_seconds()
        self.max_checkpoint_age_s = (None if max_checkpoint_age is None
                                     else parse_duration(max_checkpoint_age))
        if isinstance(checkpoint_interval, timedelta):
            checkpoint_interval = checkpoint_interval.total_seconds()
        if wait_for_healthy and checkpoint_interval is None:
            raise ValueError("CheckpointSensor: wait_for_healthy needs checkpoint_interval "
                             "(the job's execution.checkpointing.interval)")
        self.healthy_interval_s = (parse_duration(checkpoint_interval)
                                   if wait_for_healthy and checkpoint_interval is not None
                                   else None)
        self.checkpoint_progress_multiple = float(checkpoint_progress_multiple)
        self.deferrable = deferrable
        if not deferrable and self.reschedule and self.new_only:
            raise ValueError(
                "CheckpointSensor: mode='reschedule' cannot keep the new_only baseline "
                "between pokes; use deferrable=True (recommended) or mode='poke'"
            )
        # validate what is known now (templated fields are validated again at run time)
        if "{{" not in f"{job_name}{min_checkpoint_id}{request_id}":
            self._condition()
        self._baselined: CheckpointCondition | None = None
        self._poke_hook: CheckpointStoreHook | None = None
        self._wait_started_ts = 0.0

    def _condition(self) -> CheckpointCondition:
        """The condition from the (rendered) arguments, before any baseline."""
        min_id = self.min_checkpoint_id
        if isinstance(min_id, str):
            min_id = int(min_id) if min_id.strip().lstrip("-").isdigit() else min_id
        return CheckpointCondition(
            job=self.job_name,
            kind=self.kind,
            min_checkpoint_id=min_id,  # type: ignore[arg-type]  # validated there
            request_id=self.request_id or None,
            max_checkpoint_age_s=self.max_checkpoint_age_s,
            healthy_interval_s=self.healthy_interval_s,
            healthy_multiple=self.checkpoint_progress_multiple,
        )

    def _hook(self) -> CheckpointStoreHook:
        return CheckpointStoreHook(self.checkpoint_storage, self.storage_conn_id)

    def _start(self, hook: CheckpointStoreHook) -> CheckpointCondition:
        """Record the wait's start (and the baseline, for ``new_only``)."""
        condition = self._condition()
        self._wait_started_ts = time.time()
        if self.new_only:
            condition = take_baseline(hook.catalog(condition.job), condition)
        self.log.info("waiting for %s", describe(condition))
        return condition

    def execute(self, context: Context) -> Any:
        if not self.deferrable:
            try:
                return super().execute(context)
            finally:
                if self._poke_hook is not None:
                    self._poke_hook.close()
                    self._poke_hook = None
        hook = self._hook()
        try:
            condition = self._start(hook)
            result = poll_once(hook.catalog(condition.job), condition,
                               wait_started_ts=self._wait_started_ts)
        finally:
            hook.close()
        if result.status != "waiting":
            return match_outcome(result)
        self.defer(
            trigger=CheckpointTrigger(
                storage_uri=self.checkpoint_storage,
                condition=condition.to_dict(),
                conn_id=self.storage_conn_id,
                poll_interval=self.poke_interval,
                wait_started_ts=self._wait_started_ts,
            ),
            method_name="execute_complete",
            timeout=timedelta(seconds=self.timeout),
        )

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        """Resume after the trigger fired: return the summary or raise its failure."""
        result = MatchResult.from_payload(event)
        if result.status == "matched" and result.checked_ts:
            self.log.info("matched %s; detected at %.3f, resumed %.3f s later",
                          (result.summary or {}).get("path"), result.checked_ts,
                          time.time() - result.checked_ts)
        return match_outcome(result)

    def poke(self, context: Context) -> bool | PokeReturnValue:
        if self._poke_hook is None:
            self._poke_hook = self._hook()
        hook = self._poke_hook
        if self._baselined is None:
            self._baselined = self._start(hook)
        result = poll_once(hook.catalog(self._baselined.job), self._baselined,
                           wait_started_ts=self._wait_started_ts)
        if result.status == "waiting":
            self.log.info("%s", result.message)
            return False
        return PokeReturnValue(is_done=True, xcom_value=match_outcome(result))
