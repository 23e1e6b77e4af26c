"""DriverSupervisionTrigger: watch one submission of a supervised job from the triggerer.

The deferrable :class:`~airflow_ckpt.operators.CheckpointedSparkSubmitOperator` submits
the driver detached and defers on this trigger; the worker slot is free while the job
streams. The trigger polls (in a worker thread: the storage client is synchronous, the
event loop never blocks) a :class:`~airflow_ckpt.supervision.SupervisionProbe`: the
job's lease heartbeat, its terminal history events, the detached launcher's exit file
(same host only) and the checkpoint-progress health rule. It fires one event, a
:meth:`~airflow_ckpt.supervision.Verdict.to_payload`, and the operator resumes to decide
(restart strategy) what next. Meanwhile it emits the job's checkpoint metrics for the
events it reads (:mod:`airflow_ckpt.metrics`).

Triggerer restarts: everything the trigger needs is in its kwargs and in storage. The
heartbeat judgement needs two looks on one clock, so a restarted trigger waits one full
``ttl_s + max_write_s`` before it calls a silent driver dead.

``on_kill`` (a user marks the deferred task failed / clears it): a stop request through
the control channel (graceful: stop-with-savepoint, a final savepoint), then, if no
terminal event arrives within ``stop_timeout_s``, SIGTERM and SIGKILL to the detached
driver's process group when it runs on this host, and the kill recorded. The triggerer
cancels ``on_kill`` after ``[triggerer] on_kill_timeout`` (30 s by default;
``asyncio.wait_for`` in ``TriggerRunner.run_trigger``), so the whole sequence is planned
within that bound (:func:`kill_plan`): the graceful wait gets what the kill and its record
leave, never more than ``stop_timeout_s``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

from airflow.sdk import conf
from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_ckpt.detached import LOCAL_PROCESSES, HostProcesses
from airflow_ckpt.guard import record_killed
from airflow_ckpt.hooks.checkpoint_store import CheckpointStoreHook
from airflow_ckpt.metrics import EventMetrics
from airflow_ckpt.supervision import HealthRule, SupervisionProbe, Verdict

T = TypeVar("T")


class TriggerRuntime:
    """What a supervision trigger runs on: the job's storage, the triggerer host's
    processes, a monotonic clock, and how it waits (blocking storage calls in a worker
    thread, sleeps on the event loop). The triggerer's by default; not serialized (a
    triggerer builds the trigger from its kwargs alone). The simulation passes its own:
    its storage, its drivers, virtual time, and calls that never leave the actor."""

    processes: HostProcesses = LOCAL_PROCESSES

    def store(self, storage_uri: str, conn_id: str | None) -> CheckpointStoreHook:
        return CheckpointStoreHook(storage_uri, conn_id=conn_id)

    def clock(self) -> float:
        return time.monotonic()

    async def call(self, fn: Callable[[], T]) -> T:
        """Run the blocking ``fn`` without blocking the event loop."""
        return await asyncio.to_thread(fn)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


#: of on_kill's bound: SIGTERM's grace before SIGKILL, and the kill's record
KILL_GRACE_S = 10.0
RECORD_KILL_S = 5.0


def on_kill_bound_s() -> float:
    """How long the triggerer lets ``on_kill`` run (``[triggerer] on_kill_timeout``)."""
    return float(conf.getint("triggerer", "on_kill_timeout", fallback=30))


def kill_plan(bound_s: float, stop_timeout_s: float) -> tuple[float, float]:
    """``(graceful wait, SIGTERM grace)`` for an ``on_kill`` the triggerer cancels after
    ``bound_s``: the kill and its record keep ``KILL_GRACE_S + RECORD_KILL_S`` (at most
    half the bound, shared in that ratio), the graceful stop gets the rest, at most
    ``stop_timeout_s``."""
    kill_share = min(KILL_GRACE_S + RECORD_KILL_S, bound_s / 2)
    grace = kill_share * KILL_GRACE_S / (KILL_GRACE_S + RECORD_KILL_S)
    return max(min(stop_timeout_s, bound_s - kill_share), 0.0), grace


class DriverSupervisionTrigger(BaseTrigger):
    """Fire once when a supervised submission ends, dies or stops making progress.

    :param storage_uri: the checkpoint storage root
    :param job: the job name
    :param run_id: the supervision run id (``<dag>/<run>/<task>[/<map>]``)
    :param submitted_key: history key of this submission's ``job_submitted`` event
    :param lease_epoch_before: newest lease epoch before the submission
    :param conn_id: the storage's ``aws`` connection
    :param driver_pid: the detached launcher's pid (its process group), if local
    :param driver_host: the host the detached launcher runs on
    :param exit_path: the launcher's exit-code file (readable on ``driver_host`` only)
    :param health: ``{"interval_s", "multiple", "restart"}`` or None (no health check)
    :param poll_interval: seconds between polls
    :param startup_timeout_s: how long the driver may take to hold its lease
    :param stop_timeout_s: on_kill: how long a graceful stop may take before the kill (cut
        to what ``[triggerer] on_kill_timeout`` leaves, see :func:`kill_plan`)
    :param attempt: the submission attempt (echoed in the event)
    :param driver_log: the detached driver's log file (echoed in the event)
    :param runtime: what it runs on (not serialized; see :class:`TriggerRuntime`)

    The event payload is :meth:`Verdict.to_payload` plus ``attempt``, ``driver_pid``,
    ``driver_host`` and ``driver_log``: the resumed task needs nothing else.
    """

    def __init__(
        self,
        *,
        storage_uri: str,
        job: str,
        run_id: str,
        submitted_key: str,
        lease_epoch_before: int,
        conn_id: str | None = None,
        driver_pid: int | None = None,
        driver_host: str | None = None,
        exit_path: str | None = None,
        health: dict[str, Any] | None = None,
        poll_interval: float = 5.0,
        startup_timeout_s: float = 300.0,
        stop_timeout_s: float = 120.0,
        attempt: int | None = None,
        driver_log: str | None = None,
        runtime: TriggerRuntime | None = None,
    ) -> None:
        super().__init__()
        self.runtime = runtime or TriggerRuntime()
        self.storage_uri = storage_uri
        self.job = job
        self.run_id = run_id
        self.submitted_key = submitted_key
        self.lease_epoch_before = int(lease_epoch_before)
        self.conn_id = conn_id
        self.driver_pid = driver_pid
        self.driver_host = driver_host
        self.exit_path = exit_path
        self.health = dict(health) if health else None
        self.poll_interval = float(poll_interval)
        self.startup_timeout_s = float(startup_timeout_s)
        self.stop_timeout_s = float(stop_timeout_s)
        self.attempt = attempt
        self.driver_log = driver_log

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return f"{type(self).__module__}.{type(self).__qualname__}", {
            "storage_uri": self.storage_uri,
            "job": self.job,
            "run_id": self.run_id,
            "submitted_key": self.submitted_key,
            "lease_epoch_before": self.lease_epoch_before,
            "conn_id": self.conn_id,
            "driver_pid": self.driver_pid,
            "driver_host": self.driver_host,
            "exit_path": self.exit_path,
            "health": self.health,
            "poll_interval": self.poll_interval,
            "startup_timeout_s": self.startup_timeout_s,
            "stop_timeout_s": self.stop_timeout_s,
            "attempt": self.attempt,
            "driver_log": self.driver_log,
        }

    def _local(self) -> bool:
        return self.driver_host is not None \
            and self.driver_host == self.runtime.processes.hostname()

    def _exit_code(self) -> int | None:
        return self.runtime.processes.exit_code(self.exit_path) if self._local() else None

    def _exit_pending(self) -> bool:
        """The detached launcher (on this host) lives: it will write the exit code."""
        return self._local() and self.driver_pid is not None \
            and self.runtime.processes.alive(int(self.driver_pid))

    def _probe(self, hook: CheckpointStoreHook) -> SupervisionProbe:
        health = None
        if self.health:
            health = HealthRule(float(self.health["interval_s"]),
                                float(self.health.get("multiple", 3.0)),
                                bool(self.health.get("restart", False)))
        history = hook.history(self.job)
        return SupervisionProbe(
            history, self.run_id, submitted_key=self.submitted_key,
            lease_epoch_before=self.lease_epoch_before, exit_code=self._exit_code,
            exit_pending=self._exit_pending,
            health=health, catalog=hook.catalog(self.job) if health else None,
            startup_timeout_s=self.startup_timeout_s, clock=self.runtime.clock,
            metrics=EventMetrics.start(history),
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        runtime = self.runtime
        hook = runtime.store(self.storage_uri, self.conn_id)
        try:
            probe = await runtime.call(lambda: self._probe(hook))
            self.log.info("supervising job %s (run %s) from %s", self.job, self.run_id,
                          self.submitted_key)
            while True:
                try:
                    verdict = await runtime.call(probe.poll)
                except Exception as exc:  # storage hiccup: keep watching
                    self.log.warning("supervision poll failed, will retry: %s", exc)
                    verdict = None
                if verdict is not None and verdict.kind == "stale" and not (
                    self.health and self.health.get("restart")
                ):
                    self.log.warning("job %s: %s", self.job, verdict.cause)
                    verdict = None  # reported only
                if verdict is not None:
                    self.log.info("job %s: %s (%s)", self.job, verdict.kind, verdict.cause)
                    yield TriggerEvent({**verdict.to_payload(), **self._submission()})
                    return
                await runtime.sleep(self.poll_interval)
        finally:
            hook.close()

    def _submission(self) -> dict[str, Any]:
        """Which submission the event is about (the resumed task needs nothing else)."""
        return {"attempt": self.attempt, "driver_pid": self.driver_pid,
                "driver_host": self.driver_host, "driver_log": self.driver_log}

    async def on_kill(self) -> None:
        """Stop the job within the triggerer's bound: a graceful stop request first, the
        kill (SIGTERM, SIGKILL after a grace) and its ``job_stopped`` record after the
        planned wait (:func:`kill_plan`). Nothing blocks the event loop."""
        runtime = self.runtime
        bound = on_kill_bound_s()
        graceful, grace = kill_plan(bound, self.stop_timeout_s)
        hook = runtime.store(self.storage_uri, self.conn_id)
        try:
            try:
                if await asyncio.wait_for(self._stop_gracefully(hook, graceful), graceful):
                    return
            # a storage call outlasted the wait: kill all the same (asyncio.TimeoutError is
            # not the built-in TimeoutError before Python 3.11)
            except (TimeoutError, asyncio.TimeoutError):
                pass
            self.log.warning("job %s did not stop within %.0f s (of on_kill's %.0f s): "
                             "killing the driver", self.job, graceful, bound)
            pid = self.driver_pid if self._local() else None
            await runtime.call(lambda: runtime.processes.kill(pid, grace))
            await runtime.call(lambda: record_killed(
                hook.history(self.job), self.run_id, attempt=self.attempt or 0,
                by=f"on_kill, after the stop request went unanswered for {graceful:g} s",
                log=self.log))
        finally:
            hook.close()

    async def _stop_gracefully(self, hook: CheckpointStoreHook, wait_s: float) -> bool:
        """Request stop-with-savepoint; True once the job's terminal event is read."""
        runtime = self.runtime
        deadline = runtime.clock() + wait_s
        await runtime.call(
            lambda: hook.control(self.job).request_savepoint(
                stop=True, timeout_s=wait_s, requested_by=f"airflow on_kill {self.run_id}"))
        probe = await runtime.call(lambda: self._probe(hook))
        while runtime.clock() < deadline:
            verdict = await runtime.call(probe.poll)
            if verdict is not None and verdict.kind != "stale":
                return True
            await runtime.sleep(min(self.poll_interval, 2.0))
        return False


def verdict_of(event: dict[str, Any]) -> Verdict:
    """The typed verdict of a trigger event payload."""
    return Verdict.from_payload(event)
