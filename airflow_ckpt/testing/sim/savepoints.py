"""The savepoint world of the simulation: one savepoint request answered by drivers that
are deposed mid-way (issue 19 item 6).

A savepoint request (id ``v``, request ``r``) stays open until a driver answers it. A
supervisor starts 2-3 drivers one after the other or overlapping; each (host
``driver-<n>``) runs the real classes over the simulated storage:

* a :class:`~airflow_ckpt.runtime.lease.holder.JobLease` taken with the runtime's adoption
  (:meth:`CheckpointedJob._adopt
  <airflow_ckpt.runtime.job.checkpointed_job.CheckpointedJob._adopt>`:
  completed ids and the first id past every reserved one), heartbeats driven explicitly;
* the real :class:`~airflow_ckpt.runtime.checkpoint.coordinator.CheckpointCoordinator` in its
  ``threaded=False`` mode (driven by ``tick()``: capture, upload, completion marker,
  confirm, answer) on the simulation's clock and seeded ids (its constructor's ``clock``
  and ``ids``), with its :class:`~airflow_ckpt.runtime.checkpoint.store.CompletedCheckpointStore`
  and :class:`~airflow_ckpt.runtime.history.journal.JobHistory`, over a
  :class:`~airflow_ckpt.runtime.storage.fenced.FencedStorage` gated by the lease, on a
  Spark-shaped working directory of its own whose files carry the driver's name (so two
  drivers' snapshots differ);
* the request: ``trigger("manual", savepoint_id="v", request_id="r")``, again (the
  requester's retry) while the request is open and the attempt failed.

Besides the storage faults (late writes held up to 80 s, 503s, lost answers) a driver
may pause at any yield point for 40-90 s (a stop-the-world pause: a write that passed
its lease gate lands after a successor took over) or crash.

Invariants, checked when a driver's attempt settles and at the end (the answer also
after every step):

* ``savepoint-verifies``: a savepoint the catalog counts (``savepoints/sp-v/_metadata``)
  restores: :func:`~airflow_ckpt.runtime.restore.materialize.materialize` verifies every file
  it names (hashes match) and the files are one driver's snapshot, not a mix;
* ``savepoint-answer``: a driver answers the request completed only with the savepoint
  storage counts, and does not fail an attempt whose own savepoint storage counts
  (unless it stops without answering: its marker's fate is a successor's to judge);
* ``savepoint-changed`` (after every step): the savepoint's ``_metadata``, once
  written, never changes nor disappears;
* ``savepoint-error``: a driver dies of nothing but a lost lease or an unreachable
  storage;
* ``ungated-write``: every write a driver starts through its ``FencedStorage`` passed
  the lease's gate first.

Planted defect (``--plant shared-savepoint-dir``): every attempt of a savepoint uploads
under ``savepoints/sp-<id>/`` itself, not under its own checkpoint id (the layout before
item 6 was fixed): a deposed driver's late marker then names files a successor
overwrote.
"""

from __future__ import annotations

import json
import random
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import SimpleNamespace

from airflow_ckpt.errors import (
    ConcurrentDriverError,
    EndpointUnreachableError,
    LeaseExpiredError,
    RestoreError,
)
from airflow_ckpt.runtime.checkpoint.catalog import CheckpointCatalog
from airflow_ckpt.runtime.checkpoint.config import CheckpointConfig
from airflow_ckpt.runtime.checkpoint.coordinator import CheckpointCoordinator
from airflow_ckpt.runtime.checkpoint.lease_view import LeaseView
from airflow_ckpt.runtime.checkpoint.store import CompletedCheckpointStore
from airflow_ckpt.runtime.history.journal import JobHistory
from airflow_ckpt.runtime.job import CheckpointedJob
from airflow_ckpt.runtime.lease.holder import JobLease
from airflow_ckpt.runtime.lease.record import DEFAULT_MAX_WRITE_S, DEFAULT_TTL_S
from airflow_ckpt.runtime.restore.materialize import materialize
from airflow_ckpt.runtime.storage.fenced import FencedStorage
from airflow_ckpt.runtime.storage.layout import JobLayout
from airflow_ckpt.testing.sim.buggify import (
    ACTORS_MORE,
    ACTORS_TOGETHER,
    SCHED_CLOCK_JUMP,
    SCHED_CRASH,
    SCHED_PAUSE,
    SCHED_SUSPEND,
    STORAGE_503,
    STORAGE_HANG,
    STORAGE_LATE,
    STORAGE_LOST_ANSWER,
    Swarm,
    driver_count,
)
from airflow_ckpt.testing.sim.outcome import (
    UNGATED_WRITE,
    Coverage,
    Judged,
    Outcome,
    Violation,
)
from airflow_ckpt.testing.sim.scheduler import (
    Host,
    Scheduler,
    SeededUuid,
    VirtualTime,
)
from airflow_ckpt.testing.sim.storage import Faults, RacingView, SimObjects, SimStorage

JOB = "simjob"
SAVEPOINT_ID = "v"
REQUEST_ID = "r"

SAVEPOINT_VERIFIES = "savepoint-verifies"
SAVEPOINT_ANSWER = "savepoint-answer"
SAVEPOINT_ERROR = "savepoint-error"
SAVEPOINT_CHANGED = "savepoint-changed"
INVARIANTS = (SAVEPOINT_VERIFIES, SAVEPOINT_ANSWER, SAVEPOINT_CHANGED, SAVEPOINT_ERROR,
              UNGATED_WRITE)

#: every attempt of a savepoint uploads under ``savepoints/sp-<id>/`` (item 6's old layout)
PLANT_SHARED_DIR = "shared-savepoint-dir"
PLANTS = (PLANT_SHARED_DIR,)

HOLD_S = 2 * (DEFAULT_TTL_S + DEFAULT_MAX_WRITE_S)
PAUSE_S = (DEFAULT_TTL_S + DEFAULT_MAX_WRITE_S, HOLD_S + 10.0)
EXPECTED = (ConcurrentDriverError, LeaseExpiredError, EndpointUnreachableError)
BATCHES = 3
#: the savepoint world's fault sites (sim/buggify.py)
SITES = (STORAGE_503, STORAGE_LOST_ANSWER, STORAGE_LATE, STORAGE_HANG, SCHED_PAUSE,
         SCHED_CRASH, SCHED_CLOCK_JUMP, SCHED_SUSPEND, ACTORS_MORE, ACTORS_TOGETHER)
#: base chance per turn of a host's clock stepping (when the seed enables it)
CLOCK_JUMP_P = 0.002
#: savepoint attempts per driver while the request is open (the requester's retries)
ATTEMPTS = 4
#: working directories live in memory where the machine offers it (many small files)
SCRATCH = "/dev/shm" if Path("/dev/shm").is_dir() else None
_ATTEMPT_DIR = re.compile(r"(/savepoints/sp-[^/]+/)\d+/")
#: share of the seeds with the marker race (:class:`MarkerRace`, a generator of its own)
MARKER_RACE_SEEDS = 0.5
#: the longest a racer's host stays suspended before its marker PUT (true seconds)
MARKER_HOLD_S = 300.0
#: the racer's suspension, in steps of this many seconds (it looks for the marker after each)
SUSPEND_STEP_S = 2.0


class MarkerRace:
    """A deposed driver's savepoint marker racing its successor's (session 15: the
    mutant ``marker-overwrite`` survived seeds 0-199; savepoint seed 517 was the first
    to tell it apart). On :data:`MARKER_RACE_SEEDS` of the seeds (drawn on a generator
    of its own), the first driver about to send the savepoint's ``_metadata`` PUT, past
    its gate and the confirm before it, has its host suspended (its monotonic clock
    stands still, so its lease gate passed) until another driver wrote that marker (the
    successor answering the same request with the same savepoint id), or
    :data:`MARKER_HOLD_S` at most; then it sends its own. Only the create-only condition
    of the marker keeps the first marker the one readers counted."""

    def __init__(self, seed: int, scheduler: Scheduler, objects: SimObjects) -> None:
        self.rng = random.Random(f"savepoints-marker-race-{seed}")
        self.scheduler = scheduler
        self.objects = objects
        self.on = self.rng.random() < MARKER_RACE_SEEDS
        self.raced = False

    def before_marker(self, key: str) -> None:
        """Maybe suspend the calling driver's host before it sends the marker ``key``."""
        if not self.on or self.raced or key in self.objects.objects:
            return
        self.raced = True
        gone = 0.0
        while gone < MARKER_HOLD_S and key not in self.objects.objects:
            self.scheduler.suspend(SUSPEND_STEP_S, f"writing {key}")
            gone += SUSPEND_STEP_S
        if key in self.objects.objects:
            self.scheduler.log(f"wakes after {gone:g} s: another driver wrote {key}")


class _MarkerRacingView(RacingView):
    """A driver's storage view whose savepoint marker PUT races (:class:`MarkerRace`)."""

    race: MarkerRace

    def put_bytes(self, key: str, data: bytes, *, create_only: bool = False,
                  if_match: str | None = None) -> str:
        if key == JobLayout(JOB).savepoint_metadata(SAVEPOINT_ID):
            self.race.before_marker(key)
        return super().put_bytes(key, data, create_only=create_only, if_match=if_match)


class _ManualLease(JobLease):
    """The real lease without its heartbeat thread: the driver actor beats explicitly."""

    def _start_heartbeat(self) -> None:
        return None


def _shared_dir(key: str) -> str:
    """The planted layout: ``savepoints/sp-v/<checkpoint id>/x`` is ``savepoints/sp-v/x``."""
    return _ATTEMPT_DIR.sub(r"\1", key)


def write_workdir(root: Path, writer: str) -> Path:
    """A Spark-shaped working directory after :data:`BATCHES` committed batches, its state
    files naming ``writer``."""
    files = {"metadata": json.dumps({"id": "sim-query"}),
             "state/0/_metadata/metadata":
                 'v1\n{"stateStoreInfo":[{"storeName":"default","numPartitions":2}]}'}
    for b in range(BATCHES):
        files[f"offsets/{b}"] = f'v1\n{{"batchWatermarkMs":0,"conf":{{}}}}\n{{"logOffset":{b}}}\n'
        files[f"commits/{b}"] = "v1\n{}"
        files[f"sources/0/{b}"] = f'v1\n{{"batchId":{b}}}'
        for p in (0, 1):
            files[f"state/0/{p}/{b + 1}.delta"] = f"{writer} state {p} {b + 1}"
    for rel, body in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(body)
    return root


@dataclass(frozen=True, slots=True)
class SavepointSetup:
    """One seed's savepoint system (drawn from the seed)."""

    drivers: int
    faults: Faults
    pause_p: float
    crash_p: float
    plants: frozenset[str] = frozenset()

    @classmethod
    def draw(cls, rng: random.Random, plants: Iterable[str] = (),
             swarm: Swarm | None = None) -> SavepointSetup:
        return cls(
            drivers=driver_count(rng, swarm),
            faults=rng.choice((Faults(0.005, 0.01, 0.005, HOLD_S),
                               Faults(0.01, 0.03, 0.01, HOLD_S))),
            pause_p=rng.choice((0.0, 0.01, 0.03)),
            crash_p=rng.choice((0.0, 0.003)),
            plants=frozenset(plants),
        )

    @property
    def skewed(self) -> bool:
        return False

    def describe(self) -> str:
        return (f"savepoints: {self.drivers} drivers, faults {self.faults}, pause p "
                f"{self.pause_p}, crash p {self.crash_p}"
                + (f", planted {sorted(self.plants)}" if self.plants else ""))


class SavepointWorld(Judged):
    """The simulated savepoint system of one seed (see the module doc)."""

    def __init__(self, seed: int, plants: Iterable[str] = (), max_steps: int = 6000) -> None:
        self.scheduler = Scheduler(seed, max_steps=max_steps, sites=SITES,
                                   clock_jump_p=CLOCK_JUMP_P)
        self.rng = self.scheduler.rng
        self.setup = SavepointSetup.draw(self.rng, plants, self.scheduler.swarm)
        self.objects = SimObjects()
        self.race = MarkerRace(seed, self.scheduler, self.objects)
        self.base = SimStorage(self.objects, self.scheduler, tag="oracle", oracle=True,
                               alias=_shared_dir if PLANT_SHARED_DIR in self.setup.plants
                               else None)
        self.catalog = CheckpointCatalog(self.base, JOB)
        self.scratch = Path(tempfile.mkdtemp(prefix="airflow-ckpt-sim-", dir=SCRATCH))
        self.answered: list[int] = []  # drivers that answered the request completed
        self.noted = False  # a late marker that counts was traced
        self.marker_etag: str | None = None  # of the savepoint's marker when first seen
        self.scheduler.observers.append(self.check_marker)
        self.violations: list[Violation] = []

    # ------------------------------------------------------------------ ground truth

    def counted(self) -> int | None:
        """The checkpoint id of the savepoint storage counts for the request (None: no
        completed savepoint ``v``), after checking that it restores."""
        if SAVEPOINT_ID not in self.catalog.savepoint_ids():
            return None
        manifest = self.catalog.savepoint(SAVEPOINT_ID)
        dest = self.scratch / f"restore-{self.scheduler.step}"
        try:
            materialize(self.base, manifest, JOB + "/", dest, max_workers=1)
        except RestoreError as exc:
            self.violate(SAVEPOINT_VERIFIES, f"savepoint {SAVEPOINT_ID} (checkpoint "
                         f"{manifest.checkpoint_id}, lease epoch {manifest.lease_epoch}) "
                         f"does not restore: {exc}")
            return manifest.checkpoint_id
        self.note_late_marker(manifest.lease_epoch)
        writers = {p.read_text().split(" ")[0] for p in dest.glob("state/0/*/*.delta")}
        shutil.rmtree(dest, ignore_errors=True)
        if len(writers) != 1:
            self.violate(SAVEPOINT_VERIFIES, f"savepoint {SAVEPOINT_ID} restores a mix of "
                         f"snapshots: {sorted(writers)}")
        return manifest.checkpoint_id

    def check_marker(self) -> None:
        """``savepoint-changed``: once written, the savepoint's ``_metadata`` never gets
        other bytes nor disappears (a reader that found it complete keeps it so)."""
        stored = self.objects.objects.get(JobLayout(JOB).savepoint_metadata(SAVEPOINT_ID))
        if self.marker_etag is None:
            self.marker_etag = stored.etag if stored is not None else None
        elif stored is None or stored.etag != self.marker_etag:
            self.violate(SAVEPOINT_CHANGED, f"savepoint {SAVEPOINT_ID}'s _metadata was "
                         + ("deleted" if stored is None else "written again with other bytes")
                         + " after it completed")

    def note_late_marker(self, writer_epoch: int | None) -> None:
        """Trace (once) a counted marker that landed after a successor of its writer
        claimed the job: by design it counts (its files are its own and verify; the
        successor answers the request with it), so this is reported, not a violation."""
        layout = JobLayout(JOB)
        born = self.objects.born
        marker = born.get(layout.savepoint_metadata(SAVEPOINT_ID), 0)
        claims = [int(k[len(layout.lease_prefix):-5]) for k, n in born.items()
                  if k.startswith(layout.lease_prefix) and k[len(layout.lease_prefix):-5].isdigit()
                  and n < marker]
        if writer_epoch is not None and claims and max(claims) > writer_epoch \
                and not self.noted:
            self.noted = True
            self.scheduler.log(f"NOTE: the savepoint counted was written by epoch "
                               f"{writer_epoch}; its marker landed after epoch {max(claims)} "
                               "claimed the job")

    def settled(self, number: int, lease: JobLease, checkpoint_id: int, completed: bool,
                why: str, final: bool) -> None:
        """The invariants when driver ``number``'s attempt settled (``final``: the
        driver stops without answering, e.g. its marker's outcome is unknown: a
        successor decides)."""
        counted = self.counted()
        if completed:
            self.answered.append(number)
            if counted != checkpoint_id:
                self.violate(SAVEPOINT_ANSWER, f"driver-{number} answered with checkpoint "
                             f"{checkpoint_id}; storage counts {counted}")
        elif counted == checkpoint_id and not final:
            self.violate(SAVEPOINT_ANSWER, f"driver-{number} failed the request ({why}) "
                         f"although its own savepoint {SAVEPOINT_ID} (checkpoint {counted}) "
                         "counts and answers it")

    # ------------------------------------------------------------------ actors

    def driver(self, number: int) -> Callable[[], None]:
        def program() -> None:
            try:
                self._drive(number)
            except EXPECTED as exc:
                self.scheduler.log(f"stops: {type(exc).__name__}: {exc}")
            except Exception as exc:
                self.violate(SAVEPOINT_ERROR, f"driver-{number} died of "
                             f"{type(exc).__name__}: {exc}")
        return program

    def _drive(self, number: int) -> None:
        sched, rng = self.scheduler, self.rng
        view = _MarkerRacingView.of(self.base.view(self.setup.faults, f"driver-{number}"),
                                    self.race)
        lease = _ManualLease(view, JOB, owner=f"driver-{number}", clock=sched.monotonic,
                             wall_clock=sched.wall_clock, sleep=sched.sleep)
        # the runtime's own adoption, on the two attributes it reads
        adopt = partial(CheckpointedJob._adopt,
                        SimpleNamespace(lease=lease, job=JOB))  # type: ignore[arg-type]
        record = self.acquire(lease, adopt)
        storage = FencedStorage(*self.fence(view, lease.gate, f"driver-{number}"))
        config = CheckpointConfig.from_dict({
            "execution.checkpointing.interval": "1 h",  # nothing periodic: requests only
            "execution.checkpointing.timeout": "10 min",
            "execution.checkpointing.num-retained": 2,
            # every file an object: this world is about whose objects a marker names
            # (inline files are checked by the crash-point run and the unit tests)
            "state.storage.fs.memory-threshold": 0,
        })
        store = CompletedCheckpointStore(storage, JOB, config.num_retained, epoch=record.epoch,
                                         confirm=lease.confirm)
        workdir = write_workdir(self.scratch / f"driver-{number}" / "work", f"driver-{number}")
        coordinator = CheckpointCoordinator(
            storage=storage, job=JOB, workdir=workdir, config=config, store=store,
            history=JobHistory(storage, JOB, clock=sched.wall_clock, ids=sched.uuid4),
            next_checkpoint_id=max(
                store.recover(), record.first_id or 1),
            spark_version="4.2.0",
            lease=LeaseView(record.epoch, lease.confirm, lease.reserve_ids),
            threaded=False, clock=VirtualTime(sched),
            ids=lambda: SeededUuid(sched).uuid4().hex)
        try:
            for _ in range(ATTEMPTS):
                if self.answered:
                    return  # the request is answered: nothing to do
                pending = coordinator.trigger("manual", savepoint_id=SAVEPOINT_ID,
                                              request_id=REQUEST_ID)
                while not pending.done.is_set():
                    sched.sleep(rng.uniform(0.2, 2.0))
                    try:
                        lease.beat()
                    except EndpointUnreachableError as exc:  # the next beat retries
                        sched.log(f"heartbeat failed: {type(exc).__name__}")
                    coordinator.tick()
                sched.log(f"savepoint attempt {pending.checkpoint_id}: "
                          + ("completed" if pending.manifest else f"failed: {pending.failure}"))
                manifest = pending.manifest
                self.settled(number, lease, manifest.checkpoint_id if manifest
                             else pending.checkpoint_id, manifest is not None,
                             str(pending.failure),
                             coordinator.fatal is not None or lease.failure is not None)
                if manifest is not None or coordinator.fatal is not None:
                    break
        finally:
            coordinator.shutdown()
        if coordinator.fatal is not None:
            raise coordinator.fatal
        lease.release()

    def supervisor(self) -> None:
        """Starts the drivers: the next one when the last ended, or earlier."""
        setup = self.setup
        self.start_drivers(setup.drivers, lambda number: self.scheduler.spawn(
            f"driver-{number}", Host(f"driver-{number}"), self.driver(number),
            crash_p=setup.crash_p, pause_p=setup.pause_p, pause_s=PAUSE_S,
            suspend_p=setup.pause_p))

    def run(self) -> Outcome:
        sched = self.scheduler
        try:
            sched.log(f"setup: {self.setup.describe()}")
            self.supervise(Host("airflow"), self.supervisor, SAVEPOINT_ERROR)
            self.counted()
        finally:
            shutil.rmtree(self.scratch, ignore_errors=True)
        return Outcome(sched.seed, self.setup, self.violations, sched.trace, sched.step,
                       sched.cut_off, "savepoints", Coverage.of(sched, self.objects))


def run_savepoint_seed(seed: int, plants: Iterable[str] = ()) -> Outcome:
    """Simulate the savepoint world of one seed."""
    return SavepointWorld(seed, plants).run()
