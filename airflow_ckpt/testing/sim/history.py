"""Deterministic whole-system simulation of a supervised job (as FoundationDB and
TigerBeetle test themselves): one seed, one schedule, replayed exactly.

The real classes run as actors (:mod:`airflow_ckpt.testing.sim.scheduler`) over a
simulated storage that enforces the storage contract and injects faults
(:mod:`airflow_ckpt.testing.sim.storage`), on hosts whose clocks disagree:

* **the driver** (host ``driver``): takes the :class:`~airflow_ckpt.runtime.lease.holder.JobLease`
  (heartbeats driven explicitly), appends ``job_started``, ``checkpoint_completed``,
  query-level failures through its :class:`~airflow_ckpt.runtime.history.restart_log.RestartLog`
  (``job_failed`` when its strategy declines) and ends with ``job_finished`` /
  ``job_stopped``, an exit without terminal event, or a crash at any step. Its writes
  may time out and land later, get 503s or lose their answers. Its process compacts
  its own history (:meth:`JobHistory.compact` on the driver's instance, as the
  background thread does), and so may 0-2 other processes on a third host (the UI, the
  CLI), whose writes also meet 503s and late landings.
* **the supervisor** (host ``airflow``): the operator's steps - the restore target of
  each submission (:class:`~airflow_ckpt.supervision.RunCheckpoints`), ``job_submitted``,
  a :class:`~airflow_ckpt.supervision.SupervisionProbe` polled until a verdict (its reads
  get 503s; the triggerer may restart, i.e. a fresh probe), the driver-level decision
  (:meth:`RestartLog.record_failure`, unless a terminal event of the run follows the
  submission, :attr:`RunState.attempt_end`, looked for before and after it as
  ``Supervisor._decide`` does), the delay, the next submission. Blocking (one
  restart log kept) or deferrable (everything rebuilt at each resume). Its own storage
  calls are delayed and reordered but never fail: an error there fails the Airflow task,
  whose retry is not modelled.

Invariants, checked after every step (:class:`World`):

* ``event-lost``: every event whose ``append`` returned is read back by
  :meth:`JobHistory.events` (issue 19 item 5); ``history-rewritten``: no history key is
  deleted and later created again with other bytes (readers cache objects by name;
  item 5's cause), but for a *void* write at or below the sealed mark, which no reader
  reads;
* ``restart-decision``: each restart decision equals Flink's
  (:mod:`airflow_ckpt.testing.sim.flink`) over the run's ``restart`` events that storage
  held when the decision was taken (item 3);
* ``own-checkpoint``: a resubmission restores ``latest`` once the run completed a
  checkpoint of its own (item 4), and ``foreign-state``: never before that unless the
  operator asked for ``latest``;
* ``terminal-restarted``: a driver whose job finished, stopped or failed for good (its
  terminal event's append returned before it exited) is never declared dead (and so
  restarted);
* ``supervisor-error``: the supervisor never dies of an error.

Planted defects (:data:`HISTORY_PLANTS`, ``--plant``) are faults of a storage *view* the
simulation must find whatever the history layer looks like.

That is the **history** world (:class:`World`). Every seed also runs in the **sinks**
world (:mod:`airflow_ckpt.testing.sim.sinks`: exactly-once output under deposed drivers
and older restores, issue 19 items 1 and 2) and the **savepoints** world
(:mod:`airflow_ckpt.testing.sim.savepoints`: a savepoint request answered by drivers
deposed mid-way, item 6); :data:`WORLDS` lists them with their plants and invariants.

``python -m airflow_ckpt.testing.simulation --seeds N`` explores N seeds in every world
and prints ``M simulated schedules explored, K violations`` and, for the first failing
seed of each invariant, the seed and its trace (``--seed S [--world W] --trace`` replays
one).
"""

from __future__ import annotations

import argparse
import logging
import random
import sys
import time as real_time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from airflow_ckpt.errors import AirflowCkptError
from airflow_ckpt.restart import RestartDecision
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
from airflow_ckpt.runtime.lease.holder import JobLease
from airflow_ckpt.runtime.lease.record import lease_epochs
from airflow_ckpt.supervision import (
    RESTORE_LATEST,
    RESTORE_NONE,
    RunCheckpoints,
    SupervisionProbe,
    Verdict,
    resubmit_restore,
)
from airflow_ckpt.testing.sim import savepoints, sinks
from airflow_ckpt.testing.sim.flink import (
    ExponentialDelay,
    FailureRate,
    FixedDelay,
    Strategy,
    expected_decisions,
)
from airflow_ckpt.testing.sim.outcome import Judged, Outcome, Violation
from airflow_ckpt.testing.sim.scheduler import (
    Crash,
    Host,
    Scheduler,
)
from airflow_ckpt.testing.sim.storage import Faults, Hidden, SimObjects, SimStorage, Stored

JOB = "simjob"
RUN_ID = "dag/run-2/task"
OLD_RUN_ID = "dag/run-1/task"
SAVEPOINT = "sim://bucket/root/simjob/savepoints/sp-old"
TERMINAL = frozenset({JOB_FINISHED, JOB_STOPPED, JOB_FAILED})
SEGMENTS = "/history/segments/"

#: invariant names (see the module doc) and the issue 19 item each one found
EVENT_LOST = "event-lost"
RESTART_DECISION = "restart-decision"
OWN_CHECKPOINT = "own-checkpoint"
FOREIGN_STATE = "foreign-state"
TERMINAL_RESTARTED = "terminal-restarted"
HISTORY_REWRITTEN = "history-rewritten"
SUPERVISOR_ERROR = "supervisor-error"
HISTORY_INVARIANTS = (EVENT_LOST, HISTORY_REWRITTEN, RESTART_DECISION, OWN_CHECKPOINT,
                      FOREIGN_STATE, TERMINAL_RESTARTED, SUPERVISOR_ERROR)

#: Planted defects: faults of a *reader's or writer's view of storage*, so they keep
#: working whatever the history layer looks like; the simulation must find each.
#: the supervisor's listings miss its own writes (as a key cursor ahead of them: item 3)
PLANT_HIDE_OWN = "hide-own-writes"
#: the supervisor's listings miss compacted segments (item 4)
PLANT_HIDE_SEGMENTS = "hide-segments"
#: a compactor's segment writes are acknowledged and lost (item 5)
PLANT_LOSE_SEGMENTS = "lose-segments"
HISTORY_PLANTS = (PLANT_HIDE_OWN, PLANT_HIDE_SEGMENTS, PLANT_LOSE_SEGMENTS)

#: submissions after which the supervisor gives up (a bound, not a verdict)
MAX_SUBMISSIONS = 8
#: triggerer restarts per run (each makes a new probe wait a full expiry again)
MAX_TRIGGERER_RESTARTS = 2

STRATEGIES: tuple[Strategy, ...] = (
    FixedDelay(attempts=3, delay_ms=1000),
    FailureRate(max_failures=2, interval_ms=120_000, delay_ms=1000),
    ExponentialDelay(initial_ms=1000, max_ms=8000, multiplier=2.0, reset_ms=600_000,
                     attempts=4),
)
SKEWS = (0.0, 0.0, 0.5, -0.5, 3600.0, -3600.0)


@dataclass(frozen=True, slots=True)
class Setup:
    """One seed's system: strategy, clocks, modes, faults (drawn from the seed)."""

    strategy: Strategy
    driver_skew_s: float
    compactor_skew_s: float
    blocking: bool  # blocking supervisor (one restart log) or deferrable (rebuilt)
    first_restore: str
    driver_local: bool  # the supervisor sees the driver's exit code
    segment_events: int
    compactors: int  # compacting processes besides the driver (the UI, the CLI, ...)
    driver_faults: Faults
    driver_crash_p: float
    plants: frozenset[str] = frozenset()

    @classmethod
    def draw(cls, rng: random.Random, plants: Iterable[str] = ()) -> Setup:
        return cls(
            strategy=rng.choice(STRATEGIES),
            driver_skew_s=rng.choice(SKEWS),
            compactor_skew_s=rng.choice(SKEWS),
            blocking=rng.random() < 0.5,
            first_restore=rng.choice((RESTORE_LATEST, RESTORE_NONE, SAVEPOINT)),
            driver_local=rng.random() < 0.5,
            segment_events=rng.choice((2, 3, 4, 1000)),
            compactors=rng.choice((0, 1, 2)),
            driver_faults=rng.choice((Faults(), Faults(0.01, 0.02, 0.01),
                                      Faults(0.02, 0.05, 0.02))),
            driver_crash_p=rng.choice((0.0, 0.005, 0.02)),
            plants=frozenset(plants),
        )

    @property
    def skewed(self) -> bool:
        """Whether any two hosts' clocks disagree."""
        return bool(self.driver_skew_s or self.compactor_skew_s)

    def describe(self) -> str:
        return (f"strategy {self.strategy}, driver clock {self.driver_skew_s:+g} s, "
                f"compactor clock {self.compactor_skew_s:+g} s, "
                f"{'blocking' if self.blocking else 'deferrable'} supervisor, "
                f"restore {self.first_restore}, driver "
                f"{'local' if self.driver_local else 'remote'}, segments of "
                f"{self.segment_events}, {self.compactors} compactor(s) besides the driver, "
                f"driver faults {self.driver_faults}, crash p {self.driver_crash_p}"
                + (f", planted {sorted(self.plants)}" if self.plants else ""))


class _ManualLease(JobLease):
    """The real lease without its heartbeat thread: the driver actor beats explicitly."""

    def _start_heartbeat(self) -> None:
        return None


class TrackedHistory(JobHistory):
    """A job history that tells the world which appends returned (durable by contract)."""

    def __init__(self, storage: SimStorage, world: World, **kwargs: Any) -> None:
        super().__init__(storage, JOB, **kwargs)
        self.world = world

    def append(self, event_type: str, **data: Any) -> HistoryEvent:
        event = super().append(event_type, **data)
        self.world.appended[event.key] = event_type
        self.world.scheduler.log(f"appended {event_type} {event.key.rsplit('/', 1)[-1]}")
        return event


class World(Judged):
    """The simulated system of one seed: actors, storage, ground truth and invariants."""

    def __init__(self, seed: int, plants: Iterable[str] = (), max_steps: int = 6000) -> None:
        self.scheduler = Scheduler(seed, max_steps=max_steps)
        self.rng = self.scheduler.rng
        self.setup = Setup.draw(self.rng, plants)
        self.objects = SimObjects()
        base = SimStorage(self.objects, self.scheduler, tag="oracle", oracle=True)
        plants = self.setup.plants
        self.driver_storage = base.view(self.setup.driver_faults, "driver")
        self.compactor_storage = base.view(
            Faults(unavailable=0.02, late=0.02), "compactor",
            dropped=SEGMENTS if PLANT_LOSE_SEGMENTS in plants else None)
        self.supervisor_storage = base.view(Faults(), "supervisor", hidden=_hidden(plants))
        self.probe_storage = base.view(Faults(unavailable=0.05), "probe",
                                       hidden=_hidden(plants))
        self.oracle = HistoryReader(base, JOB, cache=EventCache())
        self.hosts = {
            "driver": Host("driver", self.setup.driver_skew_s),
            "airflow": Host("airflow", 0.0),
            "other": Host("other", self.setup.compactor_skew_s),
        }
        self.policy = CompactionPolicy(every=0,
                                       segment_events=self.setup.segment_events,
                                       retain_checkpoint_events=None)
        self.appended: dict[str, str] = {}  # key -> type of every append that returned
        self.exit_codes: dict[int, int] = {}  # submission attempt -> driver exit code
        self.violations: list[Violation] = []
        self.checkpoint_id = 0
        self.triggerer_restarts = 0
        self._truth_version = -1
        self._truth: list[HistoryEvent] = []
        self._changed_seen = 0
        self.scheduler.observers.append(self.check_events)

    # ------------------------------------------------------------------ ground truth

    def truth(self) -> list[HistoryEvent]:
        """Every event storage holds (the public reader over a faultless view), in the
        order their keys were first created. The reader's cache is dropped whenever an
        object got other bytes (the ``history-rewritten`` invariant reports that)."""
        if self.objects.version != self._truth_version:
            if self.objects.changed != self._changed_seen:  # its cache trusts names
                self._changed_seen = self.objects.changed
                self.oracle = HistoryReader(self.oracle.storage, JOB, cache=EventCache())
            events = self.oracle.events()
            born = self.objects.born
            self._truth = sorted(events, key=lambda e: born.get(e.key, 0))
            self._truth_version = self.objects.version
        return self._truth

    def born(self, event: HistoryEvent) -> int:
        return self.objects.born.get(event.key, 0)

    # ------------------------------------------------------------------ invariants

    def check_events(self) -> None:
        """``event-lost``: every append that returned is read back;
        ``history-rewritten``: no history key is deleted and created again with other
        bytes."""
        rewritten = sorted(k for k in self.objects.rewritten if "/history/" in k)
        if rewritten:
            self.violate(HISTORY_REWRITTEN, "deleted, then written again with other content "
                         "(a reader that caches it by name misses events): "
                         + ", ".join(k.rsplit("/", 1)[-1] for k in rewritten))
        held = {e.key for e in self.truth()}
        lost = [k for k in self.appended if k not in held]
        if lost:
            self.violate(EVENT_LOST, "appended and acknowledged, no longer in the history: "
                         + ", ".join(f"{self.appended[k]} {k.rsplit('/', 1)[-1]}"
                                     for k in lost))

    def restarts(self) -> list[HistoryEvent]:
        return [e for e in self.truth() if e.type == RESTART
                and e.data.get("run_id") == RUN_ID]

    def check_decision(self, level: str, now: float, decision: RestartDecision,
                       before: list[HistoryEvent]) -> None:
        """``restart-decision``: Flink's answer over the restarts storage held when the
        decision began, or (for writes that landed meanwhile) when it ended."""
        got = (decision.restart, decision.attempt, round(decision.delay_s * 1000))
        after = [e for e in self.restarts()
                 if not (e.data.get("failure_ts") == now and e.data.get("level") == level)]
        candidates = []
        for held in (before, after):
            stamps = [float(e.data["failure_ts"]) for e in held] + [now]
            candidates.append(expected_decisions(self.setup.strategy, stamps)[-1])
        self.scheduler.log(f"{level} decision {got}, Flink's {candidates[0]} over "
                           f"{len(before)} recorded restart(s)")
        if got not in candidates:
            self.violate(RESTART_DECISION, f"{level}-level decision (restart, attempt, "
                         f"delay ms) = {got}, Flink's over the {len(before)} restart(s) "
                         f"recorded = {candidates[0]}")

    def own_checkpoint(self) -> bool:
        """Whether storage holds a checkpoint completed after the run's first submit."""
        events = self.truth()
        firsts = [self.born(e) for e in events if e.type == JOB_SUBMITTED
                  and e.data.get("run_id") == RUN_ID]
        return bool(firsts) and any(e.type == CHECKPOINT_COMPLETED and self.born(e) > firsts[0]
                                    for e in events)

    def check_restore(self, restore: str, own_before: bool) -> None:
        """``own-checkpoint`` / ``foreign-state`` for one resubmission's target."""
        own_after = self.own_checkpoint()
        if restore != RESTORE_LATEST and own_before and own_after:
            self.violate(OWN_CHECKPOINT, f"resubmitted with restore={restore} although the "
                         "run completed a checkpoint of its own (it goes back in time)")
        if restore == RESTORE_LATEST and self.setup.first_restore != RESTORE_LATEST \
                and not own_before and not own_after:
            self.violate(FOREIGN_STATE, "resubmitted with restore=latest before the run had "
                         "a checkpoint of its own (it resumes another run's state)")

    def terminal_of(self, submitted: HistoryEvent) -> HistoryEvent | None:
        """A terminal event of the run newer than ``submitted`` that storage holds and
        whose append returned: the driver wrote it before it exited, released its lease
        or died, so any verdict about that driver comes after it."""
        floor = self.born(submitted)
        return next((e for e in self.truth() if e.type in TERMINAL and self.born(e) > floor
                     and e.data.get("run_id") == RUN_ID and e.key in self.appended), None)

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
        lease = _ManualLease(self.supervisor_storage, JOB, owner=OLD_RUN_ID,
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

    def driver(self, attempt: int, restore: str) -> Callable[[], None]:
        def program() -> None:
            code = 137
            try:
                code = self._drive(attempt, restore)
            except Exception:
                code = 1
                raise
            finally:
                self.exit_codes[attempt] = code
        return program

    def _drive(self, attempt: int, restore: str) -> int:
        rng, sched = self.rng, self.scheduler
        storage = self.driver_storage
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
                before = self.restarts()
                now = sched.wall_clock()
                decision = restart_log.record_failure("query", "query died", now=now,
                                                      attempt=attempt)
                self.check_decision("query", now, decision, before)
                if not decision.restart:
                    history.append(JOB_FAILED, run_id=RUN_ID, cause="query died")
                    lease.release()
                    return 1
                sched.sleep(decision.delay_s)
        ending = rng.choice(("finished", "stopped", "exit"))
        if ending == "exit":
            return 1  # e.g. an executor loss the driver does not survive: no terminal event
        history.append(JOB_FINISHED if ending == "finished" else JOB_STOPPED, run_id=RUN_ID)
        lease.release()
        return 0

    def supervisor(self) -> None:
        """The operator's supervision loop (see the module doc)."""
        sched, setup = self.scheduler, self.setup
        history = self.history(self.supervisor_storage)
        restart_log = RestartLog(history, setup.strategy.params(), RUN_ID)
        checkpoints = RunCheckpoints(history, RUN_ID)
        attempt = 1
        for submission in range(MAX_SUBMISSIONS):
            if not setup.blocking:  # the deferrable path rebuilds at every resume
                restart_log = RestartLog(history, setup.strategy.params(), RUN_ID)
                checkpoints = RunCheckpoints(history, RUN_ID)
                if submission == 0:
                    attempt = restart_log.next_attempt()
                elif restart_log.refresh().attempt_end is not None:
                    return  # Supervisor.resume: the last submission ended meanwhile
                else:
                    attempt = restart_log.last_submit_attempt() + 1
            restore = setup.first_restore
            if attempt > 1:
                own_before = self.own_checkpoint()
                restore = resubmit_restore(setup.first_restore, checkpoints.progress())
                sched.log(f"attempt {attempt}: restore={restore}")
                self.check_restore(restore, own_before)
            epochs = lease_epochs(self.supervisor_storage, JOB)
            submitted = history.append(JOB_SUBMITTED, run_id=RUN_ID, attempt=attempt,
                                       restore=restore)
            sched.spawn(f"driver-{attempt}", self.hosts["driver"],
                        self.driver(attempt, restore), crash_p=setup.driver_crash_p)
            verdict = self._watch(submitted, epochs[-1] if epochs else 0, attempt)
            if verdict.kind in ("finished", "failed"):
                return
            if not setup.blocking:
                restart_log = RestartLog(history, setup.strategy.params(), RUN_ID)
            # Supervisor._decide: a terminal event after the submission ends it (looked
            # for before the FAILURE and again on top of the decision)
            state = restart_log.refresh()
            if state.attempt_end is not None or state.in_process_gave_up is not None:
                return
            before = self.restarts()
            now = sched.wall_clock()
            decision = restart_log.record_failure("driver", verdict.cause, now=now,
                                                  submit_attempt=attempt)
            self.check_decision("driver", now, decision, before)
            if restart_log.refresh().attempt_end is not None:
                return
            if not decision.restart:
                history.append(JOB_FAILED, run_id=RUN_ID, cause=verdict.cause)
                return
            sched.sleep(decision.delay_s)
            attempt += 1

    def _watch(self, submitted: HistoryEvent, epoch_before: int, attempt: int) -> Verdict:
        """Poll a probe (the trigger) until a verdict; the triggerer may restart."""
        sched = self.scheduler
        local = self.setup.driver_local

        def probe() -> SupervisionProbe:
            return SupervisionProbe(
                self.history(self.probe_storage), RUN_ID, submitted_key=submitted.key,
                lease_epoch_before=epoch_before,
                exit_code=lambda: self.exit_codes.get(attempt) if local else None,
                startup_timeout_s=120.0, clock=sched.monotonic)

        current = probe()
        while True:
            sched.sleep(5.0)
            if self.triggerer_restarts < MAX_TRIGGERER_RESTARTS and self.rng.random() < 0.02:
                self.triggerer_restarts += 1
                sched.log("triggerer restart: a new probe")
                current = probe()
            try:
                verdict = current.poll()
            except AirflowCkptError as exc:
                sched.log(f"poll failed: {type(exc).__name__}")
                continue
            if verdict is None:
                continue
            sched.log(f"verdict {verdict.kind}: {verdict.cause}")
            terminal = self.terminal_of(submitted)
            if verdict.needs_restart_decision and terminal is not None:
                self.violate(TERMINAL_RESTARTED, f"the driver was declared dead "
                             f"({verdict.cause}) after its {terminal.type} "
                             f"{terminal.key.rsplit('/', 1)[-1]}")
            return verdict

    # ------------------------------------------------------------------ running

    def run(self) -> Outcome:
        sched = self.scheduler
        self.seed_old_run()
        sched.log(f"setup: {self.setup.describe()}")
        supervisor = sched.spawn("supervisor", self.hosts["airflow"], self.supervisor)
        for n in range(1, self.setup.compactors + 1):
            sched.spawn(f"compactor-{n}", self.hosts["other"],
                        self.compactor(self.history(self.compactor_storage), (0.2, 3.0)),
                        parent=supervisor)
        try:
            sched.run()
        finally:
            sched.shutdown()
        if supervisor.error is not None and not isinstance(supervisor.error, Crash):
            self.violate(SUPERVISOR_ERROR, f"the supervisor died of "
                         f"{type(supervisor.error).__name__}: {supervisor.error}")
        self.check_events()
        return Outcome(sched.seed, self.setup, self.violations, sched.trace, sched.step,
                       sched.cut_off)


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
    :data:`HISTORY_PLANTS`)."""
    return World(seed, plants).run()


#: the worlds of the simulation: name -> (its planted defects, its invariants, one run)
WORLDS: dict[str, tuple[tuple[str, ...], tuple[str, ...],
                        Callable[[int, Iterable[str]], Outcome]]] = {
    "history": (HISTORY_PLANTS, HISTORY_INVARIANTS, run_seed),
    "sinks": (sinks.PLANTS, sinks.INVARIANTS, sinks.run_sink_seed),
    "savepoints": (savepoints.PLANTS, savepoints.INVARIANTS, savepoints.run_savepoint_seed),
}
PLANTS = tuple(p for plants, _, _ in WORLDS.values() for p in plants)
INVARIANTS = tuple(i for _, invariants, _ in WORLDS.values() for i in invariants)


def worlds_for(plants: Iterable[str]) -> list[str]:
    """The worlds a run explores: all of them, or with ``plants`` those they belong to."""
    wanted = set(plants)
    if not wanted:
        return list(WORLDS)
    return [name for name, (own, _, _) in WORLDS.items() if wanted & set(own)]


@dataclass
class Exploration:
    """What :func:`explore` found: seeds and schedules run (one per seed and world),
    failing schedules, the first failing schedule of each invariant."""

    seeds: int = 0
    schedules: int = 0
    violations: int = 0
    first: dict[str, Outcome] = field(default_factory=dict)
    first_unskewed: dict[str, Outcome] = field(default_factory=dict)  # all clocks agree
    failing_seeds: list[int] = field(default_factory=list)


def explore(seeds: Iterable[int], plants: Iterable[str] = (),
            stop_when_found: Iterable[str] = (), stop_on_violation: bool = False,
            worlds: Iterable[str] | None = None, stop_when_any: Iterable[str] = ()
            ) -> Exploration:
    """Run ``seeds`` in each of ``worlds`` (default: :func:`worlds_for` the plants);
    stop early once every invariant of ``stop_when_found`` broke, or one of
    ``stop_when_any`` (or, with ``stop_on_violation``, at the first violation)."""
    wanted, some = set(stop_when_found), set(stop_when_any)
    plants = list(plants)
    chosen = list(worlds) if worlds is not None else worlds_for(plants)
    result = Exploration()
    for seed in seeds:
        result.seeds += 1
        for name in chosen:
            own, _, run = WORLDS[name]
            outcome = run(seed, [p for p in plants if p in own])
            result.schedules += 1
            if outcome.violations:
                result.violations += 1
                if seed not in result.failing_seeds:
                    result.failing_seeds.append(seed)
            for violation in outcome.violations:
                result.first.setdefault(violation.invariant, outcome)
                if not outcome.setup.skewed:
                    result.first_unskewed.setdefault(violation.invariant, outcome)
        if (wanted and wanted <= set(result.first)) or (some & set(result.first)) \
                or (stop_on_violation and result.first):
            break
    return result


def format_outcome(outcome: Outcome, tail: int = 120) -> str:
    """A failing seed, readably: setup, violations and the end of its trace."""
    lines = [f"seed {outcome.seed}: {outcome.setup.describe()}"]
    lines += [f"  {v}" for v in outcome.violations]
    lines.append(f"  trace (last {tail} of {len(outcome.trace)} lines):")
    lines += [f"    {line}" for line in outcome.trace[-tail:]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m airflow_ckpt.testing.simulation [--seeds N] [--start S] [--seed S
    --trace] [--plant NAME] [--world NAME]``: explore seeds, report, exit 1 on any
    violation."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=200, help="how many seeds to explore")
    parser.add_argument("--start", type=int, default=0, help="the first seed")
    parser.add_argument("--seed", type=int, help="replay one seed and print its trace")
    parser.add_argument("--trace", action="store_true", help="print the whole trace")
    parser.add_argument("--plant", action="append", choices=PLANTS, default=[],
                        help="plant a defect (the simulation must find it)")
    parser.add_argument("--world", action="append", choices=list(WORLDS),
                        help="explore only this world (default: every world, or with "
                             "--plant the worlds of the planted defects)")
    args = parser.parse_args(argv)
    worlds = args.world or worlds_for(args.plant)
    logging.disable(logging.CRITICAL)  # the runtime's warnings about injected faults
    if args.seed is not None:
        failed = False
        for name in worlds:
            own, _, run = WORLDS[name]
            outcome = run(args.seed, [p for p in args.plant if p in own])
            print(f"[{name}] " + format_outcome(
                outcome, len(outcome.trace) if args.trace else 120))
            failed = failed or bool(outcome.violations)
        return 1 if failed else 0
    started = real_time.monotonic()
    result = explore(range(args.start, args.start + args.seeds), args.plant, worlds=worlds)
    for invariant in INVARIANTS:
        first = result.first.get(invariant)
        if first is not None:
            print(f"FIRST {invariant}: seed {first.seed} "
                  f"({first.seed - args.start + 1} seeds, world {first.world})\n"
                  + format_outcome(first, 60))
    for invariant in INVARIANTS:
        unskewed = result.first_unskewed.get(invariant)
        if unskewed is not None:
            print(f"first {invariant} with every clock right: seed {unskewed.seed} "
                  f"({unskewed.seed - args.start + 1} seeds)")
    print(f"{result.schedules} simulated schedules explored ({result.seeds} seeds x "
          f"{len(worlds)} worlds: {', '.join(worlds)}), {result.violations} violations "
          f"({real_time.monotonic() - started:.0f} s)")
    if result.failing_seeds:
        print(f"failing seeds: {result.failing_seeds[:50]}")
    return 1 if result.violations else 0


if __name__ == "__main__":
    sys.exit(main())
