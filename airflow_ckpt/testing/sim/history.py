"""The history world of the simulation: one supervised run of one job, the *real*
Airflow supervision over a history that drivers, compactors and late writes share.

Actors (:mod:`airflow_ckpt.testing.sim.scheduler`) over the simulated storage
(:mod:`airflow_ckpt.testing.sim.storage`), on hosts whose clocks disagree:

* **Airflow** (hosts ``airflow``, the worker, and ``triggerer``): the real
  :class:`~airflow_ckpt.operators.CheckpointedSparkSubmitOperator` (a subclass that opens
  the simulated storage and submits simulated drivers, :class:`SimOperator`), so the real
  :class:`~airflow_ckpt.operators.supervisor.Supervisor` decides everything. **Blocking**:
  one task try runs ``execute`` (``run_blocking``: submit, wait for the exit code, decide,
  wait the delay on virtual time, resubmit). **Deferred**: ``execute`` raises
  ``TaskDeferred``; the real :class:`~airflow_ckpt.triggers.supervision.DriverSupervisionTrigger`,
  rebuilt from its serialized kwargs as a triggerer does, runs its ``run`` loop as an actor
  on the triggerer host (its :class:`~airflow_ckpt.triggers.supervision.TriggerRuntime`
  is the simulation's: storage, drivers, virtual time); its event resumes a *new* operator
  in ``execute_complete``, a restart delay (``TimeDeltaTrigger``) resumes one in
  ``resubmit``. Each task try is a process that may die at any step (a worker restart:
  Airflow retries the task, which runs ``execute`` again: ``reattach`` or the next
  attempt); each trigger may die (a triggerer restart: a fresh trigger from the same
  kwargs, which waits a full lease expiry again). The trigger reads the driver's exit
  code only when the driver runs on its host.
* **the driver** (host ``driver``), spawned by each submission: takes the
  :class:`~airflow_ckpt.runtime.lease.holder.JobLease` (heartbeats driven explicitly),
  appends ``job_started``, ``restored``, ``checkpoint_completed``, query-level failures
  through its :class:`~airflow_ckpt.runtime.history.restart_log.RestartLog`
  (``job_failed`` when its strategy declines) and ends with ``job_finished`` /
  ``job_stopped``, an exit without terminal event, or a crash at any step. Its writes
  may time out and land later, get 503s or lose their answers. It compacts its own
  history, and so may 0-2 other processes on a third host.
* **point pauses** (site ``scheduler.point-pause``, :data:`POINT_PAUSES`): any of these
  processes may stop exactly at one of the history's named interleaving points, between
  a guard and the write it guards, so two deciders, a stale writer and a compaction, or
  two compactions meet in that window.

Invariants, checked after every step (:class:`World`), against the history storage holds:

* ``event-lost``: every event whose ``append`` or ``append_if_head`` returned (restart
  decisions included) is read back by :meth:`JobHistory.events` with the same type,
  timestamp and payload; ``event-duplicated``: no append is counted at two numbers
  (two events of the history carry one ``uid``: an append that judged its counted
  create void and appended it again); ``history-rewritten``: no history key is deleted and created
  again with other bytes, but for a *void* write at or below the sealed mark;
* ``restart-decision``: every ``restart`` event of the run, query or driver level, first
  included, equals Flink's decision (:mod:`airflow_ckpt.testing.sim.flink`) over the
  run's ``restart`` events before it (history order) and its own failure time;
* ``own-checkpoint``: a resubmission restores ``latest`` once the run completed a
  checkpoint of its own before the failure that led to it; ``foreign-state``: the first
  submission restores what the operator asked, a later one ``latest`` only when the
  operator asked for it or the run had a checkpoint of its own when it was submitted;
* ``terminal-resubmitted``: no resubmission follows a decision taken on top of a
  terminal event (finished, stopped, failed) of the submission before it (the seed-100948
  shape); ``terminal-restarted``: a trigger never declares dead a driver whose terminal
  event was acknowledged before;
* ``supervisor-error``: no task try and no trigger dies of an unexpected error (the
  strategy declining is ``CheckpointedJobFailedError``, the task's normal failure).

Planted defects (:data:`PLANTS`, ``--plant``) are faults of a storage *view* the
simulation must find whatever the history layer looks like.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
from collections import Counter
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from airflow.sdk.exceptions import TaskDeferred
from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_ckpt.detached import DetachedDriver, HostProcesses, exit_path_of
from airflow_ckpt.errors import AirflowCkptError
from airflow_ckpt.hooks.checkpoint_store import CheckpointStoreHook
from airflow_ckpt.operators.checkpointed_spark_submit import CheckpointedSparkSubmitOperator
from airflow_ckpt.operators.supervisor import CheckpointedJobFailedError, Supervisor
from airflow_ckpt.runtime.checkpoint.catalog import CheckpointCatalog
from airflow_ckpt.runtime.history.events import (
    CHECKPOINT_COMPLETED,
    JOB_FAILED,
    JOB_FINISHED,
    JOB_STARTED,
    JOB_STOPPED,
    JOB_SUBMITTED,
    RESTART,
    RESTORED,
    HistoryEvent,
)
from airflow_ckpt.runtime.history.journal import CompactionPolicy, JobHistory
from airflow_ckpt.runtime.history.reader import EventCache, HistoryReader
from airflow_ckpt.runtime.history.restart_log import RestartLog
from airflow_ckpt.runtime.interleave import (
    HISTORY_BEFORE_CREATE,
    HISTORY_BEFORE_SEAL_CHECK,
    HISTORY_BEFORE_SEGMENT_READ,
    HISTORY_COMPACTION_BEFORE_READ,
    RESTART_BEFORE_DECISION,
    installed,
)
from airflow_ckpt.runtime.lease.holder import JobLease
from airflow_ckpt.runtime.storage.base import CheckpointStorage
from airflow_ckpt.supervision import RESTORE_LATEST, RESTORE_NONE, DriverFailure, Verdict
from airflow_ckpt.testing.sim.buggify import (
    SCHED_CLOCK_JUMP,
    SCHED_CRASH,
    SCHED_PAUSE,
    SCHED_POINT_PAUSE,
    STORAGE_503,
    STORAGE_HANG,
    STORAGE_LATE,
    STORAGE_LOST_ANSWER,
)
from airflow_ckpt.testing.sim.flink import (
    ExponentialDelay,
    FailureRate,
    FixedDelay,
    Strategy,
    expected_decisions,
)
from airflow_ckpt.testing.sim.outcome import Coverage, Judged, Outcome, Violation
from airflow_ckpt.testing.sim.scheduler import Actor, Crash, Host, Scheduler
from airflow_ckpt.testing.sim.storage import Faults, Hidden, SimObjects, SimStorage, Stored
from airflow_ckpt.triggers.supervision import DriverSupervisionTrigger, TriggerRuntime

JOB = "simjob"
STORAGE_URI = "s3://bucket/root"
DAG, DAG_RUN, TASK = "dag", "run-2", "task"
RUN_ID = f"{DAG}/{DAG_RUN}/{TASK}"  # supervision_id of the task
OLD_RUN_ID = "dag/run-1/task"
SAVEPOINT = f"{STORAGE_URI}/{JOB}/savepoints/sp-old"
TERMINAL = frozenset({JOB_FINISHED, JOB_STOPPED, JOB_FAILED})
SEGMENTS = "/history/segments/"
WORKER, TRIGGERER = "airflow", "triggerer"
_TASK_LOG = logging.getLogger("airflow_ckpt.testing.sim.task")

#: invariant names (see the module doc)
EVENT_LOST = "event-lost"
EVENT_DUPLICATED = "event-duplicated"
RESTART_DECISION = "restart-decision"
OWN_CHECKPOINT = "own-checkpoint"
FOREIGN_STATE = "foreign-state"
TERMINAL_RESUBMITTED = "terminal-resubmitted"
TERMINAL_RESTARTED = "terminal-restarted"
HISTORY_REWRITTEN = "history-rewritten"
SUPERVISOR_ERROR = "supervisor-error"
INVARIANTS = (EVENT_LOST, EVENT_DUPLICATED, HISTORY_REWRITTEN, RESTART_DECISION, OWN_CHECKPOINT,
              FOREIGN_STATE, TERMINAL_RESUBMITTED, TERMINAL_RESTARTED, SUPERVISOR_ERROR)

#: Planted defects: faults of a *reader's or writer's view of storage*, so they keep
#: working whatever the history layer looks like; the simulation must find each.
#: the supervisor's listings miss its own writes (as a key cursor ahead of them: item 3)
PLANT_HIDE_OWN = "hide-own-writes"
#: the supervisor's listings miss compacted segments (item 4)
PLANT_HIDE_SEGMENTS = "hide-segments"
#: a compactor's segment writes are acknowledged and lost (item 5)
PLANT_LOSE_SEGMENTS = "lose-segments"
PLANTS = (PLANT_HIDE_OWN, PLANT_HIDE_SEGMENTS, PLANT_LOSE_SEGMENTS)

#: Airflow task retries after a worker death (the operator's ``retries``)
TASK_RETRIES = 3
#: drivers after which the task's ``execution_timeout`` ends it (a bound, not a
#: verdict: failure-rate restarts failures spaced beyond its interval for ever)
MAX_DRIVERS = 10
#: triggerer restarts per run beyond which triggers no longer die
MAX_TRIGGERER_RESTARTS = 4
#: the operator's deferred settings
POLL_INTERVAL_S, STARTUP_TIMEOUT_S = 5.0, 120.0

STRATEGIES: tuple[Strategy, ...] = (
    FixedDelay(attempts=3, delay_ms=1000),
    FailureRate(max_failures=2, interval_ms=120_000, delay_ms=1000),
    ExponentialDelay(initial_ms=1000, max_ms=8000, multiplier=2.0, reset_ms=600_000,
                     attempts=4),
)
SKEWS = (0.0, 0.5, -0.5, 30.0, 3600.0, -3600.0)
#: the history world's fault sites (sim/buggify.py): no actor-count sites, the
#: supervisor starts one driver per submission
SITES = (STORAGE_503, STORAGE_LOST_ANSWER, STORAGE_LATE, STORAGE_HANG, SCHED_PAUSE,
         SCHED_CRASH, SCHED_CLOCK_JUMP, SCHED_POINT_PAUSE)
#: base chance per turn of a host's clock stepping (when the seed enables it)
CLOCK_JUMP_P = 0.002
#: how long a driver's stop-the-world pause lasts (up to past its lease's expiry)
PAUSE_S = (1.0, 60.0)
#: The runtime's named interleaving points where a process of this world may pause
#: (site ``scheduler.point-pause``), with the base chance per arrival. Each is the
#: window between a guard and the write it guards: a decision and its
#: ``append_if_head``, a chosen number and its create, a create and the sealed mark read
#: after it, a listed segment and its read, a compaction's listing and its raw reads (a
#: void write landing in between is dropped by its second look at the mark). Half the
#: pauses stop the whole process (stop-the-world, for :data:`PROCESS_PAUSE_S`: up to
#: past its lease's expiry and the supervisor's verdict, so the supervisor decides,
#: resubmits, a new driver appends and compactions seal, all beside it), half its
#: thread only (:data:`THREAD_PAUSE_S`: another process's compaction or append runs
#: meanwhile).
POINT_PAUSES: dict[str, float] = {
    RESTART_BEFORE_DECISION: 0.3,
    HISTORY_BEFORE_CREATE: 0.03,
    HISTORY_BEFORE_SEAL_CHECK: 0.2,
    HISTORY_BEFORE_SEGMENT_READ: 0.5,
    HISTORY_COMPACTION_BEFORE_READ: 0.2,
}
PROCESS_PAUSE_S = (1.0, 120.0)
THREAD_PAUSE_S = (0.2, 5.0)


@dataclass(frozen=True, slots=True)
class Setup:
    """One seed's system: strategy, clocks, modes, faults (drawn from the seed; each
    kind of contention is switched on or off per seed, as swarm testing does)."""

    strategy: Strategy
    driver_skew_s: float
    worker_skew_s: float
    triggerer_skew_s: float
    compactor_skew_s: float
    blocking: bool  # blocking supervisor or deferred (everything rebuilt at each resume)
    first_restore: str
    driver_local: bool  # the driver runs on the triggerer's host: it reads the exit code
    segment_events: int
    compactors: int  # compacting processes besides the driver (the UI, the CLI, ...)
    driver_faults: Faults
    driver_crash_p: float
    driver_pause_p: float
    worker_crash_p: float  # per turn of a task try: a worker restart (task retry)
    triggerer_crash_p: float  # per turn of a trigger: a triggerer restart
    terminal_late_p: float  # the driver's terminal event lands late (the seed-100948 shape)
    plants: frozenset[str] = frozenset()

    @classmethod
    def draw(cls, rng: random.Random, plants: Iterable[str] = ()) -> Setup:
        return cls(
            strategy=rng.choice(STRATEGIES),
            driver_skew_s=rng.choice(SKEWS),
            worker_skew_s=rng.choice(SKEWS),
            triggerer_skew_s=rng.choice(SKEWS),
            compactor_skew_s=rng.choice(SKEWS),
            blocking=rng.random() < 0.4,
            first_restore=rng.choice((RESTORE_LATEST, RESTORE_NONE, SAVEPOINT)),
            driver_local=rng.random() < 0.5,
            segment_events=rng.choice((2, 3, 4, 1000)),
            compactors=rng.choice((0, 1, 2)),
            driver_faults=rng.choice((Faults(), Faults(0.01, 0.02, 0.01),
                                      Faults(0.02, 0.05, 0.02), Faults(0.02, 0.1, 0.02))),
            driver_crash_p=rng.choice((0.0, 0.005, 0.02)),
            driver_pause_p=rng.choice((0.0, 0.005, 0.02)),
            worker_crash_p=rng.choice((0.0, 0.01, 0.04)),
            triggerer_crash_p=rng.choice((0.0, 0.02, 0.08)),
            terminal_late_p=rng.choice((0.0, 0.3)),
            plants=frozenset(plants),
        )

    @property
    def skewed(self) -> bool:
        """Whether any two hosts' clocks disagree."""
        return len({self.driver_skew_s, self.worker_skew_s, self.triggerer_skew_s,
                    self.compactor_skew_s}) > 1

    def describe(self) -> str:
        return (f"strategy {self.strategy}, clocks driver {self.driver_skew_s:+g} s, "
                f"worker {self.worker_skew_s:+g} s, triggerer {self.triggerer_skew_s:+g} s, "
                f"compactor {self.compactor_skew_s:+g} s, "
                f"{'blocking' if self.blocking else 'deferred'} supervisor, "
                f"restore {self.first_restore}, driver "
                f"{'on the triggerer host' if self.driver_local else 'remote'}, segments of "
                f"{self.segment_events}, {self.compactors} compactor(s) besides the driver, "
                f"driver faults {self.driver_faults}, pause p driver {self.driver_pause_p}, "
                f"crash p driver {self.driver_crash_p} "
                f"worker {self.worker_crash_p} triggerer {self.triggerer_crash_p}, terminal event "
                f"late p {self.terminal_late_p}"
                + (f", planted {sorted(self.plants)}" if self.plants else ""))


class _ManualLease(JobLease):
    """The real lease without its heartbeat thread: the driver actor beats explicitly."""

    def _start_heartbeat(self) -> None:
        return None


def _content(event: HistoryEvent) -> str:
    """An event's type, timestamp and payload as storage holds them (JSON)."""
    return json.dumps({"type": event.type, "ts": event.ts, "data": event.data},
                      sort_keys=True, default=str)


class TrackedHistory(JobHistory):
    """A job history that tells the world which appends returned (durable by contract)
    and what they wrote."""

    def __init__(self, storage: SimStorage, world: World, **kwargs: Any) -> None:
        super().__init__(storage, JOB, **kwargs)
        self.world = world

    def append(self, event_type: str, **data: Any) -> HistoryEvent:
        return self.world.acknowledged(super().append(event_type, **data))

    def append_if_head(self, head: int, event_type: str, **data: Any) -> HistoryEvent:
        return self.world.acknowledged(super().append_if_head(head, event_type, **data))


class SimStore(CheckpointStoreHook):
    """The checkpoint store hook over one simulated storage view, with the world's
    tracked histories (clocks and ids of the simulation)."""

    def __init__(self, world: World, storage: SimStorage) -> None:
        super().__init__(STORAGE_URI, conn_id=None)
        self.world = world
        self.sim_storage = storage

    @cached_property
    def storage(self) -> CheckpointStorage:
        return self.sim_storage

    def history(self, job: str) -> JobHistory:
        return self.world.history(self.sim_storage)


class SimProcesses(HostProcesses):
    """The simulated drivers as host ``name`` sees them: exit codes are readable (and
    logs empty) only for drivers on that host."""

    def __init__(self, world: World, name: str) -> None:
        self.world = world
        self.name = name

    def hostname(self) -> str:
        return self.name

    def exit_code(self, exit_path: str | None) -> int | None:
        return self.world.exit_code(exit_path or "")

    def alive(self, pid: int) -> bool:
        driver = self.world.drivers.get(pid)
        return driver is not None and driver.alive

    def kill(self, pid: int | None, grace_s: float = 10.0) -> None:
        driver = self.world.drivers.get(pid or -1)
        if driver is not None and driver.alive:
            driver.killed = True  # it dies at its next step
            self.world.scheduler.log(f"kill driver pid {pid}")

    def log_tail(self, path: str | None) -> list[str]:
        return []


class SimTriggerRuntime(TriggerRuntime):
    """The triggerer of the simulation: its storage view, drivers, virtual time; calls
    run in the trigger's actor (they never suspend, so the trigger's coroutine runs
    to its event without an event loop)."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.processes = SimProcesses(world, world.triggerer_name)

    def store(self, storage_uri: str, conn_id: str | None) -> CheckpointStoreHook:
        return SimStore(self.world, self.world.probe_storage)

    def clock(self) -> float:
        return self.world.scheduler.monotonic()

    async def call(self, fn: Callable[[], Any]) -> Any:
        return fn()

    async def sleep(self, seconds: float) -> None:
        self.world.scheduler.sleep(seconds)


class VirtualKillSwitch:
    """A task's ``on_kill`` switch whose waits pass on virtual time (never set: the
    simulation does not kill tasks)."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler

    def set(self) -> None:
        raise NotImplementedError("the simulation kills no task")

    def is_set(self) -> bool:
        return False

    def wait(self, timeout: float | None = None) -> bool:
        self.scheduler.sleep(timeout or 0.0)
        return False


class SimSubmitter:
    """One attempt's submission: spawns the simulated driver (the detached launcher's
    pid and exit file are the world's)."""

    master = "sim"
    deploy_mode = "client"

    def __init__(self, world: World, attempt: int, restore: str) -> None:
        self.world, self.attempt, self.restore = world, attempt, restore

    def submit_detached(self, application: str, log_path: Any) -> DetachedDriver:
        pid, exit_path = self.world.submit(self.attempt, self.restore, str(log_path))
        return DetachedDriver(pid, str(log_path), exit_path)


class SimDelay(BaseTrigger):
    """A restart delay on virtual time (the operator's ``TimeDeltaTrigger`` reads the
    real clock)."""

    def __init__(self, delay_s: float) -> None:
        super().__init__()
        self.delay_s = delay_s

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return f"{type(self).__module__}.{type(self).__qualname__}", {"delay_s": self.delay_s}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        raise NotImplementedError("the simulation's scheduler waits the delay")
        yield  # an async generator, as triggers are


class QuietTrigger(DriverSupervisionTrigger):
    """The real supervision trigger, logging to the stdlib (``logging.disable``
    silences it)."""

    @property
    def log(self) -> logging.Logger:  # type: ignore[override]
        return _TASK_LOG


class SimOperator(CheckpointedSparkSubmitOperator):
    """The real operator over the simulated storage; it submits simulated drivers.

    Everything between (the :class:`Supervisor`, its restart log, the trigger it defers
    on, ``execute_complete`` and ``resubmit``) is the real code."""

    def __init__(self, *, world: World, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.world = world
        self._killed = VirtualKillSwitch(world.scheduler)
        self._processes = SimProcesses(world, WORKER)

    @property
    def log(self) -> logging.Logger:  # type: ignore[override]
        return _TASK_LOG  # the stdlib logger: ``logging.disable`` silences it

    def _delay_trigger(self, delay_s: float) -> BaseTrigger:
        return SimDelay(delay_s)

    def _store(self, args: Any) -> CheckpointStoreHook:
        return SimStore(self.world, self.world.supervisor_storage)

    def _check_restore_target(self, catalog: CheckpointCatalog, restore: str) -> str:
        return restore  # the simulated savepoint is a name, not a stored savepoint

    def _prepare(self, sup: Supervisor, attempt: int, restore: str) -> Any:
        return SimSubmitter(self.world, attempt, restore)

    def _submit_blocking(self, context: Any, sup: Supervisor, attempt: int,
                         restore: str) -> DriverFailure | None:
        """spark-submit in client mode: record the submission, run the driver, wait.
        Past :data:`MAX_DRIVERS` the task's ``execution_timeout`` kills it (its process
        dies, as a worker's; the scheduler's loop then ends the run)."""
        if len(self.world.drivers) >= MAX_DRIVERS:
            raise Crash("execution_timeout: the task ran too long")
        sup.record_submit(SimSubmitter(self.world, attempt, restore), attempt, restore,
                          **self._submit_fields(context))
        log = f"/sim/blocking-{attempt}.log"
        _, exit_path = self.world.submit(attempt, restore, log)
        while (code := self.world.exit_code(exit_path)) is None:
            self.world.scheduler.sleep(1.0)
        return None if code == 0 else DriverFailure.of_output(attempt, code, [])


class World(Judged):
    """The simulated system of one seed: actors, storage, ground truth and invariants."""

    def __init__(self, seed: int, plants: Iterable[str] = (), max_steps: int = 30000) -> None:
        self.scheduler = Scheduler(seed, max_steps=max_steps, sites=SITES,
                                   clock_jump_p=CLOCK_JUMP_P)
        self.rng = self.scheduler.rng
        self.setup = Setup.draw(self.rng, plants)
        self.objects = SimObjects()
        base = self.base = SimStorage(self.objects, self.scheduler, tag="oracle", oracle=True)
        plants = self.setup.plants
        # the driver's terminal event: held up to 30 s when it lands late
        self.terminal_storage = base.view(
            Faults(late=self.setup.terminal_late_p, hold_s=30.0), "driver")
        self.compactor_storage = base.view(
            Faults(unavailable=0.02, late=0.02), "compactor",
            dropped=SEGMENTS if PLANT_LOSE_SEGMENTS in plants else None)
        self.supervisor_storage = base.view(Faults(), "supervisor", hidden=_hidden(plants))
        self.probe_storage = base.view(Faults(unavailable=0.05), "probe",
                                       hidden=_hidden(plants))
        self.oracle = HistoryReader(base, JOB, cache=EventCache())
        setup = self.setup
        self.triggerer_name = WORKER if setup.driver_local else TRIGGERER
        self.hosts = {
            "driver": Host(WORKER if setup.driver_local else "driver", setup.driver_skew_s),
            WORKER: Host(WORKER, setup.worker_skew_s),
            TRIGGERER: Host(TRIGGERER, setup.triggerer_skew_s),
            "other": Host("other", setup.compactor_skew_s),
        }
        self.policy = CompactionPolicy(every=0, segment_events=setup.segment_events,
                                       retain_checkpoint_events=None)
        self.appended: dict[str, str] = {}  # key -> content of every append that returned
        self.exit_codes: dict[str, int] = {}  # exit file -> the driver's exit code
        self.drivers: dict[int, Actor] = {}  # pid -> the driver's process
        self.exit_paths: dict[str, Actor] = {}  # exit file -> the driver's process
        self.coverage: Counter[str] = Counter()
        self.violations: list[Violation] = []
        self.checkpoint_id = 0
        self.triggerer_restarts = 0
        self._truth_version = -1
        self._truth: list[HistoryEvent] = []
        self._changed_seen = 0
        self._judged_version = -1
        self.scheduler.observers.append(self.check)

    # ------------------------------------------------------------------ ground truth

    def truth(self) -> list[HistoryEvent]:
        """Every event storage holds (the public reader over a faultless view), in
        history order. The reader's cache is dropped whenever an object got other bytes
        (the ``history-rewritten`` invariant reports that)."""
        if self.objects.version != self._truth_version:
            if self.objects.changed != self._changed_seen:  # its cache trusts names
                self._changed_seen = self.objects.changed
                self.oracle = HistoryReader(self.oracle.storage, JOB, cache=EventCache())
            self._truth = sorted(self.oracle.events(), key=lambda e: e.seq)
            self._truth_version = self.objects.version
        return self._truth

    def acknowledged(self, event: HistoryEvent) -> HistoryEvent:
        """An append returned: ``event`` is durable by contract."""
        self.appended[event.key] = _content(event)
        self.scheduler.log(f"appended {event.type} {event.key.rsplit('/', 1)[-1]}")
        return event

    # ------------------------------------------------------------------ invariants

    def check(self) -> None:
        """Every invariant over what storage holds now (after every step)."""
        if self.objects.version == self._judged_version:
            return
        self._judged_version = self.objects.version
        self.check_events()
        run = self.run_events()
        self.check_decisions(run)
        self.check_submissions(run)

    def check_events(self) -> None:
        """``event-lost`` (by content), ``event-duplicated`` and ``history-rewritten``."""
        rewritten = sorted(k for k in self.objects.rewritten if "/history/" in k)
        if rewritten:
            self.violate(HISTORY_REWRITTEN, "deleted, then written again with other content "
                         "(a reader that caches it by name misses events): "
                         + ", ".join(k.rsplit("/", 1)[-1] for k in rewritten))
        held = {e.key: _content(e) for e in self.truth()}
        lost = [k for k in self.appended if k not in held]
        if lost:
            self.violate(EVENT_LOST, "appended and acknowledged, no longer in the history: "
                         + ", ".join(f"{k.rsplit('/', 1)[-1]} {self.appended[k][:80]}"
                                     for k in lost))
        uids = Counter(str(e.data.get("uid")) for e in self.truth())
        twice = sorted(e.key.rsplit("/", 1)[-1] for e in self.truth()
                       if uids[str(e.data.get("uid"))] > 1)
        if twice:
            self.violate(EVENT_DUPLICATED, "one append counted at two numbers (a reader "
                         "sees the event twice): " + ", ".join(twice))
        changed = [k for k, content in self.appended.items()
                   if k in held and held[k] != content]
        if changed:
            key = changed[0]
            self.violate(EVENT_LOST, f"acknowledged {self.appended[key]}, read back "
                         f"{held[key]} ({key.rsplit('/', 1)[-1]})")

    def run_events(self) -> list[HistoryEvent]:
        """The current supervision's events, in history order (from its newest first
        submission: a task that starts the run again starts a new supervision)."""
        events = [e for e in self.truth() if e.data.get("run_id") == RUN_ID]
        firsts = [i for i, e in enumerate(events) if e.type == JOB_SUBMITTED
                  and int(e.data.get("attempt") or 0) <= 1]
        return events[firsts[-1]:] if firsts else []

    def check_decisions(self, run: list[HistoryEvent]) -> None:
        """``restart-decision``: each of the run's decisions is Flink's over the failures
        decided before it, in history order (every decision, the first included)."""
        restarts = [e for e in run if e.type == RESTART]
        if not restarts:
            return
        expected = expected_decisions(self.setup.strategy,
                                      [float(e.data["failure_ts"]) for e in restarts])
        for n, (event, want) in enumerate(zip(restarts, expected, strict=True), start=1):
            got = (bool(event.data["restart"]), int(event.data["attempt"]),
                   round(float(event.data["delay_s"]) * 1000))
            if got != want:
                self.violate(RESTART_DECISION, f"decision {n} ({event.data.get('level')} "
                             f"level, {event.key.rsplit('/', 1)[-1]}): (restart, attempt, "
                             f"delay ms) = {got}, Flink's over the {n - 1} before it = {want}")
                return

    def check_submissions(self, run: list[HistoryEvent]) -> None:
        """``foreign-state`` / ``own-checkpoint`` for every submission, and
        ``terminal-resubmitted``."""
        first = self.setup.first_restore
        all_events = self.truth()
        submits = [e for e in run if e.type == JOB_SUBMITTED]
        if not submits:
            return
        floor = submits[0].seq

        def own_before(seq: int) -> bool:
            return any(e.type == CHECKPOINT_COMPLETED and floor < e.seq < seq
                       for e in all_events)

        previous: HistoryEvent | None = None
        for submit in submits:
            attempt, restore = int(submit.data["attempt"]), str(submit.data["restore"])
            tag = f"attempt {attempt} ({submit.key.rsplit('/', 1)[-1]})"
            if attempt <= 1 and restore != first:
                self.violate(FOREIGN_STATE, f"{tag} restores {restore}, the operator asked "
                             f"for {first}")
            if attempt > 1 and restore == RESTORE_LATEST and first != RESTORE_LATEST \
                    and not own_before(submit.seq):
                self.violate(FOREIGN_STATE, f"{tag} resubmitted with restore=latest before "
                             "the run had a checkpoint of its own (another run's state)")
            if previous is not None:
                between = [e for e in run if previous.seq < e.seq < submit.seq]
                decisions = [e for e in between if e.type == RESTART
                             and e.data.get("level") == "driver"]
                if decisions and attempt > 1:
                    decided = decisions[-1].seq
                    if restore != RESTORE_LATEST and own_before(decisions[0].seq):
                        self.violate(OWN_CHECKPOINT, f"{tag} resubmitted with restore="
                                     f"{restore} although the run completed a checkpoint of "
                                     "its own before the failure (it goes back in time)")
                    ended = [e for e in between if e.type in TERMINAL and e.seq < decided]
                    if ended:
                        self.violate(TERMINAL_RESUBMITTED, f"{tag} resubmitted after the "
                                     f"run's {ended[0].type} "
                                     f"{ended[0].key.rsplit('/', 1)[-1]} (the decision "
                                     "was taken on top of it)")
            previous = submit

    def check_verdict(self, submitted_key: str, verdict: Verdict) -> None:
        """``terminal-restarted``: a driver whose terminal event was acknowledged before
        the verdict is never declared dead."""
        if not verdict.needs_restart_decision:
            return
        floor = HistoryEvent(JOB_SUBMITTED, 0.0, submitted_key, {}).seq
        terminal = next((e for e in self.truth() if e.type in TERMINAL and e.seq > floor
                         and e.data.get("run_id") == RUN_ID and e.key in self.appended),
                        None)
        if terminal is not None:
            self.violate(TERMINAL_RESTARTED, f"the driver was declared dead "
                         f"({verdict.cause}) after its {terminal.type} "
                         f"{terminal.key.rsplit('/', 1)[-1]}")

    # ------------------------------------------------------------------ actors

    def history(self, storage: SimStorage) -> TrackedHistory:
        """A process's job history: compacting only when an actor calls ``compact`` (the
        policy's ``every=0``), with the cache of its own writes a real one has."""
        return TrackedHistory(storage, self, compaction=self.policy,
                              clock=self.scheduler.wall_clock, ids=self.scheduler.uuid4)

    def seed_old_run(self) -> None:
        """An earlier, finished run of the job: its checkpoint is not this run's."""
        history = self.history(self.supervisor_storage)
        start = self.scheduler.now
        self.scheduler.now = start - 7200
        history.append(JOB_SUBMITTED, run_id=OLD_RUN_ID, attempt=1, restore=RESTORE_NONE)
        lease = _ManualLease(self.base.view(Faults(), "old-driver"), JOB, owner=OLD_RUN_ID,
                             clock=self.scheduler.monotonic,
                             wall_clock=self.scheduler.wall_clock, sleep=self.scheduler.sleep)
        lease.acquire()
        history.append(JOB_STARTED, run_id=OLD_RUN_ID, attempt=1)
        history.append(CHECKPOINT_COMPLETED, checkpoint_id=1, batch_id=1)
        history.append(JOB_FINISHED, run_id=OLD_RUN_ID, checkpoint_id=1)
        lease.release()
        self.checkpoint_id = 1
        self.scheduler.now = start

    def compactor(self, history: JobHistory, pause: tuple[float, float]) -> Callable[[], None]:
        def program() -> None:
            while True:
                self.scheduler.sleep(self.rng.uniform(*pause))
                try:
                    result = history.compact(self.policy)
                except AirflowCkptError as exc:
                    self.scheduler.log(f"compaction failed: {type(exc).__name__}")
                    continue
                self.scheduler.log(f"compacted {result.compacted}, wrote "
                                   f"{result.segments_written} segment(s)")
        return program

    def exit_code(self, exit_path: str) -> int | None:
        """What the launcher wrote to ``exit_path``: the driver's code, 137 when its
        process died (killed even before it ran), None while it runs."""
        code = self.exit_codes.get(exit_path)
        driver = self.exit_paths.get(exit_path)
        if code is None and driver is not None and not driver.alive:
            return 137
        return code

    def submit(self, attempt: int, restore: str, log_path: str) -> tuple[int, str]:
        """Start the driver of ``attempt`` (a process of its own: it outlives the task);
        its pid and exit file."""
        pid = 1000 + len(self.drivers)
        exit_path = exit_path_of(Path(log_path))
        self.coverage["drivers"] += 1

        def program() -> None:
            code = 137  # killed: the launcher reports the signal
            try:
                code = self._drive(attempt, restore)
            except Exception:
                code = 1
                raise
            finally:
                self.exit_codes[exit_path] = code
        self.drivers[pid] = self.exit_paths[exit_path] = self.scheduler.spawn(
            f"driver-{attempt}-pid{pid}", self.hosts["driver"], program,
            crash_p=self.setup.driver_crash_p, pause_p=self.setup.driver_pause_p,
            pause_s=PAUSE_S)
        return pid, exit_path

    def _drive(self, attempt: int, restore: str) -> int:
        rng, sched = self.rng, self.scheduler
        storage = self.base.view(self.setup.driver_faults, f"driver-{attempt}")
        lease = _ManualLease(storage, JOB, owner=RUN_ID, clock=sched.monotonic,
                             wall_clock=sched.wall_clock, sleep=sched.sleep)
        lease.acquire()
        history = self.history(storage)
        sched.spawn(f"compactor@driver-{attempt}", self.hosts["driver"],
                    self.compactor(history, (0.2, 3.0)), parent=sched.current())
        history.append(JOB_STARTED, run_id=RUN_ID, attempt=attempt)
        if restore != RESTORE_NONE:
            history.append(RESTORED, path=restore, attempt=attempt)
        restart_log = RestartLog(history, self.setup.strategy.params(), RUN_ID)
        for _ in range(rng.randint(2, 40)):
            sched.sleep(rng.uniform(0.5, 5.0))
            lease.beat()
            draw = rng.random()
            if draw < 0.6:
                self.checkpoint_id += 1
                history.append(CHECKPOINT_COMPLETED, checkpoint_id=self.checkpoint_id,
                               batch_id=self.checkpoint_id)
            elif draw < 0.72:
                # as the runtime records it (CheckpointedJob._record_failure): the time
                # storage stored the failure, one clock for both levels
                decision = restart_log.record_failure("query", "query died", attempt=attempt)
                self.coverage["query decisions"] += 1
                if not decision.restart:
                    history.append(JOB_FAILED, run_id=RUN_ID, cause="query died")
                    lease.release()
                    return 1
                sched.sleep(decision.delay_s)
        ending = rng.choice(("finished", "stopped", "exit"))
        if ending == "exit":
            return 1  # e.g. an executor loss the driver does not survive: no terminal event
        self.history(self.terminal_storage).append(
            JOB_FINISHED if ending == "finished" else JOB_STOPPED, run_id=RUN_ID)
        if rng.random() < 0.5:
            # killed right after its terminal event (a container reaped at the end):
            # exits non-zero, its lease expires; the run has ended all the same
            return 143
        lease.release()
        return 0

    # ------------------------------------------------------------------ Airflow

    def operator(self) -> SimOperator:
        """The task, built anew (a worker builds it from the DAG at every entry)."""
        setup = self.setup
        return SimOperator(
            world=self, task_id=TASK, application="job.py", job_name=JOB,
            checkpoint_storage=STORAGE_URI, restart_strategy=setup.strategy.params(),
            restore=setup.first_restore, deferrable=not setup.blocking,
            poll_interval=POLL_INTERVAL_S, startup_timeout_s=STARTUP_TIMEOUT_S)

    def airflow(self) -> None:
        """The scheduler's side: task tries (a retry after a worker death runs
        ``execute`` again), deferrals to the triggerer, resumes on new workers."""
        sched = self.scheduler
        call: tuple[str, Any] = ("execute", None)
        tries = 0
        while True:
            if len(self.drivers) >= MAX_DRIVERS:
                self.coverage["timed out (driver bound)"] += 1
                return
            tries += 1
            result: list[Any] = []
            task = sched.spawn(f"task-{tries}", self.hosts[WORKER], self.task(call, result),
                               crash_p=self.setup.worker_crash_p)
            while task.alive:
                sched.sleep(1.0)
            if task.crashed:
                self.coverage["worker restarts"] += 1
                if self.coverage["worker restarts"] > TASK_RETRIES:
                    return
                sched.sleep(self.rng.uniform(1.0, 30.0))  # the retry delay
                call = ("execute", None)
                continue
            if task.error is not None:
                if not isinstance(task.error, CheckpointedJobFailedError):
                    self.violate(SUPERVISOR_ERROR, f"task {call[0]} died of "
                                 f"{type(task.error).__name__}: {task.error}")
                else:
                    self.coverage["gave up"] += 1
                return
            if not result:  # the task returned: its XCom
                self.coverage["finished"] += 1
                return
            deferral: TaskDeferred = result[0]
            call = (str(deferral.method_name), self.await_trigger(deferral.trigger))

    def task(self, call: tuple[str, Any], result: list[Any]) -> Callable[[], None]:
        """One task try: ``call`` on a new operator; a deferral goes into ``result``."""
        def program() -> None:
            method, event = call
            context: Any = {"ti": SimpleNamespace(dag_id=DAG, run_id=DAG_RUN, task_id=TASK,
                                                  map_index=-1, try_number=1)}
            operator = self.operator()
            self.coverage[f"{'blocking' if self.setup.blocking else 'deferred'} {method}"] += 1
            try:
                if method == "execute":
                    operator.execute(context)
                else:
                    getattr(operator, method)(context, event=event)
            except TaskDeferred as deferral:
                result.append(deferral)
        return program

    def await_trigger(self, trigger: Any) -> Any:
        """Run ``trigger`` on the triggerer until its event (a restart delay: the
        ``TimeDeltaTrigger``'s time passes; the supervision trigger: its real ``run``
        loop, restarted anew whenever the triggerer dies)."""
        sched = self.scheduler
        if isinstance(trigger, SimDelay):
            sched.sleep(trigger.delay_s)
            return None
        _, kwargs = trigger.serialize()
        while True:
            box: list[dict[str, Any]] = []
            crash_p = self.setup.triggerer_crash_p \
                if self.triggerer_restarts < MAX_TRIGGERER_RESTARTS else 0.0
            fresh = QuietTrigger(**kwargs, runtime=SimTriggerRuntime(self))
            actor = sched.spawn("trigger", self.hosts[TRIGGERER],
                                self.trigger(fresh, box), crash_p=crash_p)
            while actor.alive:
                sched.sleep(1.0)
            if box:
                return box[0]
            if actor.error is not None:
                self.violate(SUPERVISOR_ERROR, f"the trigger died of "
                             f"{type(actor.error).__name__}: {actor.error}")
                raise Crash("the trigger failed")
            self.triggerer_restarts += 1
            self.coverage["triggerer restarts"] += 1

    def trigger(self, trigger: DriverSupervisionTrigger,
                box: list[dict[str, Any]]) -> Callable[[], None]:
        def program() -> None:
            step = cast("Coroutine[Any, Any, TriggerEvent]", trigger.run().__anext__())
            try:
                step.send(None)
            except StopIteration as stop:
                payload = stop.value.payload
            else:
                raise RuntimeError("the trigger awaited what the simulation does not run")
            verdict = Verdict.from_payload(payload)
            self.scheduler.log(f"trigger event {verdict.kind}: {verdict.cause}")
            self.coverage[f"verdict {verdict.kind}"] += 1
            self.check_verdict(trigger.submitted_key, verdict)
            box.append(payload)
        return program

    def point_pause(self, name: str, p: float) -> Callable[[], None]:
        """The hook at interleaving point ``name`` (see :data:`POINT_PAUSES`)."""
        def hook() -> None:
            sched = self.scheduler
            actor = sched.current()
            if actor is None or not sched.chance(SCHED_POINT_PAUSE, p):
                return
            process = self.rng.random() < 0.5
            seconds = self.rng.uniform(*(PROCESS_PAUSE_S if process else THREAD_PAUSE_S))
            sched.log(f"{'process' if process else 'thread'} pauses {seconds:.1f} s at "
                      f"{name}")
            if process:  # the whole process stops: its threads too
                for thread in sched.actors:
                    if thread.parent is actor and thread.alive:
                        thread.wake_at = max(thread.wake_at, sched.now + seconds)
            sched.sleep(seconds)
        return hook

    # ------------------------------------------------------------------ running

    def run(self) -> Outcome:
        sched = self.scheduler
        self.seed_old_run()
        sched.log(f"setup: {self.setup.describe()}")
        airflow = sched.spawn("airflow", Host("scheduler"), self.airflow)
        for n in range(1, self.setup.compactors + 1):
            sched.spawn(f"compactor-{n}", self.hosts["other"],
                        self.compactor(self.history(self.compactor_storage), (0.2, 3.0)),
                        parent=airflow)
        with contextlib.ExitStack() as points:
            for name, p in POINT_PAUSES.items():
                points.enter_context(installed(name, self.point_pause(name, p)))
            try:
                sched.run()
            finally:
                sched.shutdown()
        if airflow.error is not None and not isinstance(airflow.error, Crash):
            self.violate(SUPERVISOR_ERROR, f"the scheduler died of "
                         f"{type(airflow.error).__name__}: {airflow.error}")
        self._judged_version = -1
        self.check()
        run = self.run_events()
        self.coverage["driver decisions"] = sum(
            1 for e in run if e.type == RESTART and e.data.get("level") == "driver")
        self.coverage["resubmissions"] = sum(
            1 for e in run if e.type == JOB_SUBMITTED and int(e.data["attempt"]) > 1)
        self.coverage["late landings"] = sum(1 for line in sched.trace if "deliver late" in line)
        # a task retry after the run's end starts it again at attempt 1 (by design: a
        # retry and a cleared task look alike; a new supervision, judged as one)
        self.coverage["runs started again"] = max(0, sum(
            1 for e in self.truth() if e.type == JOB_SUBMITTED
            and e.data.get("run_id") == RUN_ID and int(e.data["attempt"]) <= 1) - 1)
        self.coverage["cut off"] = int(sched.cut_off)
        return Outcome(sched.seed, self.setup, self.violations, sched.trace, sched.step,
                       sched.cut_off,
                       coverage=Coverage.of(sched, self.objects, dict(self.coverage)))


def _hidden(plants: frozenset[str]) -> Hidden | None:
    """What the supervisor's views leave out of listings under the planted defects."""
    own, segments = PLANT_HIDE_OWN in plants, PLANT_HIDE_SEGMENTS in plants
    if not (own or segments):
        return None

    def hidden(key: str, stored: Stored) -> bool:
        return (own and stored.writer == "supervisor" and "/history/" in key) or \
            (segments and SEGMENTS in key)
    return hidden


def run_seed(seed: int, plants: Iterable[str] = ()) -> Outcome:
    """Simulate one seed of the history world (with ``plants``: planted defects, see
    :data:`PLANTS`)."""
    return World(seed, plants).run()
