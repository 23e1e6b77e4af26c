"""The job world of the simulation: real ``CheckpointedJob`` drivers of one job, fighting
over it, against a ground truth (issue 25 items A and C).

**Contention** (:class:`Contention`, drawn apart so other seeds keep their schedules):
drivers started together, claimants pausing between judging the lease free and
claiming it (``lease.before_claim``) or before deleting the older epochs' records
(``lease.after_claim``), heartbeat threads stalling (``lease.before_beat``)
and hosts suspended mid-write (their gate passes while a successor took over). The
**claim race** (:class:`ClaimRace`, drawn apart too): two claimants meeting at
``lease.before_claim`` (both judge the same state and claim the same epoch), and claim
PUTs held in the network (landing after the winner's takeover, or after a successor's
sweep: a record created again behind newer ones).

2-4 drivers of one job (each on its own host, clocks skewed), started together or late,
each a process that may run 1-3 *lives* (a retried Airflow task: a driver that met
another holder tries again a while later). Every life is the real
:class:`~airflow_ckpt.runtime.job.checkpointed_job.CheckpointedJob` over
:class:`JobSpark` (:mod:`airflow_ckpt.testing.simquery`: a deterministic micro-batch
query, no JVM) and the simulated storage, with everything it brings: lease acquire with
adoption (``valid_checkpoint_ids``) and its heartbeat (an actor: a thread of the
driver's process, paused with it), the unthreaded coordinator
(``InlineExecutor(deferred=True)``: an async phase runs at the next tick), retention
``num-retained`` 1-3 with subsumption and shared-file GC on incremental checkpoints,
``restore`` with fallback and the catalog's reads, the control channel and its doorbell,
the outage wrapper (``tolerable-storage-outage`` 30 s: 503s are waited through on the
virtual clock), and a sink: :class:`~airflow_ckpt.runtime.sinks.jsonl.JsonLinesSink` or
:class:`SimParquetSink` (the real ``ParquetSink`` whose executor side - the staged files
a ``mapInArrow`` task would upload - is simulated), in EXACTLY_ONCE or AT_LEAST_ONCE
mode. Clocks and ids are the scheduler's (set on the collaborators' public attributes
after construction); the history's background compaction is off.

**Ground truth.** The input is a fixed sequence of records ``(i, key, value)``; batch
``b`` reads records ``b*P .. b*P+P-1``. The query's state is the running sum per key
(two state partitions, one version per batch, older versions purged as Spark does), and
each output row is ``(i, key, running sum of key up to i)``: a restore of another state
than the one the offsets say shows as wrong sums.

**Faults.** A driver's storage calls meet 503s, lost answers and writes landing up to
:data:`HOLD_S` after their caller gave up; a driver may crash at any yield point, or
pause (its whole process) for up to :data:`PAUSE_S` in the middle of anything - after
its lease gate, say: a deposed writer. A vandal damages or deletes a shared file, a
checkpoint file or a ``_metadata`` at random. A control client sends savepoint and
stop-with-savepoint requests through the real :class:`ControlChannel` (and one request
from a *newer* version, with a field this one does not know), waits for the answer and
expires its request when it gives up (``expire_request``). An executor may be lost
while a checkpoint uploads (:class:`Uploads`: the checkpoint is cancelled with its files
durable, and the restarted query replays content-equal files), and in some seeds the
vandal strikes the first checkpoint of a run that started from an explicit target or
from scratch while an executor is lost in its next batch (:meth:`JobWorld.strike_floor`;
with :attr:`JobWorld.older_run`, a later run restores an older checkpoint on purpose
and only such runs are struck). Each drawn from a generator of its own: an operator's
wrong cleanup damages every object of the newest checkpoint once the drivers are gone
(:attr:`JobWorld.cleanup`), and an impatient requester gives up at its request's short
timeout and asks again at once (:attr:`JobWorld.impatient`). Seed 304536's story
(:attr:`JobWorld.floor_takeover`): a checkpoint left below the retention floor of a
deposed writer's marker still counts, and the vandal strikes the checkpoints at or
above the floor (:meth:`JobWorld.strike_retention_floor`). Session 15's
:class:`BuriedClaim` (:attr:`JobWorld.buried`): a claim PUT landing after the sweep of
its epoch, below a final record, the claimant above that record killed before its
second look, and a deposed holder's late marker only the buried record counts.
Session 16's replayed overlap (:mod:`~airflow_ckpt.testing.sim.replay`, drawn apart):
an executor lost at a checkpoint's last upload unit two batches past the newest
retained one, and the restarted run's completions overlapping the next checkpoint,
which reserves the lost checkpoint's keys by content while the collection decides.
Session 16's stories (:mod:`~airflow_ckpt.testing.sim.deposed`): a holder suspended before
the marker whose completion subsumes, until a successor claimed (:attr:`JobWorld.deposed_marker`),
and a claimant suspended after its rejudge, before its claim PUT, until a successor reached a
marker (:attr:`JobWorld.stale_claim`).
Session 16's overtaking checkpoint (:mod:`~airflow_ckpt.testing.sim.overtake`, drawn
apart): ``max-concurrent-checkpoints`` 2 on some seeds, the next checkpoint's whole async
phase running while the previous one uploads (which must then fail as subsumed), and
the driver crashing where the overtaken one settles.
Session 17's subsumed fallback (:mod:`~airflow_ckpt.testing.sim.fallback`, drawn apart):
a successor's restore reading the marker of the checkpoint a deposed holder's
collection subsumes (the vandal deleted every marker above it) while the completion
overlap's window *b* is open, and its files only after the overlapping checkpoint's
collection (``job-gc-damage``).
Session 18's lapsed marker (:class:`LapsedMarker`, drawn apart): a completion marker's
PUT lands, its answer lost, at the start of an outage of its driver's storage that
outlasts the lease but not the outage budget: the wrapper's repetition is refused by
the lapsed lease's gate (``job-failed-counted``).
Session 19's deposed holder (``LapsedMarker.deposed``, drawn apart): the same marker
written by a holder suspended past a takeover whose claimant dies right after its claim,
its answer lost once the holder's heartbeat saw the takeover; the repetition is refused
(the marker abandoned: the coordinator decides to stop) and the outage, the driver's view
of the sink's table included, outlasts the budget, so the next batch fails on a spent
outage: the driver must stop, not restart in process (``job-older-state``).
After the chaos, a faultless
*recovery* driver runs the job to its end (``restore=latest``; again after a stop).

Invariants (checked after every step unless said; each with the mutant that shows it
can fail, see docs/architecture.md "Deterministic simulation"):

* ``job-output`` (at the end, against the ground truth): after recovery every record
  is published exactly once (EXACTLY_ONCE; at least once in AT_LEAST_ONCE) with its
  right running sum, or a documented refusal happened (``restore=latest`` found no
  restorable checkpoint at or above the retention floor because the vandal damaged
  every one - one below the floor is no candidate, a design decision: seed 304536 on
  session 14's code - or the restored snapshot lists a sink transaction a later run
  aborted: ``SinkTransactionAbortedError``);
* ``job-uncovered-commit`` (EXACTLY_ONCE): no batch is committed (a sink decision
  exists) unless a checkpoint or savepoint whose batch covers it completed;
* ``job-checkpoint-changed``: a completed checkpoint's or savepoint's ``_metadata``,
  and every object it references, never changes once written (but by the vandal);
* ``job-checkpoint-verifies``: every retained checkpoint that counts, and every
  savepoint, has every object it references (every step) and restores - its files
  verify by size and checksum, ``materialize`` (at the end) - unless the vandal
  touched one of its objects;
* ``job-damaged-reference``: a checkpoint completed by a driver after its restore found
  objects damaged never references one of them while it is still damaged ("found": the
  restore's word, and the world's ground truth: every object the vandal touched that a
  checkpoint newer than the one resumed references, as a fallback reads every file of
  each checkpoint it tries);
* ``job-older-state``: ``restore=latest`` resumes the newest checkpoint that counts
  and restores (at or above the run's floor), never an older one nor a fresh start,
  unless every newer one is damaged, and never one below the retention floor (judged
  by the world's own floors, :meth:`JobWorld.reader_floor`); an explicit target is
  taken as asked;
* ``job-control``: every control request whose write the client saw succeed is
  answered, exactly once (the answer never changes), by the end (one whose write
  failed may land later unseen: nobody waits for it, it expires by its own clock); the
  request from a newer version is answered "failed" by the driver that reads it
  (unless its requester expired it first), never stuck; a "completed" answer names a
  savepoint taken after its request was made (a second request for the same savepoint
  id is never answered with the first one's); an answered request is not acted on
  again (its savepoint events stored after the answer: at most one per query run
  started before it); a driver life never answers a request whose request object its
  own clean-up deleted (judged from the writes it issued);
* ``job-driver-error``: a driver life ends finished, stopped, or of a lost lease, an
  unreachable storage, spent restarts or a documented refusal - never of anything else
  (e.g. ``CorruptCheckpointError`` from its sink: a wedged job);
* ``job-restored-uncounted``: ``restore=latest`` by the holder never resumes a
  checkpoint whose marker does not count - judged by the design's rule from the lease
  record (adopted, or the holder's own), not by the runtime's filter;
* ``job-retention``: a checkpoint that counts loses its ``_metadata`` (not by the vandal)
  only while ``num-retained`` newer checkpoints count (a deposed driver acting on a
  marker that never counted must not subsume what its successor adopted; during a
  takeover, a marker stored at the claim counts by the older records: seed 301107);
* ``ungated-write``: every write a driver starts through its ``FencedStorage`` passed
  its lease gate first (as in the sink and savepoint worlds);
* ``job-uncounted`` (each restore by the holder, its takeover over): a checkpoint that
  counted keeps counting while its marker exists (a takeover adopts every marker that
  landed before its claim), unless ``num-retained`` newer ones count or were deleted
  by the vandal (below the retention floor: subsumed, its marker may outlive it);
* ``job-renewed-deposed``: a heartbeat succeeds only while no newer epoch's record
  exists (checked in the step it returns: its confirm's listing is its last call);
* ``job-write-after-expiry``: a driver's lease gate passes no write once ``ttl -
  max_write`` of its own monotonic clock passed since its last heartbeat (or claim)
  returned;
* ``job-savepoint-kept``: a savepoint leaves (not by the vandal) only if it is in the
  savepoint history (``extra.savepoint_history``: periodic, or requested without a
  name), no ``_restored`` mark was ever seen in its directory nor did a driver restore
  from it (as the world saw it: after its mark is durable), it is not the newest
  history savepoint seen, and at least ``savepoint.history.max.count`` newer history
  savepoints were seen (:class:`Retention`, drawn from a generator of its own);
* ``job-one-holder``: a holder's lease gate passes only while the stored record of its
  epoch is its own claim (the store's writer of that record: two claimants of one
  epoch never both write as its holder);
* ``job-cut-off``: no schedule is cut off at the step limit (a driver stuck on
  something; counted and reported);
* ``job-marker-resurrected``: a checkpoint whose ``_metadata`` was deleted (subsumed)
  never counts again, also when a late write creates the marker again (a marker PUT
  whose answer was lost, repeated by the outage wrapper, the first copy landing after
  retention deleted it: seed 129): the catalog, which restore, adoption and ``recover``
  read through, ignores it (below the newer markers' retention floor), unless the
  vandal damaged or deleted a marker above it (the floor may be unreadable then: seed
  101367). Such a marker is judged as damaged by the other invariants (its files are
  gone);
* ``job-failed-counted`` (at the end): a checkpoint the history records failed
  (``checkpoint_failed``) never counted at any step (its driver released its shared
  files and counted a failure; a marker whose outcome is unknown is abandoned, never
  failed).

:class:`~airflow_ckpt.testing.sim.outcome.Outcome.coverage` counts what each schedule
exercised (GC over a non-empty set, adoption filtering a marker, a restore fallback,
control answers, the outage wrapper riding out an outage, the Parquet sink, contention:
a second lease holder, and a holder deposed while alive).
"""

from __future__ import annotations

import contextlib
import json
import random
import shutil
import tempfile
import threading
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from airflow_ckpt.errors import (
    AirflowCkptError,
    ConcurrentDriverError,
    ControlAnswerLostError,
    CorruptCheckpointError,
    EndpointUnreachableError,
    LeaseExpiredError,
    MetadataError,
    ObjectAlreadyExistsError,
    OutcomeUnknownError,
    RestartsExhaustedError,
    RestoreError,
    RestoreRefusedError,
    SinkTransactionAbortedError,
    StorageError,
)
from airflow_ckpt.runtime import interleave
from airflow_ckpt.runtime.checkpoint.catalog import CheckpointCatalog
from airflow_ckpt.runtime.checkpoint.coordinator import CheckpointCoordinator
from airflow_ckpt.runtime.checkpoint.metadata import FileEntry, Manifest, parse_manifest
from airflow_ckpt.runtime.checkpoint.savepoint_history import IN_HISTORY, RESTORED_NAME
from airflow_ckpt.runtime.control.channel import ControlChannel, ControlRequest
from airflow_ckpt.runtime.control.savepoints import expire_request
from airflow_ckpt.runtime.history.events import CHECKPOINT_FAILED
from airflow_ckpt.runtime.job import CheckpointedJob
from airflow_ckpt.runtime.job import checkpointed_job as job_module
from airflow_ckpt.runtime.lease.holder import JobLease
from airflow_ckpt.runtime.lease.record import (
    LeaseRecord,
    lease_epochs,
    lease_key,
    read_epoch,
    read_lease,
    valid_checkpoint_ids,
)
from airflow_ckpt.runtime.restore.choose import RestoreResult
from airflow_ckpt.runtime.restore.materialize import materialize
from airflow_ckpt.runtime.sinks import JsonLinesSink, TwoPhaseCommitSink
from airflow_ckpt.runtime.sinks.parquet import ParquetSink
from airflow_ckpt.runtime.sinks.transactions import SinkTransactions
from airflow_ckpt.runtime.storage.base import CheckpointStorage
from airflow_ckpt.runtime.storage.layout import JobLayout
from airflow_ckpt.testing import simquery
from airflow_ckpt.testing.sim.deposed import DeposedMarker, StaleClaim
from airflow_ckpt.testing.sim.fallback import SubsumedFallback
from airflow_ckpt.testing.sim.outcome import (
    UNGATED_WRITE,
    Coverage,
    Judged,
    Outcome,
    Violation,
)
from airflow_ckpt.testing.sim.overlap import CompletionOverlap
from airflow_ckpt.testing.sim.overtake import Overtaking
from airflow_ckpt.testing.sim.replay import OVERLAPPED, ReplayedOverlap
from airflow_ckpt.testing.sim.scheduler import Actor, Host, Scheduler
from airflow_ckpt.testing.sim.storage import Faults, SimObjects, SimStorage, Stored, _outcome
from airflow_ckpt.testing.simquery import SimulatedQuery, write_file

JOB = "simjob"
RUN_ID = "dag/run-1/task"
SINK_PREFIX = "_out/simjob"
LAYOUT = JobLayout(JOB)
KEYS = ("a", "b", "c")
#: the lease on the virtual clock (heartbeat < ttl - max write)
TTL_S, HEARTBEAT_S, MAX_WRITE_S = 20.0, 3.0, 4.0
#: a late write is held up to this long: past a successor's takeover
HOLD_S = 40.0
BASE_BELOW_P = 0.5  # the base below the floor (session 18): its share of the floor takeovers
#: the lapsed marker's deposed holder (session 19): its share of the seeds that allow the
#: lapsed marker and did not draw it
DEPOSED_LAPSE_P = 0.5
#: the outage budget (``tolerable-storage-outage`` below)
OUTAGE_BUDGET_S = 30.0
#: ... and its least batch: its oldest offsets, commits and state versions (the query keeps
#: four) are then named by no newer checkpoint
BASE_BATCH = 3
PAUSE_S = (5.0, 40.0)
#: a request's timeout: it never expires on the job's side in a schedule
REQUEST_TIMEOUT_S = 150.0  # past every client's patience (5-120 s): it expires first
RESTART = {"type": "fixed-delay", "fixed-delay.attempts": 4, "fixed-delay.delay": "0 s"}
SKEWS = (0.0, 0.0, 0.5, -0.5, 3600.0, -3600.0)
#: monotonic clock rates: most hosts' run true, some drift far (liveness only)
RATES = (1.0, 1.0, 1.0, 0.5, 2.0)
#: request kinds the control client sends (NAMED: a savepoint of the seed's one
#: :data:`NAMED_SAVEPOINT` id, so a second such request reuses it: a retried task)
SAVEPOINT, STOP, NEWER, NAMED = "savepoint", "stop", "newer-version", "named-savepoint"
NAMED_SAVEPOINT = "nightly"

JOB_OUTPUT = "job-output"
UNCOVERED_COMMIT = "job-uncovered-commit"
CHECKPOINT_CHANGED = "job-checkpoint-changed"
CHECKPOINT_VERIFIES = "job-checkpoint-verifies"
DAMAGED_REFERENCE = "job-damaged-reference"
OLDER_STATE = "job-older-state"
CONTROL = "job-control"
DRIVER_ERROR = "job-driver-error"
CUT_OFF = "job-cut-off"
MARKER_RESURRECTED = "job-marker-resurrected"
RESTORED_UNCOUNTED = "job-restored-uncounted"
RETENTION = "job-retention"
WRITE_AFTER_EXPIRY = "job-write-after-expiry"
UNCOUNTED = "job-uncounted"
RENEWED_DEPOSED = "job-renewed-deposed"
GC_DAMAGE = "job-gc-damage"
SAVEPOINT_KEPT = "job-savepoint-kept"
ONE_HOLDER = "job-one-holder"
FAILED_COUNTED = "job-failed-counted"
INVARIANTS = (JOB_OUTPUT, UNCOVERED_COMMIT, CHECKPOINT_CHANGED, CHECKPOINT_VERIFIES,
              DAMAGED_REFERENCE, OLDER_STATE, CONTROL, DRIVER_ERROR, CUT_OFF,
              MARKER_RESURRECTED, RESTORED_UNCOUNTED, RETENTION, UNGATED_WRITE,
              WRITE_AFTER_EXPIRY, UNCOUNTED, RENEWED_DEPOSED, GC_DAMAGE, SAVEPOINT_KEPT,
              ONE_HOLDER, FAILED_COUNTED)
#: invariants the runtime still breaks (a defect found, not fixed yet): reported by every
#: run, not failed on by the seeds of ``make test`` (see docs/architecture.md)
KNOWN_DEFECTS: frozenset[str] = frozenset()
PLANTS: tuple[str, ...] = ()

#: how a driver life may end without breaking ``job-driver-error`` (the documented
#: refusals are judged apart: see JobWorld.check_refusal)
ALLOWED_ENDINGS = (ConcurrentDriverError, LeaseExpiredError, StorageError,
                   RestartsExhaustedError)


@dataclass(frozen=True, slots=True)
class JobSetup:
    """One seed's system (drawn from the seed)."""

    drivers: int
    together: bool  # all drivers start at once (a double-triggered DAG)
    skews: tuple[float, ...]
    rates: tuple[float, ...]  # each driver host's monotonic clock rate (drift)
    lives: int  # lives per driver process (a retried task)
    sink: str  # "jsonl" | "parquet"
    mode: str
    num_retained: int
    incremental: bool
    batches: int
    per_batch: int
    faults: Faults
    crash_p: float
    pause_p: float
    damages: int  # objects the vandal damages or deletes
    requests: tuple[str, ...]
    explicit_p: float  # chance a late life restores an explicit older checkpoint
    memory_threshold: int  # state.storage.fs.memory-threshold: 0, or small files inline

    @classmethod
    def draw(cls, rng: random.Random) -> JobSetup:
        drivers = rng.choice((2, 2, 3, 4))
        return cls(
            drivers=drivers,
            together=rng.random() < 0.5,
            skews=tuple(rng.choice(SKEWS) for _ in range(drivers)),
            rates=tuple(rng.choice(RATES) for _ in range(drivers)),
            lives=rng.choice((1, 2, 3)),
            sink=rng.choice(("jsonl", "parquet")),
            mode="EXACTLY_ONCE" if rng.random() < 0.7 else "AT_LEAST_ONCE",
            num_retained=rng.choice((1, 2, 3)),
            incremental=rng.random() < 0.75,
            batches=rng.randint(4, 9),
            per_batch=rng.choice((2, 3)),
            faults=rng.choice((Faults(hold_s=HOLD_S), Faults(0.01, 0.02, 0.01, HOLD_S),
                               Faults(0.03, 0.03, 0.02, HOLD_S))),
            crash_p=rng.choice((0.0, 0.003, 0.01)),
            pause_p=rng.choice((0.0, 0.005, 0.02)),
            damages=rng.choice((0, 0, 0, 1, 2)),
            requests=tuple(rng.choice((SAVEPOINT, SAVEPOINT, STOP, NEWER, NAMED, NAMED))
                           for _ in range(rng.randint(0, 3))),
            explicit_p=rng.choice((0.0, 0.3)),
            memory_threshold=rng.choice((0, 0, 20 << 10)),
        )

    @property
    def skewed(self) -> bool:
        return len(set(self.skews)) > 1 or set(self.rates) != {1.0}

    def describe(self) -> str:
        return (f"{self.drivers} drivers ({'together' if self.together else 'staggered'}, "
                f"clocks {list(self.skews)} at rates {list(self.rates)}, {self.lives} lives "
                f"each), {self.sink} sink "
                f"{self.mode}, num-retained {self.num_retained}, "
                f"{'incremental' if self.incremental else 'full'} checkpoints, "
                f"{self.batches} batches of {self.per_batch}, faults {self.faults}, crash p "
                f"{self.crash_p}, pause p {self.pause_p}, {self.damages} damaged object(s), "
                f"requests {list(self.requests)}, explicit restore p {self.explicit_p}, "
                f"memory-threshold {self.memory_threshold} B")


@dataclass(frozen=True, slots=True)
class Retention:
    """The seed's savepoint history and control clean-up (issue 26), drawn from a
    generator of its own: ``savepoint.history.max.count``,
    ``periodic-savepoint.interval`` (0: off), and how long the driver keeps an answered
    control request (virtual seconds), and the requests' timeout: mostly past every
    client's patience (the client expires a request first), sometimes shorter than a
    savepoint takes (the request expires, and may be cleaned up, while the driver still
    acts on it)."""

    max_count: int
    periodic_s: float
    answer_retention_s: float
    request_timeout_s: float = REQUEST_TIMEOUT_S

    @classmethod
    def draw(cls, rng: random.Random) -> Retention:
        max_count, periodic_s = rng.choice((1, 1, 2, 10)), rng.choice((0.0, 3.0, 6.0))
        answer_retention_s = rng.choice((20.0, 60.0, 86400.0))
        timeout_s = rng.choice((REQUEST_TIMEOUT_S, REQUEST_TIMEOUT_S, 8.0))
        if timeout_s < REQUEST_TIMEOUT_S and rng.random() < 0.5:
            answer_retention_s = 0.0  # deleted at the first look past the expiry
        return cls(max_count, periodic_s, answer_retention_s, timeout_s)

    def options(self) -> dict[str, object]:
        return {"savepoint.history.max.count": self.max_count,
                "periodic-savepoint.interval": f"{self.periodic_s:g} s"}


@dataclass(frozen=True, slots=True)
class Contention:
    """How hard one seed's drivers fight over the lease (issue 25 item 1), drawn from a
    generator of its own (seeds without it keep their schedules): drivers started
    together; a claimant pausing at ``lease.before_claim`` (judged the lease free, not
    claimed yet) so that others judge, claim and take over in between; a heartbeat
    thread stalling at ``lease.before_beat`` (a starved thread: its driver writes on);
    a host suspended mid-write, or just before a completion marker
    (``coordinator.before_metadata``; its monotonic clock misses the suspension: its
    gate passes while a successor took over, so the marker lands late)."""

    together: bool
    claim_pause_p: float  # chance per arrival at lease.before_claim
    claim_pause_s: tuple[float, float]
    beat_stall_p: float  # chance per heartbeat
    suspend_p: float  # chance per yield point of a driver
    marker_suspend_p: float  # chance per completion marker: suspended just before it

    @classmethod
    def draw(cls, rng: random.Random) -> Contention:
        if rng.random() < 0.5:
            return cls(False, 0.0, (0.0, 0.0), 0.0, 0.0, 0.0)
        return cls(
            together=rng.random() < 0.7,
            claim_pause_p=rng.choice((0.0, 0.5, 1.0)),
            claim_pause_s=rng.choice(((0.0, 2.0), (0.0, TTL_S), (TTL_S, 3 * TTL_S))),
            beat_stall_p=rng.choice((0.0, 0.0, 0.1, 0.3)),
            suspend_p=rng.choice((0.0, 0.0, 0.002, 0.005)),
            marker_suspend_p=rng.choice((0.0, 0.1, 0.3)),
        )

    def describe(self) -> str:
        return (f"contention: together {self.together}, claim pause p {self.claim_pause_p} "
                f"for {list(self.claim_pause_s)} s, beat stall p {self.beat_stall_p}, "
                f"suspend p {self.suspend_p}, before a marker p {self.marker_suspend_p}")


@dataclass(frozen=True, slots=True)
class Uploads:
    """How one seed's checkpoints upload (issue 25, the GC group), drawn from a
    generator of its own (other seeds keep their schedules): file merging on or off
    (off: every small file is an object of its own, content-addressed, so a replayed
    batch's files meet the keys an unfinished checkpoint uploaded one by one), and the
    chance, per upload unit, that an executor is lost while a checkpoint's async phase
    uploads (``upload.before_file``): the query fails, and the job's restart cancels the
    checkpoint once its files are durable, before its marker. The restarted query
    (same life, same lease epoch) replays the same batches: content-equal files whose
    keys the new store's recovery stashed as unreferenced."""

    file_merging: bool
    lost_in_upload_p: float

    @classmethod
    def draw(cls, rng: random.Random) -> Uploads:
        return cls(rng.random() < 0.5, rng.choice((0.0, 0.0, 0.1, 0.3)))

    def describe(self) -> str:
        return (f"file merging {self.file_merging}, executor lost in an upload p "
                f"{self.lost_in_upload_p}")


@dataclass(frozen=True, slots=True)
class Landings:
    """Which of one seed's driver writes lose their answer while the request stays in
    the network (it lands later, after its caller gave up), drawn from a generator of
    its own (other seeds keep their schedules): a completion marker's PUT (the outage
    wrapper repeats it, retention may subsume the checkpoint, then the first copy lands:
    a late copy of a subsumed marker, seed 129's story) and a delete of answered control
    requests or their answers (the next look runs while it is in flight)."""

    marker_p: float  # chance per completion marker PUT
    marker_hold_s: tuple[float, float]  # how long its first copy stays in the network
    control_delete_p: float  # chance per delete under ``control/``

    @classmethod
    def draw(cls, rng: random.Random) -> Landings:
        return cls(rng.choice((0.0, 0.0, 0.3, 0.6)),
                   rng.choice(((2.0, 10.0), (5.0, HOLD_S))),
                   rng.choice((0.0, 0.0, 0.8, 1.0)))

    def hold(self, rng: random.Random, op: str, key: str) -> float | None:
        """How long the network holds this write (None: it is answered as usual)."""
        if op.startswith("put") and key.endswith("/_metadata") \
                and _checkpoint_of(key) is not None and rng.random() < self.marker_p:
            return rng.uniform(*self.marker_hold_s)
        if op == "delete" and key.startswith(LAYOUT.control_prefix) \
                and rng.random() < self.control_delete_p:
            return rng.uniform(0.0, HOLD_S)
        return None

    def describe(self) -> str:
        return (f"late markers p {self.marker_p} held {list(self.marker_hold_s)} s, late "
                f"control deletes p {self.control_delete_p}")


@dataclass(frozen=True, slots=True)
class ClaimRace:
    """Two claimants of one epoch (issue 25, the lease group), drawn from a generator of
    its own (other seeds keep their schedules): a claimant at ``lease.before_claim``
    (judged the lease free) waits there for another driver to judge it free too, so both
    judge the same state and claim the same epoch (the create-only claim makes one
    lose); and a claim PUT held in the network (it lands after its caller gave up:
    after the winner's takeover, or after a successor deleted the older records, a
    record created again behind the newer ones)."""

    rendezvous: bool  # a claimant waits for a second one before claiming
    late_p: float  # chance per claim PUT: held in the network
    hold_s: tuple[float, float]

    @classmethod
    def draw(cls, rng: random.Random) -> ClaimRace:
        return cls(rng.random() < 0.5, rng.choice((0.0, 0.3, 0.6)),
                   rng.choice(((1.0, 8.0), (5.0, HOLD_S))))

    def hold(self, rng: random.Random, key: str, if_match: str | None) -> float | None:
        """How long the network holds this write: a claim (a lease record's PUT that is
        not a swap of the holder's own version)."""
        if if_match is None and _claim_epoch(key) is not None \
                and rng.random() < self.late_p:
            return rng.uniform(*self.hold_s)
        return None

    def describe(self) -> str:
        return (f"claim race: rendezvous {self.rendezvous}, late claims p {self.late_p} "
                f"held {list(self.hold_s)} s")


class BuriedClaim:
    """Session 15's story (drawn apart, :attr:`JobWorld.buried`): a lease record stored
    again below a final one, a claimant killed before its second look above it, and a
    deposed holder's late marker that only the buried record counts. Its order:

    1. a claimant's create-only claim PUT stays in the network (the claimant meets
       ``OutcomeUnknownError`` and claims again: its repeat creates the record) until
       a successor's sweep deleted that epoch's record; then it lands, creating the
       record again behind the newer ones (its bytes: the claim, not final);
    2. the holder of that epoch is suspended before its first completion marker (its
       monotonic clock stands still: its gate passes when it wakes) until step 4 is
       over;
    3. the first holder of a newer epoch to reach a completion marker (its takeover
       final, the older records swept) is killed there: it leaves the job (unless it
       left before);
    4. the next claimant (its predecessor's record final) is killed between its claim
       and its second look; the suspended holder wakes after that (its marker lands
       after the final record's look: late, and after this claim).

    The next claimant's post-claim look must stop at the final record: the buried one
    counts the late marker (the suspended holder's own id)."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.epoch: int | None = None  # the buried claim's epoch
        self._held: tuple[str, Callable[[], str]] | None = None
        self._stored = False  # the held claim's key was stored since (its repeat)
        self.holder: str | None = None  # host of the holder suspended before its marker
        self.final_killed = False  # the holder above it was killed before a marker
        self.claimant_killed = False

    def wants(self, key: str, if_match: str | None) -> bool:
        """Whether this write is the claim to hold (the seed's first claim PUT); if so,
        it is taken (:meth:`hold` or :meth:`missed` follows)."""
        if self.epoch is not None or if_match is not None or _claim_epoch(key) is None:
            return False
        self.epoch = _claim_epoch(key)
        return True

    def hold(self, key: str, apply: Callable[[], str]) -> None:
        """Hold the claim ``apply`` writes until its epoch's record was swept."""
        self._held = (key, apply)

    def missed(self) -> None:
        """The claim to hold was not sent (a 503): the next claim is held instead."""
        self.epoch = None

    def release(self, objects: dict[str, Stored]) -> None:
        """Told of every change of the store: once the held claim's key was stored and
        is gone (swept), the network delivers the held claim."""
        if self._held is None:
            return
        key, apply = self._held
        if key in objects:
            self._stored = True
        elif self._stored:
            self._held = None
            self.scheduler.defer(f"late put create-only {key} (held past its sweep)",
                                 lambda: _outcome(apply), self.scheduler.now)


class LapsedMarker:
    """Session 18's story (drawn apart, :attr:`JobWorld.lapsed_marker`): a completion
    marker's PUT lands but its answer is lost, at the start of a storage outage of its
    driver (every request of its views refused, 503) that outlasts the lease's validity
    (``ttl - max_write``) but not the outage budget (30 s). The outage wrapper repeats
    the PUT; by then the lease lapsed, so the lease's gate refuses the repetition before
    anything is sent. The marker landed: the driver's claim-then-adopt after the lapse
    (in process) or a successor's counts it, so the checkpoint must not be recorded
    failed (``job-failed-counted``; mutant ``outage-forgets-unknown``). Played once per
    seed (never by the recovery: its storage is faultless)."""

    def __init__(self, seed: int, allowed: bool, deposable: bool = True) -> None:
        rng = random.Random(seed ^ 0x1A95ED)
        self.drawn = rng.random() < 0.3 and allowed
        #: how long the driver's storage stays unreachable after the lost answer: past
        #: the repetition at 17.5 s of the wrapper's backoff (the lease lapses within
        #: 16 s of its last renewal), within the 30 s budget
        self.outage_s = rng.uniform(TTL_S, 26.0)
        self.played = False
        #: driver storage tag -> when (scheduler time) its outage ends
        self.down: dict[str, float] = {}
        #: session 19, the deposed holder (drawn apart, ``seed ^ 0xD3A1B3``, on a share of
        #: the seeds that allow the story, did not draw it and are ``deposable``; job seed
        #: 423723's story):
        #: the holder's host is suspended before its first marker long enough for
        #: another driver to claim, and each claimant meanwhile is killed right after its
        #: claim (nobody adopts the marker); the marker's PUT, sent when the host wakes
        #: (its monotonic clock stood still: its gate passes), stays in the network until
        #: the holder's heartbeat learnt of the takeover, then lands with its answer
        #: lost; the repetition is refused (another driver: the marker is abandoned, the
        #: coordinator's decision is to stop), and the outage (the driver's view of the
        #: sink's table too) outlasts the budget on the holder's own clock, so its
        #: query's next batch fails on a spent outage. The driver must stop on the
        #: decision, never restart in process (``job-older-state``; mutant
        #: ``restart-ignores-decision``)
        deposed_rng = random.Random(seed ^ 0xD3A1B3)
        self.deposed = allowed and deposable and not self.drawn \
            and deposed_rng.random() < DEPOSED_LAPSE_P
        self.on = self.drawn or self.deposed
        #: the deposed holder's outage on its own clock: past the budget (spent before
        #: its query's next batch reads the table), and past it by less than the
        #: budget the failure's recording gets afresh
        self.deposed_outage_s = deposed_rng.uniform(OUTAGE_BUDGET_S + 10.0,
                                                    OUTAGE_BUDGET_S + 25.0)
        #: how long the holder's host is suspended (true seconds): for the lease to
        #: look dead and another driver to claim (its judgement takes a ttl)
        self.suspend_s = deposed_rng.uniform(5 * TTL_S, 10 * TTL_S)
        self.holder: str | None = None  # the deposed holder's host, once suspended
        self.missed = False  # the holder's life ended without sending the marker
        self.holder_job: object | None = None  # the deposed holder's life (its job)
        self.woke = False  # the deposed holder's host woke
        #: called before the deposed holder's marker lands (the world's hold)
        self.before_landing: Callable[[], None] | None = None

    def wants(self, key: str, create_only: bool, tag: str) -> bool:
        return (self.on and not self.played and create_only
                and key.endswith("/_metadata") and _checkpoint_of(key) is not None
                and (not self.deposed or (self.woke and not self.missed
                                          and tag == self.holder)))

    def describe(self) -> str:
        deposed = f", deposed holder (outage {self.deposed_outage_s:.1f} s on its clock)" \
            if self.deposed else ""
        return f"lapsed marker {self.drawn} (outage {self.outage_s:.1f} s{deposed})"


class DriverHostView(SimStorage):
    """A view of the storage from one driver's host: unreachable while the lapsed
    marker's outage of that driver lasts. The driver's own storage (``driver`` empty: its
    tag), and, with the lapsed marker's deposed holder, the driver's view of the sink's
    table bucket (not its executors': one object store's endpoint, as seen from the
    driver's host)."""

    #: the seed's :class:`LapsedMarker` (None: not drawn)
    lapsed: LapsedMarker | None = None
    driver = ""  # the driver's storage tag, whose outage this view shares ("": its own)

    def _enter(self, op: str, key: str) -> None:
        lapsed, driver = self.lapsed, self.driver or self.tag
        if lapsed is not None and driver in lapsed.down \
                and self.scheduler.current() is not None:
            if self.scheduler.now < lapsed.down[driver]:
                self.scheduler.yield_point(f"{op} {key}")
                self._log(op, key, "503 (the lapsed marker's outage)")
                raise EndpointUnreachableError(f"sim: {op} {key}: 503 (outage)")
            del lapsed.down[driver]
        super()._enter(op, key)


class DriverStorage(DriverHostView):
    """A driver's view whose writes :class:`Landings` and :class:`ClaimRace` pick land
    late: the caller meets ``OutcomeUnknownError`` and the request is applied (its
    conditions judged then) when the network delivers it."""

    landings: Landings
    rng: random.Random
    race: ClaimRace
    race_rng: random.Random
    #: told of every write this view issues (op, keys), before it is sent
    observe: Callable[[str, list[str]], None] | None = None
    #: the seed's :class:`BuriedClaim` (None: the story is not drawn)
    buried: BuriedClaim | None = None
    #: told of every GET this view made (its key), once it returned
    after_get: Callable[[str], None] | None = None
    #: the overtaking checkpoint's held completion markers (None: not such a marker)
    overtaken: Callable[[str], float | None] | None = None

    def checked_view(self, check: Callable[[str, str], None]) -> SimStorage:
        view = DriverStorage(self.store, self.scheduler, faults=self.faults, tag=self.tag)
        view.landings, view.rng, view.checked = self.landings, self.rng, check
        view.race, view.race_rng, view.buried = self.race, self.race_rng, self.buried
        view.lapsed = self.lapsed
        view.overtaken = self.overtaken
        return view

    def put_bytes(self, key: str, data: bytes, *, create_only: bool = False,
                  if_match: str | None = None) -> str:
        op = "put" + (" create-only" if create_only else "") + (" if-match" if if_match else "")
        if self.observe is not None:
            self.observe("put", [key])
        lapsed = self.lapsed
        if lapsed is not None and self.scheduler.current() is not None \
                and lapsed.wants(key, create_only, self.tag):
            if lapsed.before_landing is not None:
                lapsed.before_landing()
            super().put_bytes(key, data, create_only=create_only, if_match=if_match)
            lapsed.played = True
            lapsed.down[self.tag] = self.scheduler.now + lapsed.outage_s
            self._log(op, key, f"applied, answer lost; unreachable for {lapsed.outage_s:.1f} s")
            raise OutcomeUnknownError(f"sim: {op} {key}: answer lost (an outage begins)")
        hold: float | None = None
        if self.buried is not None and self.buried.wants(key, if_match) \
                and self.scheduler.current() is not None:
            hold = -1.0  # until its epoch's record is swept (BuriedClaim.release)
        hold = self.race.hold(self.race_rng, key, if_match) if hold is None else hold
        hold = self.landings.hold(self.rng, op, key) if hold is None else hold
        if self.overtaken is not None and op == "put create-only" \
                and _checkpoint_of(key) is not None:
            held = self.overtaken(key)  # after the draws above: they keep their order
            hold = hold if held is None else held
        if hold is None or self.scheduler.current() is None:
            return super().put_bytes(key, data, create_only=create_only, if_match=if_match)
        return self._late(op, key, hold, lambda: self.store.put(
            key, data, self.scheduler.now, create_only=create_only, if_match=if_match,
            writer=self.tag))

    def get_bytes(self, key: str) -> bytes:
        data = super().get_bytes(key)
        if self.after_get is not None:
            self.after_get(key)
        return data

    def delete_many(self, keys: Iterable[str]) -> None:
        keys = list(keys)
        if self.observe is not None:
            self.observe("delete", keys)
        hold = self.landings.hold(self.rng, "delete", keys[0]) if keys else None
        if hold is None or self.scheduler.current() is None:
            super().delete_many(keys)
            return

        def apply() -> str:
            self.store.delete(keys)
            return "deleted"
        self._late("delete", keys[0], hold, apply)

    def _late(self, op: str, key: str, hold: float, apply: Callable[[], str]) -> str:
        if self.checked is not None:
            self.checked(op, key)
        try:
            self._enter(op, key)
        except EndpointUnreachableError:
            if hold < 0 and self.buried is not None:
                self.buried.missed()
            raise
        applied = self._tracked(op, key, apply)
        if hold < 0 and self.buried is not None:
            self.buried.hold(key, applied)
            self._log(op, key, "timeout (held in the network until its record is swept)")
        else:
            self.scheduler.defer(f"late {op} {key}", lambda: _outcome(applied),
                                 self.scheduler.now + hold)
            self._log(op, key, f"timeout (held {hold:.1f} s in the network)")
        raise OutcomeUnknownError(f"sim: {op} {key}: no answer (it may land later)")


class SimLock:
    """A lock for actors: waiting for it is a yield point (a thread blocked on a real
    lock would keep the baton)."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.held = False

    def __enter__(self) -> SimLock:
        while self.held:
            self.scheduler.sleep(0.01)
        self.held = True
        return self

    def __exit__(self, *exc: object) -> None:
        self.held = False


class SimCondition:
    """The lease's ``_beating`` condition for actors: ``wait_for`` sleeps on the
    virtual clock until the predicate holds or the timeout passed."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler

    def __enter__(self) -> SimCondition:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def wait_for(self, predicate: Callable[[], bool], timeout: float | None = None) -> bool:
        deadline = self.scheduler.now + (timeout or 0.0)
        while not predicate() and self.scheduler.now < deadline:
            self.scheduler.sleep(min(0.1, deadline - self.scheduler.now))
        return predicate()

    def notify_all(self) -> None:
        return None


class SimThread:
    """An actor as the lease's ``_thread``: ``release`` joins it (waits on the virtual
    clock for its beat in flight to end) before it lets go of the record."""

    def __init__(self, scheduler: Scheduler, actor: Actor) -> None:
        self.scheduler, self.actor = scheduler, actor

    def join(self) -> None:
        while self.actor.alive:
            self.scheduler.sleep(0.05)


class JobQuery(SimulatedQuery):
    """The ground truth's query: batch ``b`` reads ``per_batch`` records, keeps the
    running sum per key in two state partitions and emits ``(i, key, running)``."""

    spark: JobSpark  # set by JobSpark.query

    def __init__(self, world: JobWorld, workdir: Path, fn: simquery.BatchFn,
                 on_batch: Callable[[int], None]) -> None:
        super().__init__(workdir, fn, on_batch)
        self.world = world
        self.sums: dict[str, int] = {}
        if not (workdir / "metadata").exists():
            write_file(workdir / "metadata", json.dumps({"id": "simjob-query"}))
            write_file(workdir / "state" / "0" / "_metadata" / "metadata",
                       'v1\n{"stateStoreInfo":[{"storeName":"default","numPartitions":2}]}')

    def _next(self) -> int:
        done = [int(p.name) for p in (self.workdir / "commits").glob("*") if p.name.isdigit()]
        return max(done, default=-1) + 1

    def _plan(self) -> int | None:
        batch = self._next()
        return batch if batch < self.world.setup.batches else None

    def _input(self, batch: int) -> list[dict[str, Any]]:
        start, end = self.world.span(batch)
        write_file(self.workdir / "offsets" / str(batch),
                   'v1\n{"conf":{"spark.sql.shuffle.partitions":"2"}}\n'
                   + json.dumps({"start": start, "end": end}))
        self.sums = {}
        if batch > 0:
            for part in (0, 1):
                path = self.workdir / "state" / "0" / str(part) / f"{batch}.delta"
                if not path.exists():  # restored state is missing: fail, never guess
                    raise RuntimeError(f"state version {batch} of partition {part} is missing")
                self.sums.update(json.loads(path.read_text()))
        rows = []
        for i in range(start, end):
            key, value = self.world.records[i]
            self.sums[key] = self.sums.get(key, 0) + value
            rows.append({"i": i, "key": key, "running": self.sums[key]})
        return rows

    def _after_batch(self, batch: int) -> None:
        """A lost executor fails the query after its sink ran (Spark's task failure): the
        job restarts the query in the same life (``restore=latest`` above its floor),
        replaying batches whose files an unfinished checkpoint may have uploaded."""
        world = self.world
        if world.recovering:
            return
        struck, self.spark.strike = self.spark.strike, None
        if (struck is not None and world.strike_floor(self.spark.job, struck)) \
                or world.fault_rng.random() < world.query_fail_p:
            world.coverage["query-failed"] += 1
            raise RuntimeError(f"executor lost in batch {batch} (simulated)")

    def _finish(self, batch: int) -> None:
        for part in (0, 1):
            mine = {k: v for k, v in self.sums.items() if KEYS.index(k) % 2 == part}
            write_file(self.workdir / "state" / "0" / str(part) / f"{batch + 1}.delta",
                       json.dumps(mine, sort_keys=True))
        write_file(self.workdir / "commits" / str(batch), "v1\n{}")
        for log_dir in ("offsets", "commits"):
            for old in (self.workdir / log_dir).glob("*"):
                if old.name.isdigit() and int(old.name) < batch - 3:
                    old.unlink()
        for part in (0, 1):
            for old in (self.workdir / "state" / "0" / str(part)).glob("*.delta"):
                if int(old.name.split(".")[0]) < batch - 3:
                    old.unlink()


class JobSpark(simquery.SimulatedSpark):
    """A session whose query is :class:`JobQuery`; each batch first takes a while of
    virtual time."""

    def __init__(self, world: JobWorld) -> None:
        super().__init__(lambda batch: world.scheduler.sleep(world.batch_time()))
        self.world = world
        self.running: JobQuery | None = None  # the query started last
        self.strike: int | None = None  # a floor strike in the next batch: its checkpoint
        self.job: SimJob  # set by make_job

    def query(self, workdir: Path, fn: simquery.BatchFn) -> JobQuery:
        self.running = JobQuery(self.world, workdir, fn, self.on_batch)
        self.running.spark = self
        return self.running


class SimParquetSink(ParquetSink):
    """The real ``ParquetSink`` over a simulated table bucket; its executor side (the
    tasks writing staged files, returning name, size and rows) is simulated: 1-2 files
    of JSON lines per attempt, written through the executors' own (unfenced) view."""

    def __init__(self, table: CheckpointStorage, executors: CheckpointStorage,
                 ids: Callable[[], Any], scratch: Path) -> None:
        super().__init__(scratch.as_uri(), max_workers=1)
        self.storage = table
        self.transactions = SinkTransactions(table, name=repr(self))
        self.executors = executors
        self.ids = ids

    def stage(self, df: Any, batch_id: int) -> None:
        rows = [row.asDict() for row in df.collect()]
        attempt = self.ids().hex[:16]
        files = []
        for n, part in enumerate((rows[: len(rows) // 2 + 1], rows[len(rows) // 2 + 1:])):
            if not part:
                continue
            name = f"part-{n:05d}.parquet"
            body = "".join(json.dumps(r, sort_keys=True) + "\n" for r in part).encode()
            self.executors.put_bytes(f"{self._staging(batch_id, attempt)}{name}", body)
            files.append({"name": name, "size": len(body), "rows": len(part)})
        self._record_files(batch_id, attempt, files)


class SimJob(CheckpointedJob):
    """The real job, telling the world what each restore chose (observation only)."""

    world: JobWorld
    life: str
    restores = 0
    alive = True  # its ``run`` has not returned
    sink: TwoPhaseCommitSink | None = None  # the sink its query commits to

    def _run_supervised(self, build: Any) -> Any:
        self.world.before_run()
        return super()._run_supervised(build)

    def _start_coordinator(self, restored: RestoreResult, *, initial: bool = False) -> Any:
        target = self.restore_target if self.restores == 0 else "latest"
        self.restores += 1
        self.world.on_restored(self, restored, target)
        return super()._start_coordinator(restored, initial=initial)


class JobWorld(Judged):
    """The job world of one seed (see the module doc)."""

    job, ttl_s, heartbeat_s = JOB, TTL_S, HEARTBEAT_S  # for the story modules

    def __init__(self, seed: int, max_steps: int = 30000) -> None:
        self.scheduler = Scheduler(seed, max_steps=max_steps)
        self.rng = self.scheduler.rng
        self.setup = JobSetup.draw(self.rng)
        self.contention_rng = random.Random(seed ^ 0xC1A1)
        self.contention = Contention.draw(self.contention_rng)
        #: query failures (a lost executor), drawn apart so other seeds keep their schedules
        self.fault_rng = random.Random(seed ^ 0x9A11)
        self.query_fail_p = self.fault_rng.choice((0.0, 0.0, 0.1, 0.25))
        self.whole_checkpoint_p = self.fault_rng.choice((0.0, 0.5))
        self.retention = Retention.draw(random.Random(seed ^ 0x5A7E))
        self.uploads_rng = random.Random(seed ^ 0x6C0C)
        self.uploads = Uploads.draw(self.uploads_rng)
        self.landings_rng = random.Random(seed ^ 0x1A7E)
        self.landings = Landings.draw(self.landings_rng)
        #: the vandal strikes a run's first checkpoint (see strike_floor), and a late life
        #: restores an explicit target more often (drawn apart: other seeds keep theirs)
        self.strike_rng = random.Random(seed ^ 0xF100)
        #: a claimant killed between its claim and its second look (drawn apart)
        self.claim_crash_rng = random.Random(seed ^ 0xC1A3)
        self.claim_crash_p = self.claim_crash_rng.choice((0.0, 0.0, 0.3, 0.6))
        #: a heartbeat thread starved until a successor claims (drawn apart)
        self.starve_rng = random.Random(seed ^ 0xBEA7)
        self.starve_p = self.starve_rng.choice((0.0, 0.0, 0.1, 0.3))
        #: a new holder's run waiting for a suspended holder to wake (drawn apart)
        self.slow_start_rng = random.Random(seed ^ 0x5107)
        self.slow_start_p = self.slow_start_rng.choice((0.0, 0.5, 1.0))
        #: a request for the named savepoint sent again by a retried task (drawn apart)
        self.retry_rng = random.Random(seed ^ 0x2E72)
        self.retry_named_p = self.retry_rng.choice((0.0, 0.5, 1.0))
        #: two claimants of one epoch, claim PUTs landing late (drawn apart)
        self.claim_race_rng = random.Random(seed ^ 0xC1A5)
        self.claim_race = ClaimRace.draw(self.claim_race_rng)
        self._rendezvous: set[str] = set()  # claimants waiting at lease.before_claim
        #: (life, request id) of the requests whose request object a life deleted
        self._forgotten: set[tuple[str, str]] = set()
        #: host -> when it wakes from a suspension before a completion marker (true time)
        self.waking: dict[str, float] = {}
        self._waited: set[str] = set()  # claimants that waited for a waking holder
        self.floor_strike = self.strike_rng.random() < 0.3
        self._struck: set[str] = set()  # lives whose first checkpoint was struck
        #: a later run restores an older checkpoint on purpose while the older run's
        #: newer ones are retained (num-retained >= 2), and its first checkpoint is
        #: struck: what a fallback below the floor would resume (drawn apart)
        self.rerun_rng = random.Random(seed ^ 0xF101)
        self.older_run = self.rerun_rng.random() < 0.4
        if self.older_run:
            self.setup = replace(self.setup, num_retained=max(2, self.setup.num_retained),
                                 lives=max(2, self.setup.lives))
        #: a requester that gives up on its savepoint request soon (a short Airflow task
        #: timeout: the request's own timeout) and is retried at once, its retry's
        #: doorbell making the driver look (and clean up answered requests, the job
        #: keeping none past its expiry) while the first request's savepoint is still in
        #: flight (drawn apart)
        self.impatience_rng = random.Random(seed ^ 0x1A7A)
        self.impatient = self.impatience_rng.random() < 0.4
        if self.impatient:
            self.retention = replace(self.retention, answer_retention_s=0.0)
            if not {SAVEPOINT, NAMED} & set(self.setup.requests):
                self.setup = replace(self.setup, requests=(*self.setup.requests, SAVEPOINT))
        #: the operator's wrong cleanup: once the drivers are gone, every object of the
        #: newest checkpoint is damaged, one object per file (no file merging, no
        #: inline files), incremental, an older checkpoint retained: the recovery falls
        #: back past several damaged keys and its replay meets them again by content
        #: (drawn apart)
        self.cleanup_rng = random.Random(seed ^ 0xC1EA)
        self.cleanup = self.cleanup_rng.random() < 0.3
        if self.cleanup:
            self.setup = replace(self.setup, incremental=True, memory_threshold=0,
                                 num_retained=max(2, self.setup.num_retained))
            self.uploads = replace(self.uploads, file_merging=False)
        #: job seed 304536's story made common (session 14's code found it once in
        #: 22,000 schedules): num-retained 1, a holder suspended before its completion
        #: marker, its successor killed between its claim and its second look (its
        #: record adopts the checkpoint below, not the marker landing after the claim),
        #: so the next claimant adopts both: one below the other's retention floor, never
        #: subsumed (its writer is deposed); then the vandal strikes the checkpoints at
        #: or above the floor (:meth:`strike_retention_floor`). Not with the older run
        #: or the wrong cleanup (num-retained >= 2; drawn apart)
        self.floor_takeover = not (self.older_run or self.cleanup) \
            and random.Random(seed ^ 0xF102).random() < 0.25
        if self.floor_takeover:
            self.setup = replace(self.setup, num_retained=1)
            self.contention = replace(self.contention, marker_suspend_p=max(
                self.contention.marker_suspend_p, 0.5))
        #: session 18's story, the base below the floor (job seed 413159; drawn apart,
        #: ``seed ^ 0xBA5E``, on a share of the floor takeover's seeds): the checkpoint
        #: the takeover leaves below the newest marker's retention floor, its marker
        #: stored and counted, is no vandal's target but the restore of the next run
        #: that can take it (:meth:`before_run`: an operator's explicit target), with
        #: incremental checkpoints and memory-threshold 0 (its files are shared, some
        #: named by no retained checkpoint); that run's own checkpoint is collected
        #: while the base's marker may still be stored: its files must stay until its
        #: marker is deleted (the mutant ``base-files-unpinned``:
        #: ``job-checkpoint-verifies``)
        self.base_below = self.floor_takeover \
            and random.Random(seed ^ 0xBA5E).random() < BASE_BELOW_P
        if self.base_below:
            self.setup = replace(self.setup, incremental=True, memory_threshold=0,
                                 batches=max(self.setup.batches, 8))
        self._base_runs: set[Actor] = set()  # drivers whose run restored the base
        #: session 15's story (:class:`BuriedClaim`): an older lease record stored again
        #: below a final one, the next claimant killed before its second look, and a
        #: late marker only the buried record counts (session 14's late claims made each
        #: step, never all four in one schedule). Four drivers at least, three lives
        #: each, no random crashes nor storage faults (the story kills two drivers and
        #: suspends one; the fourth judges); not with the floor takeover
        #: (its own claimant killed, num-retained 1; drawn apart)
        self.buried = BuriedClaim(self.scheduler) if not self.floor_takeover \
            and random.Random(seed ^ 0xB03D).random() < 0.33 else None
        if self.buried is not None:
            extra = max(4 - self.setup.drivers, 0)  # the suspended, two killed, the judge
            self.setup = replace(self.setup, drivers=self.setup.drivers + extra, lives=3,
                                 skews=(*self.setup.skews, *(0.0,) * extra),
                                 rates=(*self.setup.rates, *(1.0,) * extra), crash_p=0.0,
                                 faults=Faults(hold_s=HOLD_S))
            self.claim_crash_p = 0.0  # the story kills its own claimant
        #: an executor lost at a checkpoint's last upload unit, the restarted run's
        #: completions overlapping the next checkpoint, which meets the lost one's
        #: files by content (:mod:`~airflow_ckpt.testing.sim.replay`; drawn apart). Not
        #: with the buried claim (its schedule is the story of job seed 14)
        self.replay = ReplayedOverlap(seed, self.buried is None)
        if self.replay.on:
            self.setup = replace(self.setup, incremental=True, memory_threshold=0)
            self.uploads = replace(self.uploads, file_merging=False)
        #: session 16's lease stories (:mod:`~airflow_ckpt.testing.sim.deposed`): a
        #: holder's marker and a claimant's claim made after a successor's takeover
        #: (drawn apart; not with the buried claim, which plays its own markers). Their
        #: seeds retry each driver three times (a successor is there to take over),
        #: with no random crashes, pauses nor storage faults (the stories suspend and
        #: depose on their own; a holder must get to complete checkpoints first); the
        #: deposed marker's seeds keep one checkpoint (its holder's next completion
        #: subsumes: not with the older run or the wrong cleanup)
        self.deposed_marker = DeposedMarker(seed, self)
        self.stale_claim = StaleClaim(seed, self)
        if self.buried is not None:
            self.deposed_marker.drawn = self.stale_claim.drawn = False
        if self.older_run or self.cleanup:
            self.deposed_marker.drawn = False
        if self.deposed_marker.drawn or self.stale_claim.drawn:
            self.setup = replace(self.setup, lives=3, crash_p=0.0, pause_p=0.0,
                                 faults=Faults(hold_s=HOLD_S))
        if self.deposed_marker.drawn:
            self.setup = replace(self.setup, num_retained=1)
        #: session 17's story (:mod:`~airflow_ckpt.testing.sim.fallback`, drawn apart): a
        #: successor falling back to the checkpoint a deposed holder's collection
        #: subsumes while the completion overlap's window b is open. Every completion
        #: overlapped; full checkpoints (every file of the subsumed one is its own,
        #: stashed) of files of their own (no inline ones), 9 batches, one checkpoint
        #: kept, three lives per driver, no explicit targets, random crashes, pauses,
        #: storage faults, lost executors, late markers nor random vandal strikes (the
        #: story deposes and strikes on its own). Not with the stories that play their
        #: own takeovers or need incremental checkpoints, nor with the older run: its
        #: restores are explicit (older checkpoints, on purpose) 4 times in 5, so the
        #: story seldom gets the ``latest`` successor it waits for (no successor's read
        #: in the 22 older-run seeds it drew in job seeds 0-199 and 370000-370299; 4
        #: in its 16 others)
        self.fallback = SubsumedFallback(seed, self, GC_DAMAGE, allowed=not (
            self.buried is not None or self.replay.on or self.deposed_marker.drawn
            or self.stale_claim.drawn or self.floor_takeover or self.cleanup
            or self.older_run))
        #: session 18's story (:class:`LapsedMarker`, drawn apart): not with the stories
        #: that play their own markers and takeovers; its deposed holder (session 19) not
        #: with the replayed overlap either (its executors lost at an upload fail the
        #: query on their own, and its seeds pin that story)
        self.lapsed_marker = LapsedMarker(seed, allowed=not (
            self.buried is not None or self.deposed_marker.drawn or self.stale_claim.drawn
            or self.fallback.drawn), deposable=not self.replay.on)
        if self.lapsed_marker.deposed:
            # a successor is there to claim (three lives per driver), no random crashes,
            # pauses nor storage faults: the story deposes and fails on its own; the
            # Parquet sink, whose driver reads the table before its first write of a
            # batch (the JSON lines sink writes first: the gate stops it at once)
            self.lapsed_marker.before_landing = self._deposed_marker_lands
            self.setup = replace(self.setup, lives=3, crash_p=0.0, pause_p=0.0,
                                 faults=Faults(hold_s=HOLD_S), sink="parquet")
        if self.fallback.drawn:
            self.setup = replace(self.setup, lives=3, crash_p=0.0, pause_p=0.0, damages=0,
                                 faults=Faults(hold_s=HOLD_S), memory_threshold=0,
                                 incremental=False, explicit_p=0.0, batches=9,
                                 num_retained=1)
            self.landings = replace(self.landings, marker_p=0.0)
            self.query_fail_p = 0.0
            self.uploads = replace(self.uploads, lost_in_upload_p=0.0)
        self._retention_struck = False
        self.violations: list[Violation] = []
        self.objects = SimObjects()
        self.table = SimObjects()  # the Parquet table's bucket
        self.oracle = SimStorage(self.objects, self.scheduler, tag="oracle", oracle=True)
        self.table_oracle = SimStorage(self.table, self.scheduler, tag="oracle", oracle=True)
        self.records = [(self.rng.choice(KEYS), self.rng.randint(1, 9))
                        for _ in range(self.setup.batches * self.setup.per_batch)]
        running: dict[str, int] = {}
        self.expected: list[int] = []
        for key, value in self.records:
            running[key] = running.get(key, 0) + value
            self.expected.append(running[key])
        self.config = {
            "execution.checkpointing.interval": "1 s",
            "execution.checkpointing.min-pause": "0 ms",
            "execution.checkpointing.num-retained": self.setup.num_retained,
            "execution.checkpointing.incremental": self.setup.incremental,
            "state.storage.fs.memory-threshold": self.setup.memory_threshold,
            "execution.checkpointing.mode": self.setup.mode,
            "execution.checkpointing.tolerable-failed-checkpoints": 1000,
            "execution.checkpointing.tolerable-storage-outage": "30 s",
            "execution.checkpointing.file-merging.enabled": self.uploads.file_merging,
            **self.retention.options(),
        }
        if self.replay.on:  # batches often run past the interval: a lost one's barrier
            self.config["execution.checkpointing.interval"] = self.replay.interval
        self.tmp = Path(tempfile.mkdtemp(prefix="simjob-", dir=_scratch_dir()))
        self.coverage: Counter[str] = Counter()
        #: key -> ETag after the vandal's damage (None: deleted)
        self.vandalized: dict[str, str | None] = {}
        self.jobs: list[SimJob] = []
        self.endings: list[tuple[str, BaseException | str]] = []
        self._version = -1
        self._markers: dict[str, bytes] = {}  # _metadata key -> its first bytes
        self._deleted_markers: set[str] = set()
        self._subsumed_markers: set[str] = set()  # deleted, not by the vandal
        #: markers a late write created again after their deletion (not the vandal's)
        self._late_copies: set[str] = set()
        self._referenced: dict[str, dict[str, str]] = {}  # marker -> key -> first ETag
        self._manifests: dict[tuple[str, str], Manifest | None] = {}
        self._results: dict[str, bytes] = {}  # control result key -> its first bytes
        self._orphans: set[str] = set()  # answers written after their request was deleted
        self._covered = -1  # the newest batch a completed checkpoint or savepoint covers
        self._present_before: set[str] = set()
        self._counted_before: set[int] = set()
        #: lease epoch -> checkpoint ids whose markers were stored when its record appeared
        self._markers_at_claim: dict[int, frozenset[int]] = {}
        #: markers that count (at the last :meth:`counted`) only by a record older than
        #: the newest, which is not ``adoption_final`` yet
        self._counted_by_older: set[int] = set()
        self._ever_counted: set[int] = set()  # ids that counted at some step
        #: checkpoint id -> the retention floor it records, judged by the world when its
        #: marker first landed (lowest, highest it may be): see :meth:`_note_floor`
        self._floors: dict[int, tuple[int, int]] = {}
        self._renewed: dict[int, float] = {}  # id(lease) -> when its claim or beat returned
        self._late: set[int] = set()  # checkpoint ids whose markers landed late
        self._settled_epoch = 0  # the newest epoch whose holder finished its takeover
        self._epochs_seen: set[int] = set()
        #: savepoint ``_metadata`` key -> (checkpoint id, in the history) when first seen
        self._savepoints: dict[str, tuple[int, bool]] = {}
        self._restored_marks: set[str] = set()  # savepoint directories ever marked
        self._restored_savepoints: set[str] = set()  # savepoints restored from
        #: (life, its epoch, markers seen by then, damaged keys) per restore: the keys
        #: the restore found (its own word) and those it must have found (ground truth),
        #: each with when the version found was written (a key written again since,
        #: even damaged again to the same bytes, is not that damage)
        self._damage_learnt: list[tuple[str, int | None, frozenset[str],
                                        dict[str, float | None]]] = []
        self._running: dict[Actor, SimJob] = {}  # a driver actor -> its life's job
        self._life_epochs: dict[str, int] = {}  # life -> its lease epoch when it restored
        #: life -> the checkpoint its latest restore resumed (pinned until it has its own)
        self._restored_from: dict[str, int] = {}
        self._marker_epochs: dict[int, int | None] = {}  # checkpoint id -> writer's epoch
        #: life -> checkpoint ids seen when its run started from an explicit target or
        #: from scratch (its floor: its own first checkpoint, the first id not among them)
        self._run_starts: dict[str, set[int]] = {}
        self._explicit_runs: set[str] = set()  # lives whose run started from a target
        self.scheduler.observers.append(self.check)
        #: the next checkpoint's async phase overlapping a completion (drawn apart)
        self.overlap = CompletionOverlap(seed, self.scheduler, self._coordinator_of,
                                         lambda: SimLock(self.scheduler), self.coverage)
        #: ``max-concurrent-checkpoints`` 2 on some seeds, and the next checkpoint's whole
        #: async phase running while the previous one uploads (drawn apart). Not with
        #: the buried claim (job seed 14's story, pinned by a test)
        self.overtaking = Overtaking(seed, self.scheduler, self.overlap, self._coordinator_of,
                                     self.coverage, allowed=self.buried is None)
        if self.overtaking.on:
            self.config["execution.checkpointing.max-concurrent-checkpoints"] = \
                self.overtaking.max_concurrent
        if self.fallback.drawn:
            self.overlap.p = 1.0

    # ------------------------------------------------------------------ ground truth

    def span(self, batch: int) -> tuple[int, int]:
        return batch * self.setup.per_batch, (batch + 1) * self.setup.per_batch

    def manifest(self, key: str, store: SimObjects | None = None) -> Manifest | None:
        stored = (store or self.objects).objects.get(key)
        if stored is None:
            return None
        cached = (key, stored.etag)
        if cached not in self._manifests:
            try:
                self._manifests[cached] = parse_manifest(stored.data, where=key)
            except MetadataError:
                self._manifests[cached] = None
        return self._manifests[cached]

    def counting(self) -> list[int]:
        """Ids of the checkpoints that count under the current lease (with a marker)."""
        ids = sorted({n for key in self.objects.objects
                      if (n := _checkpoint_of(key)) is not None})
        if not ids:
            return []
        return valid_checkpoint_ids(ids, read_lease(self.oracle, JOB))

    def counted(self) -> set[int]:
        """Ids of the checkpoints with a marker that count by the design's rule, judged
        here from the lease records (not by the runtime's ``valid_checkpoint_ids``,
        which a bug may change): adopted at the takeover, or the holder's own (id >= its
        ``first_id``); everything counts before adoption existed (no record, or one
        without it). While the newest record is not ``adoption_final`` (its claimant's
        post-claim look is not over), a marker that landed before its claim also counts
        if an older record still stored counts it, down to the first final one: the
        look adopts it (the old holder may have confirmed it and acted on it, seed
        301107: subsumed the checkpoint below it), and so does the next claimant's if
        this one dies first. A *late* marker never counts: one of an older epoch that
        first landed after a newer holder's takeover was over (its adoption final),
        whatever a record says."""
        ids = {n for key in self.objects.objects if (n := _checkpoint_of(key)) is not None
               and key not in self._subsumed_markers}  # subsumed once: never again
        records = self._judged_records() if ids else []
        self._counted_by_older = set()
        if not records:
            return ids - self._late
        counts = {n for n in ids if _counts_by(records[0], n)}
        landed = self._markers_at_claim.get(records[0].epoch, frozenset()) & ids
        self._counted_by_older = {n for n in landed - counts
                                  for older in records[1:] if _counts_by(older, n)}
        return (counts | self._counted_by_older) - self._late

    def _judged_records(self) -> list[LeaseRecord]:
        """The newest lease record, and while the one taken last is not
        ``adoption_final``, the next older one still stored (newest first)."""
        records: list[LeaseRecord] = []
        for epoch in reversed(lease_epochs(self.oracle, JOB)):
            record = read_epoch(self.oracle, JOB, epoch)
            if record is None and not records:
                return []  # the newest unreadable: nothing is judged by it
            if record is not None:
                records.append(record)
                if record.adoption_final:
                    break
        return records

    def _note_claims(self, new: set[str]) -> None:
        """For each lease record that appeared in this step: the checkpoint ids whose
        markers were stored at its claim (:meth:`counted`)."""
        for key in new:
            if key.startswith(LAYOUT.lease_prefix) and key.endswith(".json"):
                markers = frozenset(n for k in self.objects.objects
                                    if (n := _checkpoint_of(k)) is not None)
                self._markers_at_claim[int(key[len(LAYOUT.lease_prefix):-5])] = markers

    def damaged(self, manifest: Manifest, marker: str) -> bool:
        """Whether the vandal touched the marker or an object it references."""
        return marker in self.vandalized or any(
            f"{JOB}/{f.key}" in self.vandalized for f in _objects_of(manifest))

    # ------------------------------------------------------------------ invariants

    def check(self) -> None:
        """The per-step invariants (see the module doc)."""
        if self.objects.version + self.table.version == self._version:
            return
        self._version = self.objects.version + self.table.version
        objects = self.objects.objects
        present = set(objects)
        gone = self._present_before - present
        if any(k.startswith(f"{JOB}/shared/") and k not in self.vandalized for k in gone):
            self.coverage["gc-shared-files"] += 1
        if any(_checkpoint_of(k) is not None and k not in self.vandalized for k in gone):
            self.coverage["subsumed"] += 1
        if any(k.startswith(LAYOUT.control_prefix) for k in gone):
            self.coverage["control-forgotten"] += 1  # answered requests deleted (issue 26)
        self._note_claims(present - self._present_before)
        if self.buried is not None:
            self.buried.release(objects)
        self._present_before = present
        self._check_retention(gone)
        self._check_savepoint_history(present, gone)
        for key in present:
            if key.startswith(LAYOUT.lease_prefix) and key.endswith(".json"):
                epoch = int(key[len(LAYOUT.lease_prefix):-5])
                if epoch not in self._epochs_seen:
                    self._epochs_seen.add(epoch)
                    self._new_holder(epoch)
        markers = [k for k in present if k.endswith("/_metadata")]
        counting = set(self.counting())
        if any(_checkpoint_of(k) not in counting for k in markers if _checkpoint_of(k)):
            self.coverage["adoption-filtered"] += 1
        for key in sorted(set(self._markers) - present):
            self._deleted_markers.add(key)
            if self.vandalized.get(key, "") is not None:
                self._subsumed_markers.add(key)  # not the vandal's delete
        # created again after a delete of the runtime's (seed 105944: the vandal deleted
        # a marker, its late first copy landed, then the vandal damaged it: no subsumed
        # marker came back)
        resurrected = [k for k in markers if k in self._subsumed_markers]
        for key in resurrected:
            self._late_copies.add(key)
            self.vandalized.setdefault(key, objects[key].etag)  # its files are gone
        if resurrected:
            self.coverage["marker-resurrected"] += 1
            read = set(CheckpointCatalog(self.oracle, JOB).checkpoint_ids())
            for key in resurrected:
                number = _checkpoint_of(key)
                if number in read and self._floor_unknown(number):
                    self.coverage["late-copy-floor-unknown"] += 1
                elif number in read:
                    self.violate(MARKER_RESURRECTED, f"{key} was deleted (subsumed) and "
                                 "created again by a late write, and the catalog counts "
                                 "it: a completed checkpoint whose files are gone")
        for key in markers:
            data = objects[key].data
            if key not in self._markers and key not in self._deleted_markers:
                self._note_late(key)
                if (number := _checkpoint_of(key)) is not None:
                    self._note_floor(number)
                if number is not None \
                        and (first_manifest := self.manifest(key)) is not None:
                    self._marker_epochs[number] = first_manifest.lease_epoch
                    self._arm_floor_strike(number, first_manifest.lease_epoch)
            first = self._markers.setdefault(key, data)
            if first != data and key not in self.vandalized:
                self.violate(CHECKPOINT_CHANGED, f"{key} changed after it completed")
            manifest = self.manifest(key)
            if manifest is None:
                continue
            number = _checkpoint_of(key)
            if number is not None and number not in counting:
                continue
            self._covered = max(self._covered, manifest.batch_id)
            if key not in self.vandalized:
                self._check_references(key, manifest)
        self._check_commits()
        self.strike_retention_floor()
        for key in present:
            if key.startswith(LAYOUT.control_prefix) and key.endswith(".result.json"):
                first = self._results.setdefault(key, objects[key].data)
                if first == objects[key].data or key in self._orphans:
                    continue
                if key[: -len(".result.json")] + ".json" in present:
                    self.violate(CONTROL, f"the answer {key} changed")
                else:  # written after the job deleted the request and its answer: an
                    self._orphans.add(key)  # orphan, which its writer must not trust

    def _floor_unknown(self, number: int) -> bool:
        """Whether the vandal damaged or deleted a marker above checkpoint ``number``:
        then the retention floor that subsumed it may be unreadable (seed 101367: the
        newest marker damaged, readers fall back to an older marker's floor, at or below
        ``number``), and no reader can tell a late copy from a retained checkpoint. Its
        counting is then allowed: it is judged as damaged (restore verifies its files
        and falls past it; the next subsumption deletes it again). Floors only rise
        among readable markers, so their greatest is the newest's: nothing better is
        left to read. Judged from the vandal's actions, never from the floors written
        (a wrong floor is what ``job-marker-resurrected`` must find)."""
        return any(n > number for key in self.vandalized if key not in self._late_copies
                   and (n := _checkpoint_of(key)) is not None)

    def _arm_floor_strike(self, number: int, epoch: int | None) -> None:
        """With the seed's :attr:`floor_strike`: the first checkpoint marker of a live run
        that started from an explicit target or from scratch (its floor; with
        :attr:`older_run`, from an explicit target only: the older run's checkpoints
        are there to fall back to) is struck in the run's next batch
        (:meth:`strike_floor`)."""
        if not (self.floor_strike or self.older_run) or epoch is None:
            return
        for job in self.jobs:
            before = self._run_starts.get(job.life)
            if before is None or not job.alive or job.life in self._struck \
                    or self._life_epochs.get(job.life) != epoch or number in before \
                    or (self.older_run and job.life not in self._explicit_runs):
                continue
            self._struck.add(job.life)
            job.spark.strike = number  # type: ignore[attr-defined]
            return

    def strike_floor(self, job: SimJob, number: int) -> bool:
        """In the batch after a run's first checkpoint completed: the vandal deletes its
        marker, and an executor is lost (the caller fails the query). The query's
        restart finds none of its run's checkpoints and must refuse rather than resume
        an older run's state (``job-older-state`` below the floor). Only once the
        checkpoint completed as the floor and no copy of its marker is in flight (a
        late copy would put it back)."""
        key = LAYOUT.checkpoint_metadata(number)
        if job._run_floor != number or key not in self.objects.objects \
                or any(key in held.label for held in self.scheduler.deferred):
            return False
        self.coverage["floor-struck"] += 1
        self._damage(key, delete=True)
        return True

    def _note_floor(self, number: int) -> None:
        """The retention floor of checkpoint ``number``, whose marker first landed in this
        step, by the design's rule and the world's own ground truth (never the floor its
        manifest records, which a bug may change): the lowest of the newest
        ``num-retained`` of it and the checkpoints retained when it completed, those
        that counted then (:meth:`counted`). Its writer read each older marker before or
        after the vandal touched it (retaining it or not), so the floor is a range
        (lowest, highest): without the checkpoints whose marker the vandal damaged or
        deleted, and with them."""
        counted = {n for n in self._counted_before if n < number}
        touched = {n for k in self.vandalized if k not in self._late_copies
                   and (n := _checkpoint_of(k)) is not None and n < number}
        keep = max(self.num_retained, 1)
        # either may be the lower: without the touched ones the newest num-retained
        # reach further back, unless fewer than num-retained are left (job seed 341087:
        # chk-1's marker deleted and put back by its late first copy, chk-2's writer
        # retained it: floor 1, not 2)
        floors = (sorted(counted - touched | {number})[-keep:][0],
                  sorted(counted | touched | {number})[-keep:][0])
        self._floors[number] = (min(floors), max(floors))

    def reader_floor(self) -> tuple[int, int] | None:
        """The retention floor every reader applies now (the design's rule: the floor of
        the newest marker that counts and can be read), as the range (lowest, highest)
        it may be by the world's ground truth: the floor of the newest checkpoint that
        counts (:meth:`counted`) with a marker the vandal never touched, and at most
        that of a newer marker that parses and the runtime's filter counts (a late copy
        the world does not count). None: no marker is read."""
        intact = [n for n in self.counted()
                  if LAYOUT.checkpoint_metadata(n) not in self.vandalized]
        if not intact:
            return None
        newest = max(intact)
        low, high = self._floors.get(newest, (0, newest))
        for number in self.counting():
            if number > newest and self.manifest(LAYOUT.checkpoint_metadata(number)):
                high = max(high, self._floors.get(number, (0, number))[1])
        return low, high

    def strike_retention_floor(self) -> None:
        """With the seed's :attr:`floor_takeover`, once: while a checkpoint below the
        retention floor still counts (by the design's rule) with its marker stored and
        intact, because the newest checkpoint's writer was deposed before its retention
        deleted it (job seed 304536 on session 14's code: the claimant that listed it
        died before its post-claim look, the next one adopted it with the marker that
        raised the floor), the vandal deletes every object of the checkpoints at or
        above the floor that it does not reference. ``restore=latest`` must then refuse
        (naming the damaged files) rather than fall back below the floor
        (``job-older-state``; a refusal judged by :meth:`check_refusal`)."""
        if not self.floor_takeover or self._retention_struck or self.base_below:
            return
        floor = self.reader_floor()
        counted = self._counted_before
        if floor is None or not self._epochs_seen:
            return
        newest = max(n for n in counted if LAYOUT.checkpoint_metadata(n) not in self.vandalized)
        writer = self._marker_epochs.get(newest)
        if writer is None or writer >= max(self._epochs_seen):
            return  # its writer may still delete what is below the floor
        below = [m for n in counted if n < floor[0]
                 and (m := self.manifest(LAYOUT.checkpoint_metadata(n))) is not None
                 and not self.damaged(m, LAYOUT.checkpoint_metadata(n))]
        if not below:
            return
        kept = {f.key for m in below for f in _objects_of(m)}
        keys = sorted({key for n in counted if n >= floor[0]
                       and (m := self.manifest(LAYOUT.checkpoint_metadata(n))) is not None
                       for f in _objects_of(m) if f.key not in kept
                       and (key := f"{JOB}/{f.key}") in self.objects.objects})
        if not keys:
            return
        self._retention_struck = True
        self.coverage["retention-floor-struck"] += 1
        for key in keys:
            self._damage(key, delete=True)

    def _note_late(self, key: str) -> None:
        """A checkpoint marker seen for the first time: late if its writer's epoch is
        older than that of a holder whose takeover (adoption) was over by then."""
        number, manifest = _checkpoint_of(key), self.manifest(key)
        if number is not None and manifest is not None and manifest.lease_epoch is not None \
                and manifest.lease_epoch < self._settled_epoch:
            self._late.add(number)
            self.coverage["late-marker"] += 1

    def _check_retention(self, gone: set[str]) -> None:
        """``job-retention``: a checkpoint that counted loses its marker (not by the
        vandal) only while ``num-retained`` newer ones count (Flink's retention: only
        the oldest beyond the newest ``num-retained`` is subsumed). A marker the vandal
        deleted is still counted as one of the newer ones."""
        counted = self.counted()
        before, self._counted_before = self._counted_before, counted
        newer_pool = self._retention_pool(counted)
        self._ever_counted |= counted
        self._check_pinned(gone)
        for key in gone:
            number = _checkpoint_of(key)
            if number is None or number not in before or key in self.vandalized:
                continue
            newer = sorted(n for n in newer_pool if n > number)
            if any(n > number for n in self._counted_by_older):
                self.coverage["subsumed-in-takeover"] += 1  # seed 301107's story
            if len(newer) < self.num_retained:
                self.violate(RETENTION, f"{key} was deleted while it counted, with only "
                             f"{newer} newer checkpoint(s) counting (num-retained "
                             f"{self.num_retained})")

    def _retention_pool(self, counted: set[int]) -> set[int]:
        """The checkpoints retention may count as newer ones: those that count, and those
        whose marker the vandal deleted (retention kept them; damage is not its fault)."""
        return counted | {n for k, etag in self.vandalized.items()
                          if etag is None and (n := _checkpoint_of(k)) is not None}

    @property
    def num_retained(self) -> int:
        """``num-retained`` of the drivers; the recovery's is 1 after the operator's
        cleanup (redeployed with a smaller retention: the resumed checkpoint may then be
        beyond the newest one, pinned until the run has its own)."""
        if self.recovering and self.whole_checkpoint_p:
            return 1
        return self.setup.num_retained

    def _check_pinned(self, gone: set[str]) -> None:
        """``job-retention`` for the checkpoint a live holder's run resumed: its marker
        stays (but by the vandal) until that run completed a checkpoint of its own (a
        fallback past damaged newer ones may resume one beyond ``num-retained``; the
        run's restart needs it)."""
        newest = max(self._epochs_seen, default=None)
        for job in self.jobs:
            number = self._restored_from.get(job.life)
            epoch = self._life_epochs.get(job.life)
            if number is None or epoch is None or epoch != newest or not job.alive:
                continue
            key = LAYOUT.checkpoint_metadata(number)
            if key not in gone or key in self.vandalized:
                continue
            if not any(n > number and e == epoch for n, e in self._marker_epochs.items()):
                self.violate(RETENTION, f"{key} was deleted while {job.life}, which "
                             "resumed it, has no checkpoint of its own yet")

    def _check_savepoint_history(self, present: set[str], gone: set[str]) -> None:
        """``job-savepoint-kept`` (see the module doc)."""
        prefix = LAYOUT.savepoints_prefix
        for key in present:
            if not key.startswith(prefix):
                continue
            directory = key[:key.index("/", len(prefix)) + 1]
            if key.endswith("/" + RESTORED_NAME):
                self._restored_marks.add(directory)
            elif key.endswith("/_metadata") and key not in self._savepoints:
                manifest = self.manifest(key)
                if manifest is not None:
                    self._savepoints[key] = (manifest.checkpoint_id,
                                             manifest.extra.get(IN_HISTORY) is True)
        in_history = sorted(n for n, history in self._savepoints.values() if history)
        for key in sorted(gone):
            if key not in self._savepoints or key in self.vandalized:
                continue
            number, history = self._savepoints[key]
            newer = [n for n in in_history if n > number]
            why = ("it is not in the savepoint history" if not history else
                   "a run restored from it" if key[:-len("_metadata")] in
                   self._restored_marks | self._restored_savepoints
                   else "it is the newest history savepoint" if not newer
                   else f"only {len(newer)} newer history savepoint(s) were taken (max.count "
                        f"{self.retention.max_count})"
                   if len(newer) < self.retention.max_count else None)
            if why is not None:
                self.violate(SAVEPOINT_KEPT, f"{key} was deleted, but {why}")
            else:
                self.coverage["savepoint-disposed"] += 1

    def _check_references(self, marker: str, manifest: Manifest) -> None:
        objects = self.objects.objects
        first = self._referenced.get(marker)
        if first is None:
            first = self._referenced[marker] = {
                f"{JOB}/{f.key}": objects[f"{JOB}/{f.key}"].etag for f in _objects_of(manifest)
                if f"{JOB}/{f.key}" in objects}
        for entry in _objects_of(manifest):
            key = f"{JOB}/{entry.key}"
            if key in self.vandalized:
                continue
            stored = objects.get(key)
            if stored is None:
                self.violate(CHECKPOINT_VERIFIES, f"{marker} counts, but {key} it "
                             "references is gone")
            elif key in first and stored.etag != first[key]:
                self.violate(CHECKPOINT_CHANGED, f"{key} of {marker} changed")
            elif len(stored.data) != entry.size and entry.offset is None:
                self.violate(CHECKPOINT_VERIFIES, f"{key} of {marker} has "
                             f"{len(stored.data)} bytes, not {entry.size}")

    def _check_commits(self) -> None:
        if self.setup.mode != "EXACTLY_ONCE":
            return
        prefix, store = (f"{SINK_PREFIX}/_committed/", self.objects) \
            if self.setup.sink == "jsonl" else ("_committed/", self.table)
        for key in store.objects:
            if key.startswith(prefix):
                name = key[len(prefix):].split(".")[0]
                if name.isdigit() and int(name) > self._covered:
                    self.violate(UNCOVERED_COMMIT, f"batch {int(name)} is committed "
                                 f"({key}); the newest completed snapshot covers "
                                 f"batch {self._covered}")

    def _new_holder(self, epoch: int) -> None:
        if len(self._epochs_seen) >= 2 and not self.recovering:
            self.coverage["second-holder"] += 1
        for job in self.jobs:
            record = job.lease.record
            if record is not None and record.epoch < epoch and job.lease.failure is None \
                    and job.alive:
                self.coverage["holder-deposed-alive"] += 1

    def on_restored(self, job: SimJob, restored: RestoreResult, target: str) -> None:
        """``job-older-state`` at each restore; the damaged keys it learnt."""
        epoch = job.lease.record.epoch if job.lease.record is not None else None
        found = self._damage_found(restored, job._run_floor) if restored.from_latest \
            else frozenset()
        self._damage_learnt.append((job.life, epoch, frozenset(self._markers), {
            key: stored.written if (stored := self.objects.objects.get(key)) else None
            for key in restored.damaged_keys | found}))
        manifest = restored.manifest
        if manifest is not None and manifest.is_savepoint and manifest.savepoint_id:
            self._restored_savepoints.add(LAYOUT.savepoint_dir(manifest.savepoint_id))
        if job.lease.record is not None:
            self._life_epochs[job.life] = job.lease.record.epoch
            self._settled_epoch = max(self._settled_epoch, job.lease.record.epoch)
        if restored.damaged_keys:
            self.coverage["restore-fallback"] += 1
        self._check_damage_cause(job, restored)
        restored_id = restored.manifest.checkpoint_id \
            if restored.manifest and not restored.manifest.is_savepoint else None
        if restored_id is not None:
            self._restored_from[job.life] = restored_id
        if job.restores == 1 and (target != "latest" or restored.manifest is None):
            self._run_starts[job.life] = set(self._marker_epochs)
            if target != "latest":
                self._explicit_runs.add(job.life)
        elif job.restores > 1 and job.life in self._run_starts:
            self._check_run_floor(job, restored_id)
        record = job.lease.record
        epochs = sorted(self._epochs_seen)
        if target != "latest" or record is None or not epochs or epochs[-1] != record.epoch:
            return  # asked for, or deposed already: a successor decides
        floor = job._run_floor
        counted = self._check_uncounted(job.life)
        restored_key = LAYOUT.checkpoint_metadata(restored_id) if restored_id is not None else ""
        if restored_id is not None and restored_key in self._subsumed_markers \
                and self._floor_unknown(restored_id):
            # a late copy of a subsumed marker whose floor carrier the vandal took (see
            # _floor_unknown): no reader can tell it from a retained checkpoint; its files
            # were not collected yet (the holder died between the marker's delete and
            # theirs), so it verifies and is the fallback (job seed 157, session 13)
            self.coverage["late-copy-restored"] += 1
        elif restored_id is not None and restored_id not in counted \
                and restored_key in self.objects.objects:
            self.violate(RESTORED_UNCOUNTED, f"{job.life} restored chk-{restored_id} with "
                         "restore=latest, but it does not count (a marker its holder "
                         "neither adopted nor wrote)")
        elif restored_id is not None and (retention := self.reader_floor()) is not None \
                and restored_id < retention[0]:
            self.violate(OLDER_STATE, f"{job.life} restored chk-{restored_id} with "
                         f"restore=latest, below the retention floor chk-{retention[0]} "
                         "of the newest checkpoint that counts (a fallback below it)")
        for number in self.counting():
            if (restored_id is not None and number <= restored_id) or \
                    (floor is not None and number < floor):
                continue
            key = LAYOUT.checkpoint_metadata(number)
            manifest = self.manifest(key)
            if manifest is not None and not self.damaged(manifest, key):
                self.violate(OLDER_STATE, f"{job.life} restored "
                             f"{restored.path or 'nothing'} with restore=latest, but "
                             f"checkpoint {number} counts and is intact")
                return

    def _check_uncounted(self, holder: str) -> set[int]:
        """``job-uncounted`` for the newest holder (``holder``, its takeover over): every
        checkpoint that ever counted still counts while its marker exists, unless
        ``num-retained`` newer ones count. Returns the ids that count now."""
        counted = self.counted()
        pool = self._retention_pool(counted)
        for number in sorted(self._ever_counted - counted):
            key = LAYOUT.checkpoint_metadata(number)
            newer = [n for n in pool if n > number]
            if len(newer) >= self.setup.num_retained:
                # subsumed: below the retention floor its marker may outlive; a newer
                # marker the vandal deleted is one of the retained (as for job-retention:
                # seed 100096, the floor of chk-5 left chk-3 behind chk-4 it retained)
                continue
            if key in self.objects.objects and key not in self.vandalized:
                self.violate(UNCOUNTED, f"chk-{number} counted, but not for {holder} "
                             "after its takeover, while its marker exists (not adopted)")
        return counted

    def _check_damage_cause(self, job: SimJob, restored: RestoreResult) -> None:
        """``job-gc-damage``: every key a restore found damaged or missing was touched by
        the vandal (or is referenced by a marker resurrected by a late write, the known
        defect): never one the job's own collection deleted while a checkpoint that
        counts, the run's pinned one or a pending one still needed it."""
        resurrected = {f"{JOB}/{f.key}" for key in self._deleted_markers
                       if key in self.objects.objects
                       and (manifest := self.manifest(key)) is not None
                       for f in _objects_of(manifest)}
        for key in sorted(restored.damaged_keys - set(self.vandalized) - resurrected):
            self.violate(GC_DAMAGE, f"{job.life}'s restore found {key} damaged or missing, "
                         "which the vandal never touched (deleted by a collection)")
            return

    def _damage_found(self, restored: RestoreResult, floor: int | None) -> frozenset[str]:
        """What a ``restore=latest`` must have found damaged, by the world's own ground
        truth: every object the vandal touched that a checkpoint newer than the one
        resumed (at or above the run's floor) references, of those that count by the
        design's rule (:meth:`counted`): the restore tried each and reads every file of
        one it tries."""
        resumed = restored.manifest.checkpoint_id if restored.manifest is not None else -1
        keys: set[str] = set()
        for number in self.counted():
            if number <= resumed or (floor is not None and number < floor):
                continue
            manifest = self.manifest(LAYOUT.checkpoint_metadata(number))
            if manifest is not None:
                keys |= {key for f in _objects_of(manifest)
                         if (key := f"{JOB}/{f.key}") in self.vandalized}
        return frozenset(keys)

    def _check_run_floor(self, job: SimJob, restored_id: int | None) -> None:
        """``job-older-state`` below the floor: a life whose run started from an explicit
        target or from scratch never resumes (``restore=latest``, a query restart) a
        checkpoint older than its own first one, judged from the markers' epochs."""
        epoch = self._life_epochs.get(job.life)
        before = self._run_starts[job.life]
        own = [n for n, e in self._marker_epochs.items()
               if n not in before and e is not None and e == epoch]
        if own and (restored_id is None or restored_id < min(own)):
            self.violate(OLDER_STATE, f"{job.life} resumed "
                         f"{'nothing' if restored_id is None else f'chk-{restored_id}'} with "
                         f"restore=latest, below its run's first checkpoint chk-{min(own)} "
                         "(an older run's state)")

    def check_damaged_references(self) -> None:
        """``job-damaged-reference``: no checkpoint completed after its driver's restore
        found damaged keys (the restore's word, and what it must have found: see
        :meth:`_damage_found`) references one still damaged: the version found, not
        one the vandal damaged again after the driver wrote the key anew (job seed
        350374, session 16: an upload repaired the key, the new checkpoint named it
        intact, and the wrong clean-up damaged it again at the end)."""
        for key in self._markers:
            manifest = self.manifest(key)
            stored = self.objects.objects.get(key)
            if manifest is None or stored is None:
                continue
            for life, epoch, before, keys in self._damage_learnt:
                if not keys or key in before or manifest.lease_epoch is None or \
                        epoch != manifest.lease_epoch:
                    continue
                for entry in _objects_of(manifest):
                    full = f"{JOB}/{entry.key}"
                    if full in keys and self.objects.objects.get(full) is not None and \
                            self.objects.objects[full].etag == self.vandalized.get(full) and \
                            self.objects.objects[full].written == keys[full]:
                        self.violate(DAMAGED_REFERENCE, f"{key} references {full}, which "
                                     f"{life}'s restore found damaged")

    # ------------------------------------------------------------------ actors

    recovering = False

    def make_job(self, number: int, life: str, restore: str, storage: SimStorage,
                 host: Host) -> tuple[SimJob, TwoPhaseCommitSink]:
        sched = self.scheduler
        job = SimJob(JobSpark(self), job=JOB, storage=storage,  # type: ignore[arg-type]
                     checkpoint_config={**self.config, "execution.checkpointing.num-retained":
                                        self.num_retained},
                     restart_strategy=RESTART,
                     restore=restore, workdir=self.tmp / life, run_id=RUN_ID,
                     threaded=False)
        job.world, job.life = self, life
        job.spark.job = job  # type: ignore[attr-defined]
        lease = job.lease
        lease.clock, lease.wall_clock, lease.sleep = sched.monotonic, sched.wall_clock, sched.sleep
        lease.ttl_s, lease.heartbeat_s, lease.max_write_s = TTL_S, HEARTBEAT_S, MAX_WRITE_S
        lease._beating = SimCondition(sched)  # type: ignore[assignment]
        lease._swapping = SimLock(sched)  # type: ignore[assignment]
        lease._start_heartbeat = lambda: self.heartbeat(  # type: ignore[method-assign]
            lease, life, host)
        job.outage.clock, job.outage.sleep = sched.monotonic, sched.sleep
        # ``ungated-write``: every write the driver starts through its FencedStorage (under
        # the outage wrapper: each retry is gated) passed the lease gate first
        fenced = job.storage.inner  # type: ignore[attr-defined]
        fenced.inner, checked_gate = self.fence(storage, fenced.gate, life)

        if isinstance(fenced.inner, DriverStorage):
            fenced.inner.observe = lambda op, keys: self.check_forgotten(life, op, keys)
            fenced.inner.after_get = self.fallback.after_get

        def gate() -> None:
            checked_gate()
            self.check_validity(lease, life)
            self.check_one_holder(lease, life, storage.tag)
        fenced.gate = gate
        job.history.clock, job.history.ids = sched.wall_clock, sched.uuid4
        job.history.compaction = None
        job.clock, job.sleep = sched.monotonic, sched.sleep
        job.savepoint_requests.clock = sched.wall_clock
        job.control.answer_retention_s = self.retention.answer_retention_s
        sink: TwoPhaseCommitSink
        if self.setup.sink == "jsonl":
            sink = JsonLinesSink(job.storage, SINK_PREFIX, ids=sched.uuid4)
        else:
            faults = Faults() if self.recovering else self.setup.faults
            table = DriverHostView(self.table, sched, faults=faults, tag=f"{life}-table")
            if self.lapsed_marker.deposed:
                table.lapsed, table.driver = self.lapsed_marker, storage.tag
            sink = SimParquetSink(
                table,
                SimStorage(self.table, sched, faults=faults, tag=f"{life}-executors"),
                sched.uuid4, self.tmp / f"{life}-scratch")
            self.coverage["parquet-sink"] = 1
        job.sink = sink
        self.jobs.append(job)
        return job, sink

    def heartbeat(self, lease: JobLease, life: str, host: Host) -> None:
        """The lease's heartbeat thread, as an actor of the driver's process."""
        sched = self.scheduler
        lease._stop.clear()
        self._renewed[id(lease)] = sched.monotonic()  # the claim succeeded before this

        def beat() -> None:
            while True:
                sched.sleep(lease.heartbeat_s)
                if lease._stop.is_set() or lease.record is None:
                    return
                try:
                    lease.beat()
                except (ConcurrentDriverError, LeaseExpiredError):
                    return
                except AirflowCkptError:
                    continue
                self._renewed[id(lease)] = sched.monotonic()  # no later than it started
                epochs = lease_epochs(self.oracle, JOB)
                if lease.record is not None and epochs and epochs[-1] > lease.record.epoch:
                    self.violate(RENEWED_DEPOSED, f"{life}'s heartbeat of epoch "
                                 f"{lease.record.epoch} succeeded while epoch {epochs[-1]} "
                                 "exists")

        lease._thread = SimThread(  # type: ignore[assignment]
            sched, sched.spawn(f"{life}-heartbeat", host, beat, parent=sched.current()))

    def check_validity(self, lease: JobLease, life: str) -> None:
        """``job-write-after-expiry``: a driver's lease gate (before each write through
        its ``FencedStorage``) passes no more once ``ttl - max_write`` of its host's
        monotonic clock passed since its last successful heartbeat, or its claim,
        *returned* (the world's own bookkeeping: later than the runtime's, which counts
        from their starts)."""
        renewed = self._renewed.get(id(lease))
        now = self.scheduler.monotonic()
        if renewed is not None and now > renewed + TTL_S - MAX_WRITE_S:
            self.violate(WRITE_AFTER_EXPIRY, f"{life}'s lease gate passed "
                         f"{now - renewed:.1f} s after its last successful heartbeat "
                         f"(validity {TTL_S - MAX_WRITE_S:g} s)")

    def check_forgotten(self, life: str, op: str, keys: list[str]) -> None:
        """``job-control``: a driver life never answers a request whose request object it
        deleted itself (its clean-up of answered requests keeps those it still acts on:
        were the requester's "expired" answer deleted, the driver's answer would land as
        a second one). Judged from the writes the life issued (the world's view)."""
        prefix = LAYOUT.control_prefix
        for key in keys:
            if not key.startswith(prefix) or not key.endswith(".json"):
                continue
            if op == "delete" and not key.endswith(".result.json"):
                self._forgotten.add((life, key[len(prefix):-len(".json")]))
            elif op == "put" and key.endswith(".result.json") \
                    and (life, request_id := key[len(prefix):-len(".result.json")]) \
                    in self._forgotten:
                self.violate(CONTROL, f"{life} answers request {request_id}, which its own "
                             "clean-up deleted (it still acted on it: its answer lands as a "
                             "second one, after the requester's)")

    def check_one_holder(self, lease: JobLease, life: str, tag: str) -> None:
        """``job-one-holder``: a holder's lease gate (its epoch the newest ever seen)
        passes only while the stored record of its epoch is its own claim (written by its
        storage view: the world's ground truth, not the record the driver believes it
        wrote). Two claimants of one epoch must never both write as its holder: of two
        claims of one epoch one fails. (A deposed holder's epoch may be claimed again by
        a late claim PUT landing after the sweep: its confirm stops it, judged apart.)"""
        record = lease.record
        if record is None or record.epoch != max(self._epochs_seen, default=0):
            return  # deposed: its confirm stops it (a claim of its epoch may land late)
        stored = self.objects.objects.get(lease_key(LAYOUT.lease_prefix, record.epoch))
        if stored is not None and stored.writer != tag:
            self.violate(ONE_HOLDER, f"{life}'s lease gate passed as the holder of epoch "
                         f"{record.epoch}, whose record {stored.writer} "
                         "wrote (two holders of one epoch)")

    def before_claim(self) -> None:
        """At ``lease.before_claim`` (a driver judged the lease free, has not claimed):
        with the seed's chance, the claimant stops a while, so that other drivers judge
        the same epoch free, claim it, or even take it over from that claimant, in
        between (:class:`Contention`)."""
        actor, rng = self.scheduler.current(), self.contention_rng
        if actor is None or not actor.name.startswith("driver"):
            return
        self._wait_for_a_waking_holder(actor)
        if rng.random() < self.contention.claim_pause_p:
            self.coverage["claim-paused"] += 1
            self.scheduler.log("pauses between judging the lease free and claiming it")
            self.scheduler.sleep(rng.uniform(*self.contention.claim_pause_s))
        self._meet_a_second_claimant(actor)

    def _meet_a_second_claimant(self, actor: Actor) -> None:
        """With the seed's :class:`ClaimRace`: the first claimant here waits (a while)
        for a second one; the second releases it, and both go on to claim the same
        epoch from the same judgement."""
        if not self.claim_race.rendezvous or self.recovering:
            return
        if self._rendezvous:
            self._rendezvous.clear()  # releases the waiting one
            self.coverage["claims-met"] += 1
            self.scheduler.log("meets a claimant that judged the lease free too")
            return
        self._rendezvous.add(actor.name)
        deadline = self.scheduler.now + self.claim_race_rng.uniform(HEARTBEAT_S, TTL_S)
        try:
            while actor.name in self._rendezvous and self.scheduler.now < deadline:
                self.scheduler.sleep(0.05)
        finally:
            self._rendezvous.discard(actor.name)

    def _wait_for_a_waking_holder(self, actor: Actor) -> None:
        """The rarest takeover made common: while another driver's host is suspended
        before its completion marker (it was judged dead: that is why this claimant
        found the lease free), with the seed's chance the claimant stops until just
        after that host wakes, so the marker lands and is confirmed between the
        claimant's first listing and its claim (the late marker its second look, or its
        successor's, must adopt)."""
        now = self.scheduler.now
        waking = [t for host, t in self.waking.items() if host != actor.host.name and t > now]
        if not waking or not self.claim_crash_p \
                or self.claim_crash_rng.random() >= self.claim_crash_p:
            return
        until = min(waking) + self.claim_crash_rng.uniform(0.5, 2 * HEARTBEAT_S)
        self._waited.add(actor.name)
        self.coverage["claim-waited-for-marker"] += 1
        self.scheduler.log("waits before its claim for a suspended holder to wake")
        self.scheduler.sleep((until - now) * actor.host.rate)

    def after_claim(self) -> None:
        """At ``lease.after_claim`` (claimed, the older epochs' records not deleted
        yet): a claimant that took over (with the seed's chance, and always after it
        waited for a waking holder) is killed here: its record adopts only what it
        listed before its claim, so its successor must judge past it. Otherwise, with
        the seed's chance the new holder is slow to finish its takeover, so the deposed
        holder's heartbeat finds its record still there."""
        actor, rng = self.scheduler.current(), self.contention_rng
        if actor is None or not actor.name.startswith("driver"):
            return
        took_over = len(lease_epochs(self.oracle, JOB)) > 1
        if self._buried_claimant_dies(actor) or actor.name in self._waited \
                or (took_over and self.claim_crash_p and (
                    self.claim_crash_rng.random() < self.claim_crash_p / 3)) \
                or (took_over and self.floor_takeover and self._holder_waking(actor)) \
                or (took_over and self._deposed_claimant_dies(actor)):
            self._waited.discard(actor.name)
            self.coverage["killed-after-claim"] += 1
            actor.killed = True
            self.scheduler.log("killed between its claim and its second look")
            self.scheduler.yield_point("killed after its claim")
        if rng.random() >= self.contention.claim_pause_p:
            return
        self.coverage["takeover-paused"] += 1
        self.scheduler.sleep(rng.uniform(0.0, 2 * HEARTBEAT_S))

    def _buried_claimant_dies(self, actor: Actor) -> bool:
        """:class:`BuriedClaim` step 4: once the buried claim's holder was suspended,
        the first claimant whose predecessor's record (newer than the buried one) is
        final (the holder of step 3 left: killed, or gone on its own)."""
        story, job = self.buried, self._running.get(actor)
        record = job.lease.record if job is not None else None
        if story is None or story.epoch is None or story.holder is None \
                or story.claimant_killed or record is None:
            return False
        older = [e for e in lease_epochs(self.oracle, JOB) if e < record.epoch]
        previous = read_epoch(self.oracle, JOB, max(older)) if older else None
        if previous is None or previous.epoch <= story.epoch or not previous.adoption_final:
            return False
        story.claimant_killed = True
        self.coverage["buried-claim-claimant-killed"] += 1
        return True

    def _deposed_claimant_dies(self, actor: Actor) -> bool:
        """:class:`LapsedMarker`'s deposed holder: a claimant taking the lease while that
        holder's host is suspended before its marker dies right after its claim."""
        story = self.lapsed_marker
        if not story.deposed or story.holder is None or story.woke \
                or actor.host.name == story.holder:
            return False
        self.coverage["lapsed-marker-claimant-killed"] += 1
        return True

    def _deposed_holder_suspended(self, actor: Actor) -> bool:
        """:class:`LapsedMarker`'s deposed holder at its first completion marker (another
        driver alive to take over): its host is suspended (in one go: its heartbeat
        thread stands still throughout) long enough for another driver to claim; this
        life's next marker is the lapsed one."""
        driver = actor.parent or actor  # an overlapping phase runs on a thread of its own
        story, job = self.lapsed_marker, self._running.get(driver)
        if not story.deposed or story.holder is not None or job is None \
                or job.lease.record is None or not self._other_drivers(driver):
            return False
        story.holder = actor.host.name
        story.holder_job = job
        story.outage_s = story.deposed_outage_s / actor.host.rate  # true seconds
        self.coverage["lapsed-marker-holder-suspended"] += 1
        self.scheduler.suspend(story.suspend_s, "a completion marker (the lapsed marker's "
                               "holder)")
        story.woke = True
        return True

    def _deposed_marker_lands(self) -> None:
        """The deposed holder's marker PUT stays in the network until the holder's
        heartbeat learnt of the takeover (a lost lease; a lease ttl of its clock at
        most), then lands with its answer lost."""
        sched = self.scheduler
        actor = sched.current()
        job = self._running.get(actor.parent or actor) if actor is not None else None
        if actor is None or job is None:
            return
        sched.log("the marker's PUT stays in the network until its holder's heartbeat "
                  "looked at the lease")
        deadline = sched.now + TTL_S / actor.host.rate
        while job.lease.failure is None and sched.now < deadline:
            sched.sleep(0.05)

    def _holder_waking(self, actor: Actor) -> bool:
        """Whether another driver's host is suspended before its completion marker (it
        lands after this claim when the host wakes)."""
        now = self.scheduler.now
        return any(t > now for host, t in self.waking.items() if host != actor.host.name)

    def before_beat(self) -> None:
        """At ``lease.before_beat``: with the seed's chance the heartbeat thread stalls
        (its driver writes on, its gate closing on its own clock); with the chance of
        :attr:`starve_p` it is starved until a successor, having judged the silent
        holder dead, claimed the job: its rewrite then lands while the successor's
        takeover still keeps the older record (a deposed holder's heartbeat that must
        not extend its validity)."""
        actor, rng = self.scheduler.current(), self.contention_rng
        if actor is not None and self.fallback.before_beat(actor):
            return
        if actor is not None and self.overtaking.losing(actor.parent):
            return  # the overtaking marker's lost answers keep a healthy lease
        if actor is not None and self.starve_rng.random() < self.starve_p:
            self._starve(actor)
            return
        if actor is None or rng.random() >= self.contention.beat_stall_p:
            return
        self.coverage["beat-stalled"] += 1
        self.scheduler.sleep(rng.uniform(0.0, TTL_S))

    def _starve(self, actor: Actor) -> None:
        job = next((j for a, j in self._running.items() if a is actor.parent), None)
        record = job.lease.record if job is not None else None
        if record is None:
            return
        self.coverage["beat-starved"] += 1
        self.scheduler.log("heartbeat thread starved until a successor claims")
        deadline = self.scheduler.now + 4 * TTL_S
        while self.scheduler.now < deadline and \
                max(lease_epochs(self.oracle, JOB), default=0) <= record.epoch:
            self.scheduler.sleep(0.05)

    def before_marker(self) -> None:
        """At ``coordinator.before_metadata`` (a snapshot's files are durable, its marker
        not written yet): with the seed's chance the driver's host is suspended long
        enough for a successor to take over (its heartbeat thread stops with it); its
        monotonic clock stands still meanwhile, so its gate still passes and the marker
        lands after the successor's claim."""
        sched, rng = self.scheduler, self.contention_rng
        actor = sched.current()
        if actor is None or not actor.name.startswith("driver"):
            return
        if self._buried_claim_marker(actor) or self.stale_claim.before_marker(actor) \
                or self.deposed_marker.before_marker(actor) or self.deposed_marker.pending \
                or (actor.parent or actor) in self._base_runs \
                or (self.base_below and self._covered < BASE_BATCH):
            # a run that restored the base below the floor keeps its lease; the base is
            # past its query's first batches (some of its files then are its own)
            return
        if self._deposed_holder_suspended(actor):
            return
        if rng.random() >= self.contention.marker_suspend_p \
                and not self._successor_waits(actor) and not self._late_start_waits(actor):
            return
        gone = rng.uniform(TTL_S + MAX_WRITE_S, 6 * TTL_S)  # true seconds
        self.waking[actor.host.name] = sched.now + gone
        self.coverage["suspended-before-marker"] += 1
        sched.suspend(gone, "a completion marker")

    def before_marker_overlapped(self) -> None:
        """At ``coordinator.before_metadata``: :meth:`before_marker`, then the completion
        overlap's wait (an overlapping phase waits for the collection's decision)."""
        self.before_marker()
        self.overlap.before_marker()

    def before_add(self) -> None:
        """At ``coordinator.before_store_add``: the overtaking crash, then the completion
        overlap."""
        self.overtaking.settled()
        actor = self.scheduler.current()
        if actor is not None:
            self.fallback.before_add(actor)
        self.overlap.before_add()

    def before_history(self) -> None:
        """At ``history.before_create``: the overtaking crash, then the completion
        overlap, then the subsumed fallback."""
        self.overtaking.settled()
        self.overlap.before_history()
        actor = self.scheduler.current()
        if actor is not None:
            self.fallback.before_history(actor)

    def before_delete(self) -> None:
        """At ``store.gc.before_delete``: the completion overlap's wait (window *b*),
        then the subsumed fallback."""
        actor = self.scheduler.current()
        window = self.overlap.windows.get(actor) if actor is not None else None
        self.overlap.before_delete()
        if actor is not None:
            self.fallback.before_delete(actor, window)

    def before_upload(self) -> None:
        """At ``upload.before_file``: an executor lost (:meth:`lost_in_upload`), else
        the next checkpoint may overtake this one (:class:`Overtaking`)."""
        self.lost_in_upload()
        self.overtaking.before_upload()

    def _coordinator_of(self, actor: Actor) -> CheckpointCoordinator | None:
        job = None if self.recovering else self._running.get(actor)
        return job.coordinator if job is not None else None

    def _buried_claim_marker(self, actor: Actor) -> bool:
        """:class:`BuriedClaim` steps 2 and 3 at a completion marker: the holder of the
        buried claim's epoch is suspended before its first one until the claimant of
        step 4 was killed (15 lease ttls at most); the first holder of a newer epoch to
        reach one (its takeover final, the older records swept) is killed there."""
        story, job = self.buried, self._running.get(actor)
        record = job.lease.record if job is not None else None
        if story is None or story.epoch is None or record is None:
            return False
        sched = self.scheduler
        if story.holder is None and record.epoch == story.epoch:
            story.holder = actor.host.name
            self.coverage["buried-claim-holder-suspended"] += 1
            deadline = sched.now + 15 * TTL_S
            while not story.claimant_killed and sched.now < deadline:
                sched.suspend(TTL_S / 2, "a completion marker (its claim buried)")
            return True
        if story.holder is not None and not story.final_killed \
                and record.epoch > story.epoch and record.adoption_final:
            story.final_killed = True
            self.coverage["buried-claim-final-holder-killed"] += 1
            actor.killed = True
            sched.log("killed before its first completion marker (above a buried claim)")
            sched.yield_point("killed before its marker")
        return False

    def before_run(self) -> None:
        """A new holder's run starts (its lease acquired, its takeover over, its restore
        not made yet): while another driver's host is suspended before its completion
        marker, with the seed's :attr:`slow_start_p` the run starts only just after that
        host wakes (a driver slow to start its query), so the deposed holder's marker
        lands after the takeover and is the newest one the restore lists (a late marker,
        which never counts)."""
        actor, rng = self.scheduler.current(), self.slow_start_rng
        if actor is None or self.recovering:
            return
        self._restore_the_base(actor)
        self.deposed_marker.before_run(actor)
        self.fallback.before_run(actor)
        now = self.scheduler.now
        waking = [t for host, t in self.waking.items() if host != actor.host.name and t > now]
        if not waking or rng.random() >= self.slow_start_p:
            return
        self.coverage["start-waited-for-marker"] += 1
        self.scheduler.log("starts its run only after a suspended holder wakes")
        until = min(waking) + rng.uniform(0.5, 2 * HEARTBEAT_S)
        self.scheduler.sleep((until - now) * actor.host.rate)

    def _restore_the_base(self, actor: Actor) -> None:
        """With :attr:`base_below`: a run starting (its takeover over) while a checkpoint
        below the retention floor counts, its marker and files intact, restores it on
        purpose (an operator's explicit target: session 14's case, job seed 108)."""
        job = self._running.get(actor)
        floor = self.reader_floor() if self.base_below and job is not None else None
        if job is None or floor is None:
            return
        below = [n for n in self.counted() if n < floor[0]
                 and (m := self.manifest(LAYOUT.checkpoint_metadata(n))) is not None
                 and not self.damaged(m, LAYOUT.checkpoint_metadata(n))]
        if below:
            self._base_runs.add(actor)
            job.restore_target = f"chk-{max(below)}"
            self.coverage["base-below-floor-restore"] += 1
            self.scheduler.log(f"restores {job.restore_target} on purpose, below the "
                               f"retention floor chk-{floor[0]}")

    def _late_start_waits(self, actor: Actor) -> bool:
        """With the seed's :attr:`slow_start_p`, now and then a driver whose marker is due
        is suspended while another driver lives (the story :meth:`before_run`
        completes)."""
        return bool(self.slow_start_p) and bool(self._other_drivers(actor)) \
            and self.slow_start_rng.random() < self.slow_start_p / 2

    def _other_drivers(self, actor: Actor) -> list[Actor]:
        return [a for a in self.scheduler.actors if a.alive and a is not actor
                and a.name.startswith("driver") and a.parent is None]

    def _successor_waits(self, actor: Actor) -> bool:
        """With the seed's chance of a claimant killed mid-takeover, a driver whose
        marker is due is suspended while another driver lives (the story
        :meth:`_wait_for_a_waking_holder` completes)."""
        return bool(self._other_drivers(actor)) and bool(self.claim_crash_p) \
            and self.claim_crash_rng.random() < self.claim_crash_p / 2

    def lost_in_upload(self) -> None:
        """At ``upload.before_file`` (a checkpoint's async phase is about to upload a
        unit): with the seed's chance (:class:`Uploads`) an executor is lost meanwhile.
        The query fails, and the job's restart shuts the coordinator down, cancelling
        the pending checkpoint while the unit uploads: its files are durable, its marker
        never written. (The unthreaded coordinator runs the phase between two batches;
        a threaded one overlaps them, as here.)"""
        actor = self.scheduler.current()
        job = self._running.get(actor) if actor is not None else None
        if job is None or self.recovering or job.coordinator is None:
            return
        if self.uploads_rng.random() >= self.uploads.lost_in_upload_p:
            if actor is None or not self.replay.strikes(job.coordinator):
                return
            self.coverage["replayed-overlap"] += 1
            self.overlap.eager[actor] = OVERLAPPED
        query = job.spark.running  # type: ignore[attr-defined]
        if query is None or query.error is not None:
            return
        self.coverage["lost-in-upload"] += 1
        self.scheduler.log("an executor is lost while a checkpoint uploads")
        query.error = RuntimeError("executor lost while a checkpoint uploaded (simulated)")
        job.coordinator.shutdown(wait=False)  # the restart's first step

    def run_life(self, number: int, life: str, restore: str, storage: SimStorage,
                 host: Host) -> str:
        """One driver life; how it ended."""
        job, sink = self.make_job(number, life, restore, storage, host)
        self.scheduler.log(f"{life} starts, restore={restore}")
        actor = self.scheduler.current()
        if actor is not None:
            self._running[actor] = job
        try:
            result = job.run(lambda: job.spark.writer(  # type: ignore[attr-defined]
                job.exactly_once(sink)))
            ending: BaseException | str = result.outcome
        except AirflowCkptError as exc:
            ending = exc
            if not isinstance(ending, ALLOWED_ENDINGS) and job.lease.failure is not None:
                ending = job.lease.failure  # e.g. the checkpoint it awaited failed for it
        finally:
            job.alive = False
            if self.lapsed_marker.holder_job is job and not self.lapsed_marker.played:
                self.lapsed_marker.missed = True  # its marker was never sent
            if job.outage.outages:
                self.coverage["outage-ridden" if job.outage.ridden_out else "outage-met"] += 1
        self.endings.append((life, ending))
        self.scheduler.log(f"{life} ended: {ending!r}")
        self.judge_ending(life, ending, explicit=restore != "latest")
        return ending if isinstance(ending, str) else type(ending).__name__

    def judge_ending(self, life: str, ending: BaseException | str, explicit: bool) -> None:
        if isinstance(ending, str):
            self.coverage[f"life-{ending}"] += 1
            return
        if isinstance(ending, RestoreRefusedError) and self.vandalized:
            self.coverage["refusal"] += 1  # judged again at the end (check_refusal)
            return
        if isinstance(ending, SinkTransactionAbortedError):
            self.coverage["aborted-transaction-refused"] += 1  # documented, final
            return
        if isinstance(ending, RestoreError) and explicit:
            self.coverage["explicit-refused"] += 1  # documented: a damaged or gone target
            return
        if isinstance(ending, ALLOWED_ENDINGS):
            self.coverage[f"life-{type(ending).__name__}"] += 1
            return
        self.violate(DRIVER_ERROR, f"{life} died of {type(ending).__name__}: {ending}")

    def driver(self, number: int) -> Callable[[], None]:
        setup, sched = self.setup, self.scheduler
        host = Host(f"driver-{number}", setup.skews[number - 1], setup.rates[number - 1])
        storage = DriverStorage(self.objects, sched, faults=setup.faults, tag=f"driver-{number}")
        storage.landings, storage.rng = self.landings, self.landings_rng
        storage.race, storage.race_rng = self.claim_race, self.claim_race_rng
        storage.buried = self.buried
        storage.lapsed = self.lapsed_marker if self.lapsed_marker.on else None
        storage.overtaken = self.overtaking.hold

        def program() -> None:
            if not setup.together and not self.contention.together:
                sched.sleep(self.rng.uniform(0.0, 60.0))
            for life in range(1, setup.lives + 1):
                restore = self.explicit_target() if life > 1 or not setup.together \
                    else "latest"
                ended = self.run_life(number, f"driver-{number}.{life}", restore, storage,
                                      host)
                if ended == "finished":
                    return
                sched.sleep(self.rng.uniform(1.0, 30.0))
        return program

    def explicit_target(self) -> str:
        """``latest``, or with ``explicit_p`` (or, in a seed with the floor strike, 0.4)
        an older retained checkpoint or a savepoint (an operator restoring one on
        purpose)."""
        if self.rng.random() >= self.setup.explicit_p and not (
                self.floor_strike and self.strike_rng.random() < 0.4) and not (
                self.older_run and self.rerun_rng.random() < 0.8):
            return "latest"
        catalog = CheckpointCatalog(self.oracle, JOB)
        choices = [f"chk-{n}" for n in catalog.checkpoint_ids()[:-1]] + \
            [f"savepoints/sp-{sp}" for sp in catalog.savepoint_ids()]
        if not choices:
            return "latest"
        self.coverage["explicit-restore"] += 1
        return self.rng.choice(choices)

    def control_client(self) -> None:
        """Sends the seed's requests, waits for each answer, expires it on giving up."""
        sched = self.scheduler
        storage = SimStorage(self.objects, sched, faults=Faults(unavailable=0.02), tag="client")
        channel = ControlChannel(storage, JOB, clock=sched.wall_clock, ids=sched.uuid4)
        requests, again, retries = iter(self._requests()), None, 4
        while (sent := again or next(requests, None)) is not None:
            kind, retried = sent
            impatient = self.impatient and kind in (SAVEPOINT, NAMED)
            sched.sleep(self.impatience_rng.uniform(0.0, 1.0) if again
                        else self.retry_rng.uniform(0.0, 2.0) if retried
                        else self.rng.uniform(2.0, 40.0))
            again = None
            if impatient:
                self._wait_for_a_running_job()
            # often racing the job's answer; an impatient one gives up at its timeout
            timeout = self.impatience_rng.uniform(1.0, 10.0) if impatient \
                else self.retention.request_timeout_s
            try:
                request_id = self._send(channel, kind, timeout)
            except StorageError:
                continue
            self.requests[request_id] = kind
            patience = timeout if impatient else self.rng.uniform(5.0, 120.0)
            step = 1.0 if impatient else 5.0
            while patience > 0:
                sched.sleep(step)
                patience -= step
                try:
                    if channel.result(request_id) is not None:
                        break
                except StorageError:
                    continue
            else:
                self._expire(storage, request_id)
                if impatient and retries:  # the task is retried: it asks again
                    again, retries = (kind, True), retries - 1
                    self.coverage["impatient-request-retried"] += 1

    def batch_time(self) -> float:
        """How long a batch takes (virtual seconds); with :attr:`impatient`, batches are
        slow (a straggler executor): a savepoint triggered at one look completes after
        the next batch, while the requester's retry rings for another look."""
        if self.impatient:
            return self.impatience_rng.uniform(1.0, 8.0)
        return self.rng.uniform(0.2, 3.0)

    def _wait_for_a_running_job(self) -> None:
        """An impatient requester asks a running job (as ``ensure_job_running`` makes
        sure): it waits (a while) until a live driver's query runs."""
        deadline = self.scheduler.now + 300.0
        while self.scheduler.now < deadline and not any(
                job.alive and job.coordinator is not None and job.lease.failure is None
                for job in self.jobs):
            self.scheduler.sleep(1.0)

    def _requests(self) -> Iterable[tuple[str, bool]]:
        """The seed's requests (kind, whether a retry); with the seed's
        :attr:`retry_named_p` a request for the named savepoint is sent again at once
        when its first ended (a retried Airflow task asking for ``nightly`` again: never
        answered with the first one's savepoint)."""
        for kind in self.setup.requests:
            yield kind, False
            if kind == NAMED and self.retry_rng.random() < self.retry_named_p:
                self.coverage["named-request-retried"] += 1
                yield NAMED, True

    def _expire(self, storage: SimStorage, request_id: str) -> None:
        for _ in range(20):
            try:
                answer = expire_request(storage, JOB, request_id, "the requester gave up")
            except ObjectAlreadyExistsError:
                return
            except ControlAnswerLostError:
                self.coverage["control-answer-lost"] += 1
                return
            except StorageError:
                self.scheduler.sleep(2.0)
                continue
            if answer is None and LAYOUT.control_result(request_id) in self._orphans:
                self.violate(CONTROL, f"the requester of {request_id} took its own answer "
                             "for the only one, but the job had answered and cleaned up")
            return

    def _send(self, channel: ControlChannel, kind: str, timeout_s: float) -> str:
        if kind != NEWER:
            return channel.request_savepoint(
                stop=kind == STOP, timeout_s=timeout_s,
                requested_by="sim",
                savepoint_id=NAMED_SAVEPOINT if kind == NAMED else None).request_id
        # a request from a newer provider: a field this version does not know
        now = channel.clock()
        request_id = f"{int(now * 1000):013d}-{channel.ids().hex[:8]}"
        body = json.loads(ControlRequest(request_id, "savepoint", now,
                                         now + timeout_s).to_json())
        body["priority"] = "high"
        channel.storage.put_bytes(channel.layout.control_request(request_id),
                                  json.dumps(body).encode(), create_only=True)
        channel.storage.put_bytes(channel.layout.doorbell(request_id), b"", create_only=True)
        return request_id

    def vandal(self) -> None:
        """Damages (other bytes, same size) or deletes objects the job relies on."""
        sched = self.scheduler
        for _ in range(self.setup.damages):
            sched.sleep(self.rng.uniform(5.0, 80.0))
            if self.fault_rng.random() < self.whole_checkpoint_p:
                self._wrong_cleanup()
                continue
            keys = sorted(k for k in self.objects.objects
                          if k.startswith(f"{JOB}/shared/") or _checkpoint_of(k) is not None
                          or (k.startswith(f"{JOB}/chk-") and self.rng.random() < 0.3))
            if not keys:
                continue
            self._damage(self.rng.choice(keys))
        if self.cleanup:
            self._wrong_cleanup()

    def _wrong_cleanup(self) -> None:
        """An operator's wrong cleanup once the drivers are gone: every object of the
        newest checkpoint is damaged, so the recovery falls back past it, finding
        several keys damaged. Other bytes, never deleted (session 18): a deleted key is
        uploaded again anyway, so only stored damaged keys tell a fallback that distrusts
        some of them (``fallback-distrusts-first-key``) from one that distrusts all."""
        sched = self.scheduler
        while any(a.alive for a in sched.actors if a.name.startswith("driver")):
            sched.sleep(5.0)
        keys = self._newest_checkpoint_objects()
        if len(keys) > 1:
            self.coverage["wrong-cleanup"] += 1
        for key in keys:
            self._damage(key, keep=True)

    def _newest_checkpoint_objects(self) -> list[str]:
        """The objects the newest checkpoint uploaded (referenced by no older marker):
        a restore finds several keys damaged at once and falls back to an older one."""
        numbers = sorted({n for k in self.objects.objects if (n := _checkpoint_of(k)) is not None})
        manifests = [self.manifest(LAYOUT.checkpoint_metadata(n)) for n in numbers]
        if not manifests or manifests[-1] is None:
            return []
        older = {f.key for m in manifests[:-1] if m is not None for f in _objects_of(m)}
        # a set: merged files share one object (damaging it twice, the second time
        # after deleting it, killed the vandal: job seed 304536 on session 14's code)
        return sorted({key for f in _objects_of(manifests[-1]) if f.key not in older
                       and (key := f"{JOB}/{f.key}") in self.objects.objects})

    def _damage(self, key: str, delete: bool = False, keep: bool = False) -> None:
        """Other bytes of the same size (60 %), or the object deleted (or ``delete``);
        ``keep``: never deleted (the draw is made all the same: the schedule stays)."""
        sched = self.scheduler
        if not delete and (self.rng.random() < 0.6 or keep):
            data = self.objects.objects[key].data
            etag = self.objects.put(key, bytes((b + 1) & 0xFF for b in data) or b"x",
                                    sched.now, create_only=False, if_match=None,
                                    writer="vandal")
            self.vandalized[key] = etag
            sched.log(f"vandal damages {key}")
        else:
            self.objects.delete([key])
            self.vandalized[key] = None
            sched.log(f"vandal deletes {key}")
        self.coverage["damaged"] += 1

    def recovery(self) -> None:
        """The faultless driver that runs the job to its end (again after a stop)."""
        storage = SimStorage(self.objects, self.scheduler, tag="recovery")
        for life in range(1, 4):
            ended = self.run_life(0, f"recovery.{life}", "latest", storage, Host("recovery"))
            if ended != "stopped":
                self.recovered = ended
                return

    requests: dict[str, str]
    recovered = "never ran"

    # ------------------------------------------------------------------ the end

    def check_end(self) -> None:
        if self.lapsed_marker.played:
            self.coverage["lapsed-marker"] += 1
        self.check_failed_counted()
        self.check_damaged_references()
        self.check_verifies()
        self.check_control()
        if self.recovered != "finished":
            # job-uncounted also when the recovery's restore refused (it never got to
            # on_restored): a refusal judged by what counts must not hide a marker its
            # claim failed to adopt (job seed 140, marker-out-of-order)
            self._check_uncounted(self.endings[-1][0] if self.endings else "recovery")
            if self.check_refusal():
                return
            self.violate(JOB_OUTPUT, f"the recovery ended {self.recovered}")
            return
        self.check_output()

    def check_failed_counted(self) -> None:
        """``job-failed-counted``: a checkpoint the history records failed
        (``checkpoint_failed``) never counted (by the design's rule, at any step): its
        driver released its shared files and counted a failure, so a marker of it that
        a holder or a successor's adoption counts contradicts the history (a marker
        whose outcome is unknown is abandoned, never failed). A marker the vandal
        touched is no evidence: a repetition of the marker's create-only PUT that meets
        its own first copy damaged cannot tell it from another driver's, and fails the
        checkpoint as ``CONCURRENT_DRIVER`` (job seed 420262)."""
        for key, stored in self.objects.objects.items():
            if not (key.startswith(LAYOUT.history_prefix) and key.endswith(".json")):
                continue
            try:
                event = json.loads(stored.data)
            except ValueError:
                continue
            if isinstance(event, dict) and event.get("type") == CHECKPOINT_FAILED \
                    and event.get("id") in self._ever_counted \
                    and LAYOUT.checkpoint_metadata(event["id"]) not in self.vandalized:
                self.violate(FAILED_COUNTED, f"chk-{event['id']} is recorded failed "
                             f"({str(event.get('failure_message'))[:120]}) but its marker "
                             "counted")

    def check_refusal(self) -> bool:
        """Whether the recovery's failure is the documented refusal: no checkpoint that
        counts is intact (the vandal damaged each) at or above the retention floor
        (:meth:`reader_floor`; its highest): one below it is no candidate of
        ``restore=latest`` (a design decision, job seed 304536 on session 14's code:
        the refusal names the damaged files and ``restore=<chk-n>`` takes it)."""
        last = self.endings[-1][1] if self.endings else None
        if isinstance(last, SinkTransactionAbortedError):
            self.coverage["documented-refusal"] += 1
            return True
        if not isinstance(last, RestoreError) or isinstance(last, CorruptCheckpointError):
            return False
        floor = self.reader_floor()
        below = False
        for number in self.counting():
            key = LAYOUT.checkpoint_metadata(number)
            manifest = self.manifest(key)
            if manifest is None or self.damaged(manifest, key):
                continue
            if floor is None or number >= floor[1]:
                return False
            below = True
        self.coverage["documented-refusal"] += 1
        if below:
            self.coverage["refused-below-floor"] += 1
        return True

    def check_verifies(self) -> None:
        """``job-checkpoint-verifies`` in full: every intact counting checkpoint and
        savepoint materialises (sizes and checksums)."""
        keys = [LAYOUT.checkpoint_metadata(n) for n in self.counting()] + \
            [k for k in self.objects.objects
             if k.startswith(LAYOUT.savepoints_prefix) and k.endswith("/_metadata")]
        for key in keys:
            manifest = self.manifest(key)
            if manifest is None:
                if key not in self.vandalized:
                    self.violate(CHECKPOINT_VERIFIES, f"{key} cannot be read")
                continue
            if self.damaged(manifest, key):
                continue
            target = self.tmp / "verify"
            try:
                materialize(self.oracle, manifest, LAYOUT.root, target)
            except AirflowCkptError as exc:
                self.violate(CHECKPOINT_VERIFIES, f"{key} does not restore: {exc}")
            finally:
                shutil.rmtree(target, ignore_errors=True)

    def check_control(self) -> None:
        """``job-control``: every request answered once; the newer version's "failed";
        an answered request is not acted on again (see :meth:`_acted_after_answer`)."""
        objects = self.objects.objects
        self._acted_after_answer(objects)
        for key in [k for k in objects if k.startswith(LAYOUT.control_prefix)
                    and k.endswith(".json") and not k.endswith(".result.json")]:
            request_id = key[len(LAYOUT.control_prefix):-len(".json")]
            result = objects.get(LAYOUT.control_result(request_id))
            if result is None and request_id not in self.requests:
                self.coverage["request-outcome-unknown"] += 1  # its requester never knew
                continue
            if result is None:
                self.violate(CONTROL, f"request {request_id} "
                             f"({self.requests.get(request_id, '?')}) was never answered")
                continue
            body = json.loads(result.data)
            by_driver = result.writer != "client"
            if by_driver:
                self.coverage["control-answered"] += 1
            named = objects.get(LAYOUT.savepoint_metadata(str(body.get("savepoint_id"))))
            if by_driver and body.get("status") == "completed" and named is not None \
                    and named.written < objects[key].written:
                self.violate(CONTROL, f"request {request_id} answered completed by savepoint "
                             f"{body.get('savepoint_id')}, which was taken before the "
                             "request was made (another request's)")
            if self.requests.get(request_id) == NEWER and by_driver:
                self.coverage["newer-request-refused"] += 1
                if body.get("status") != "failed":
                    self.violate(CONTROL, f"the newer version's request {request_id} was "
                                 f"answered {body.get('status')}")

    def _acted_after_answer(self, objects: dict[str, Stored]) -> None:
        """A request's savepoint events stored after its answer come from triggers still
        in flight when it was answered: at most one per query run started before then
        (a driver life's first query, or a query restart), by the history's own events.
        A driver that takes an answered request for pending triggers it at every look."""
        events = []
        for key, stored in objects.items():
            if key.startswith(LAYOUT.history_prefix) and key.endswith(".json"):
                with contextlib.suppress(ValueError):
                    events.append((stored.written, json.loads(stored.data)))
        for key, result in objects.items():
            if not (key.startswith(LAYOUT.control_prefix) and key.endswith(".result.json")):
                continue
            request_id = key[len(LAYOUT.control_prefix):-len(".result.json")]
            runs = sum(1 for at, e in events if at <= result.written and (
                e.get("type") == "job_started" or (
                    e.get("type") == "restart" and e.get("level") == "query")))
            after = sum(1 for at, e in events if at > result.written
                        and e.get("request_id") == request_id
                        and e.get("type") in ("savepoint_completed", "savepoint_failed"))
            if after > runs:
                self.violate(CONTROL, f"request {request_id} acted on {after} times after "
                             f"its answer, by {runs} query run(s) started before it")

    def published(self) -> list[dict[str, Any]]:
        """Every published row (what a downstream reader sees)."""
        if self.setup.sink == "jsonl":
            return JsonLinesSink(self.oracle, SINK_PREFIX).committed_rows()
        reader = SimParquetSink(self.table_oracle, self.table_oracle, self.scheduler.uuid4,
                                self.tmp / "reader")
        rows: list[dict[str, Any]] = []
        for key in reader.committed_files():
            stored = self.table.objects.get(key)
            if stored is None:
                self.violate(JOB_OUTPUT, f"published file {key} is missing")
                continue
            rows += [json.loads(line) for line in stored.data.decode().splitlines() if line]
        return rows

    def check_output(self) -> None:
        """``job-output`` against the ground truth."""
        rows = self.published()
        seen = Counter(r["i"] for r in rows)
        exact = self.setup.mode == "EXACTLY_ONCE"
        lost = [i for i in range(len(self.records)) if not seen[i]]
        twice = sorted(i for i, c in seen.items() if c > 1)
        if lost or (exact and twice):
            self.violate(JOB_OUTPUT, f"published output wrong ({self.setup.mode}): lost "
                         f"{lost[:10]}, duplicated {twice[:10]}")
        if twice:
            self.coverage["at-least-once-duplicates"] += 1
        wrong = [r for r in rows if r["running"] != self.expected[r["i"]]]
        if wrong:
            r = wrong[0]
            self.violate(JOB_OUTPUT, f"record {r['i']}: running sum {r['running']}, "
                         f"truth {self.expected[r['i']]} (another state was resumed)")

    # ------------------------------------------------------------------ running

    def run(self) -> Outcome:
        sched = self.scheduler
        self.requests = {}
        sched.log(f"setup: {self.setup.describe()}; {self.contention.describe()}; "
                  f"{self.retention}; {self.uploads.describe()}; {self.landings.describe()}; "
                  f"{self.claim_race.describe()}; {self.overlap.describe()}; "
                  f"{self.replay.describe()}; {self.overtaking.describe()}; "
                  f"{self.fallback.describe()}; {self.lapsed_marker.describe()}")
        previous = job_module.CONTROL_POLL_S
        job_module.CONTROL_POLL_S = 20.0  # virtual seconds; the doorbell is heard sooner
        try:
            for number in range(1, self.setup.drivers + 1):
                sched.spawn(f"driver-{number}",
                            Host(f"driver-{number}", self.setup.skews[number - 1],
                                 self.setup.rates[number - 1]),
                            self.driver(number), crash_p=self.setup.crash_p,
                            pause_p=self.setup.pause_p, pause_s=PAUSE_S,
                            suspend_p=self.contention.suspend_p)
            sched.spawn("client", Host("airflow"), self.control_client)
            sched.spawn("vandal", Host("vandal"), self.vandal)
            try:
                with interleave.installed(interleave.LEASE_BEFORE_CLAIM, self.before_claim), \
                        interleave.installed(interleave.LEASE_BEFORE_CLAIM_PUT,
                                             self.stale_claim.before_claim_put), \
                        interleave.installed(interleave.LEASE_AFTER_CLAIM, self.after_claim), \
                        interleave.installed(interleave.LEASE_BEFORE_BEAT, self.before_beat), \
                        interleave.installed(interleave.COMPLETE_BEFORE_METADATA,
                                             self.before_marker_overlapped), \
                        interleave.installed(interleave.COMPLETE_BEFORE_ADD,
                                             self.before_add), \
                        interleave.installed(interleave.GC_BEFORE_DELETE,
                                             self.before_delete), \
                        interleave.installed(interleave.HISTORY_BEFORE_CREATE,
                                             self.before_history), \
                        interleave.installed(interleave.UPLOAD_BEFORE_FILE,
                                             self.before_upload):
                    sched.run()
                if not sched.cut_off:
                    self.recovering = True
                    recovery = sched.spawn("recovery", Host("recovery"), self.recovery)
                    sched.run()
                    if recovery.error is not None:
                        self.violate(DRIVER_ERROR, f"the recovery died of {recovery.error!r}")
            finally:
                sched.shutdown()
            for actor in sched.actors:
                if actor.error is not None and actor.name.startswith(("driver", "client")):
                    self.violate(DRIVER_ERROR, f"{actor.name} died of {actor.error!r}")
            if sched.cut_off:
                self.coverage["cut-off"] += 1
                self.violate(CUT_OFF, f"cut off at step {sched.max_steps}")
            else:
                self.check()
                self.check_end()
            if len(self._epochs_seen) >= 2:
                self.coverage["takeover"] += 1
        finally:
            job_module.CONTROL_POLL_S = previous
            shutil.rmtree(self.tmp, ignore_errors=True)
        return Outcome(sched.seed, self.setup, self.violations, sched.trace, sched.step,
                       sched.cut_off, "job",
                       Coverage.of(sched, self.objects, dict(self.coverage)))


def _objects_of(manifest: Manifest) -> list[FileEntry]:
    """The manifest's files stored as objects of their own (not inline in ``_metadata``)."""
    return [f for f in manifest.files if not f.is_inline]


def _counts_by(record: LeaseRecord, number: int) -> bool:
    """Whether checkpoint ``number``'s marker counts by ``record`` alone: adopted, the
    holder's own, or any (a record without adoption)."""
    if record.adopted is None or record.first_id is None:
        return True
    return number in record.adopted or number >= record.first_id


def _claim_epoch(key: str) -> int | None:
    """``simjob/lease/3.json`` -> 3."""
    name = key[len(LAYOUT.lease_prefix):-len(".json")]
    return int(name) if key.startswith(LAYOUT.lease_prefix) and key.endswith(".json") \
        and name.isdigit() else None


def _checkpoint_of(key: str) -> int | None:
    """``simjob/chk-7/_metadata`` -> 7."""
    head, _, tail = key.partition("/chk-")
    number, _, rest = tail.partition("/")
    return int(number) if head == JOB and rest == "_metadata" and number.isdigit() else None


def _scratch_dir() -> str | None:
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() else None


_LOCK = threading.Lock()  # one job world at a time: CONTROL_POLL_S is the module's


def run_job_seed(seed: int, plants: Iterable[str] = ()) -> Outcome:
    """Simulate the job world of one seed (it has no planted defects of its own:
    ``make mutants`` plants them in the real code)."""
    with _LOCK:
        return JobWorld(seed).run()
