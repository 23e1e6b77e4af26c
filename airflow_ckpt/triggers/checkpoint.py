"""Triggers that watch a job's checkpoint storage from Airflow's triggerer.

* :class:`CheckpointTrigger`: one event, then done. A deferred ``CheckpointSensor`` or
  ``TriggerSavepointOperator`` hands it its condition; it polls the storage until the
  condition matches, fails or times out, and yields a single event whose payload is a
  :meth:`~airflow_ckpt.triggers.matching.MatchResult.to_payload`.
* :class:`CheckpointEventTrigger`: an ``AssetWatcher`` trigger that fires once per new
  completed checkpoint/savepoint of a job, forever, so downstream DAGs can be scheduled
  on ``Asset(..., watchers=[AssetWatcher(name=..., trigger=CheckpointEventTrigger(...))])``.

Both poll the synchronous storage in a worker thread (``asyncio.to_thread``) so the
triggerer's event loop never blocks, and both use the shared checks in
:mod:`airflow_ckpt.triggers.matching`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseEventTrigger, BaseTrigger, TriggerEvent

from airflow_ckpt.errors import EndpointUnreachableError
from airflow_ckpt.hooks import DEFAULT_CONN_ID
from airflow_ckpt.hooks.checkpoint_store import CheckpointStoreHook
from airflow_ckpt.metrics import report_snapshot
from airflow_ckpt.runtime.checkpoint.catalog import CheckpointCatalog
from airflow_ckpt.runtime.checkpoint.metadata import Manifest
from airflow_ckpt.triggers.matching import (
    CheckpointCondition,
    KindFilter,
    MatchResult,
    advance,
    describe,
    new_snapshots,
    poll_once,
    summarize,
    take_baseline,
)


def _classpath(obj: object) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def _check_interval(poll_interval: float) -> float:
    if isinstance(poll_interval, bool) or not isinstance(poll_interval, int | float) or (
        poll_interval <= 0
    ):
        raise ValueError(f"poll_interval must be a positive number of seconds, got "
                         f"{poll_interval!r}")
    return float(poll_interval)


class CheckpointTrigger(BaseTrigger):
    """Poll a job's storage until a :class:`CheckpointCondition` matches; fire once.

    :param storage_uri: the checkpoint storage root (``s3://bucket/prefix``, ``file:///...``)
    :param condition: :meth:`CheckpointCondition.to_dict` (already baselined if the
        waiter wants "new" snapshots only: the baseline is taken by the task, before it
        defers, so it reflects the moment the wait began)
    :param conn_id: the ``aws`` connection for S3 (None: the AWS environment)
    :param poll_interval: seconds between checks
    :param wait_started_ts: when the wait began (epoch s): the reference of
        ``max_checkpoint_age_s`` for a job without checkpoints, and of timeout messages
    :param deadline_ts: when to give up (epoch s) with a ``timeout`` event; None waits
        until the deferral's own timeout

    The event payload is ``MatchResult.to_payload()``: ``status`` is ``matched`` (with
    ``summary``), ``failed`` or ``timeout`` (with ``message``).
    """

    def __init__(
        self,
        *,
        storage_uri: str,
        condition: dict[str, Any],
        conn_id: str | None = DEFAULT_CONN_ID,
        poll_interval: float = 5.0,
        wait_started_ts: float | None = None,
        deadline_ts: float | None = None,
    ) -> None:
        super().__init__()
        self.storage_uri = storage_uri
        self.condition = CheckpointCondition.from_dict(condition)
        self.conn_id = conn_id
        self.poll_interval = _check_interval(poll_interval)
        self.wait_started_ts = time.time() if wait_started_ts is None else float(wait_started_ts)
        self.deadline_ts = None if deadline_ts is None else float(deadline_ts)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return _classpath(self), {
            "storage_uri": self.storage_uri,
            "condition": self.condition.to_dict(),
            "conn_id": self.conn_id,
            "poll_interval": self.poll_interval,
            "wait_started_ts": self.wait_started_ts,
            "deadline_ts": self.deadline_ts,
        }

    async def run(self) -> AsyncIterator[TriggerEvent]:
        hook = CheckpointStoreHook(self.storage_uri, self.conn_id)
        try:
            catalog = await asyncio.to_thread(
                lambda: CheckpointCatalog(hook.storage, self.condition.job))
            self.log.info("waiting for %s in %s", describe(self.condition), self.storage_uri)
            while True:
                result = await asyncio.to_thread(
                    poll_once, catalog, self.condition,
                    wait_started_ts=self.wait_started_ts, deadline_ts=self.deadline_ts)
                if result.status != "waiting":
                    self.log.info("checkpoint trigger done: %s %s", result.status,
                                  result.summary or result.message)
                    yield TriggerEvent(result.to_payload())
                    return
                pause = self.poll_interval
                if self.deadline_ts is not None:
                    pause = max(0.0, min(pause, self.deadline_ts - time.time()))
                await asyncio.sleep(pause)
        except Exception as exc:  # e.g. the storage could not be opened (bad URI)
            self.log.exception("checkpoint trigger failed")
            yield TriggerEvent(MatchResult(
                "failed", message=f"{type(exc).__name__}: {exc}", checked_ts=time.time()
            ).to_payload())
        finally:
            # not awaited: a generator closed mid-wait must not await in its finally
            hook.close()


class CheckpointEventTrigger(BaseEventTrigger):
    """Fire one event per newly completed checkpoint and/or savepoint of a job.

    Use it in an ``AssetWatcher``::

        Asset("ckpt://orders", watchers=[AssetWatcher(
            name="orders_checkpoints",
            trigger=CheckpointEventTrigger(storage_uri="s3://ckpt", job="orders",
                                           kind="savepoint"))])

    Each event's payload is :func:`~airflow_ckpt.triggers.matching.summarize` of the
    snapshot (``path``, ``job``, ``kind``, ``id``, ``savepoint_id``, ``batch_id``, ...);
    a downstream DAG reads it from ``triggering_asset_events`` as
    ``event.extra["payload"]``. Each also sets the job's checkpoint gauges
    (:func:`~airflow_ckpt.metrics.report_snapshot`).

    Only *new* snapshots fire (Airflow's "avoid infinite scheduling" rule: a condition
    that stays true, like "a checkpoint exists", must not fire on every poll). The
    kwargs hold no per-instance values (no timestamps), so the trigger's identity (its
    hash) is stable across DAG parses. What "new" means across triggerer restarts:

    * with Airflow's asset state store (3.3+; injected into watchers as
      ``asset_state_store``), the watermark (last checkpoint id, known savepoint ids) is
      persisted there after each event: nothing is skipped and nothing already fired
      fires again, except the one event in flight when the triggerer died
      (at-least-once);
    * without it (older Airflow, or one trigger shared by several assets), the
      watermark lives in memory and a restart re-baselines: snapshots completed while
      no triggerer ran are not fired, nothing fires twice.

    The first start (no stored watermark) takes the baseline: existing snapshots do not
    fire. Checkpoint ids only grow for a job (restores continue the counter); if a job's
    storage is wiped and the job starts again from id 1, clear the asset's state.

    :param storage_uri: the checkpoint storage root
    :param job: the job to watch
    :param kind: ``"checkpoint"``, ``"savepoint"`` or ``"any"``
    :param conn_id: the ``aws`` connection for S3 (None: the AWS environment)
    :param poll_interval: seconds between polls of the storage
    :param min_checkpoint_id: ignore snapshots with a smaller checkpoint id
    """

    def __init__(
        self,
        *,
        storage_uri: str,
        job: str,
        kind: KindFilter = "any",
        conn_id: str | None = DEFAULT_CONN_ID,
        poll_interval: float = 30.0,
        min_checkpoint_id: int | None = None,
    ) -> None:
        super().__init__()
        self.storage_uri = storage_uri
        self.base_condition = CheckpointCondition(
            job=job, kind=kind, min_checkpoint_id=min_checkpoint_id)
        self.conn_id = conn_id
        self.poll_interval = _check_interval(poll_interval)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return _classpath(self), {
            "storage_uri": self.storage_uri,
            "job": self.base_condition.job,
            "kind": self.base_condition.kind,
            "conn_id": self.conn_id,
            "poll_interval": self.poll_interval,
            "min_checkpoint_id": self.base_condition.min_checkpoint_id,
        }

    @property
    def state_key(self) -> str:
        """The asset state store key of this watcher's watermark."""
        c = self.base_condition
        return f"airflow_ckpt.watermark.{c.job}.{c.kind}"

    async def _load_watermark(self) -> CheckpointCondition | None:
        store = self.asset_state_store
        if store is None:
            return None
        try:
            saved = await store.aget(self.state_key)
        except Exception as exc:  # several assets share this trigger, or no comms
            self.log.warning("asset state store unavailable (%s); watermark kept in memory",
                             exc)
            self.asset_state_store = None
            return None
        if not isinstance(saved, dict):
            return None
        values: dict[str, Any] = self.base_condition.to_dict()
        values["after_checkpoint_id"] = saved.get("after_checkpoint_id")
        values["known_savepoints"] = saved.get("known_savepoints")
        try:
            return CheckpointCondition.from_dict(values)
        except (ValueError, TypeError) as exc:
            self.log.warning("ignoring unreadable watermark %r: %s", saved, exc)
            return None

    async def _save_watermark(self, condition: CheckpointCondition) -> None:
        store = self.asset_state_store
        if store is None:
            return
        value: Any = {"after_checkpoint_id": condition.after_checkpoint_id,
                 "known_savepoints": list(condition.known_savepoints or ())}
        try:
            await store.aset(self.state_key, value)
        except Exception as exc:
            self.log.warning("could not persist the watermark (%s); keeping it in memory", exc)
            self.asset_state_store = None

    async def run(self) -> AsyncIterator[TriggerEvent]:
        hook = CheckpointStoreHook(self.storage_uri, self.conn_id)
        try:
            job = self.base_condition.job
            catalog = await asyncio.to_thread(lambda: CheckpointCatalog(hook.storage, job))
            condition = await self._load_watermark()
            if condition is None:
                condition = await asyncio.to_thread(take_baseline, catalog,
                                                    self.base_condition)
                await self._save_watermark(condition)
            self.log.info("watching %s in %s", describe(condition), self.storage_uri)
            while True:
                fresh: list[Manifest] = []
                try:
                    fresh = await asyncio.to_thread(new_snapshots, catalog, condition)
                except EndpointUnreachableError as exc:
                    self.log.warning("checkpoint storage unreachable, will retry: %s", exc)
                for manifest in fresh:
                    summary = summarize(catalog, manifest)
                    report_snapshot(summary)
                    yield TriggerEvent(summary)
                    condition = advance(condition, [manifest])
                    await self._save_watermark(condition)
                await asyncio.sleep(self.poll_interval)
        finally:
            # not awaited: a generator closed mid-wait must not await in its finally
            hook.close()
