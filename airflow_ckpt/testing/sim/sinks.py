"""The sink world of the simulation: exactly-once output under deposed drivers and older
restores (issue 19 items 1 and 2).

A supervisor starts 2-4 drivers of one job, one after the other or overlapping (a driver
Airflow declared dead that still runs, a second driver started by hand). Each driver
(host ``driver-<n>``, clocks skewed) runs the real classes over the simulated storage:

* a :class:`~airflow_ckpt.runtime.lease.holder.JobLease` (acquire waits for the holder's
  expiry on the simulated clock; heartbeats driven explicitly);
* a :class:`~airflow_ckpt.runtime.sinks.jsonl.JsonLinesSink` over a
  :class:`~airflow_ckpt.runtime.storage.fenced.FencedStorage` gated by the lease, fenced
  as the runtime fences it (``fence(lease.gate, lease.confirm)``) and handed the source
  offsets of each batch (``track_offsets``), so its decisions go through the real
  :class:`~airflow_ckpt.runtime.sinks.transactions.SinkTransactions` and
  :func:`~airflow_ckpt.runtime.sinks.offsets.check_replay`;
* restore: the latest completed checkpoint (falling back past one found damaged, for
  good), or for a submission's first query an explicit older one (then, as the runtime,
  an initial checkpoint at the restored batch right after the sink's recovery), then
  ``sink.recover`` with the restored checkpoint's pending transaction, then the replay
  of the batches after it,
  planned again from the source: the same end offsets as a batch planned before, or
  others (more input arrived, other batch sizing);
* a rescale (issue 29): an explicit older restore may rescale (:data:`RESCALE_P`, drawn
  from a generator of its own, so seeds that never rescale keep their schedules). Spark's
  repartition batch takes the restored batch ``b``'s id ``b+1`` (never staged), the life's
  batches run from ``b+2``, one id above the batch ids that first planned the same input
  (the life's *shift*), and its checkpoints carry that shift. Restores then choose among
  the checkpoints of the highest shift only (and no new start): the sinks find replays
  under ids shifted upwards; restoring a snapshot from before a rescale after the rescaled
  run published past it shifts them downwards, a documented limit (docs/sinks.md). A
  shifted life commits what the sink has pending, as the runtime does (a skipped replay
  has nothing); the others commit the batch they staged, as before;
* per batch: ``pre_commit`` (the rows are the source's numbers ``start..end-1``), a
  while later (the checkpoint interval) the checkpoint's completion marker (create-only,
  then ``lease.confirm()``, as the coordinator completes a checkpoint), then
  ``commit_batches`` of the transactions it lists; a storage error fails the query,
  which restarts in-process under the same lease. On a share of seeds
  (:data:`SPANS`, drawn on a generator of its own) a checkpoint interval spans several
  batches: a batch may pass without a checkpoint, and the next checkpoint lists every
  transaction staged since the last one, committed together (one lease confirmation
  for all of them, issue 26) and restored together;

A driver's writes may be delayed, get 503s, lose their answers or time out and land up
to :data:`HOLD_S` later (after a successor took over), and a driver may crash at any
step or stall past its lease. A share of seeds (:data:`RACE_SEEDS`, drawn on a generator
of their own so other seeds keep their schedules; they crash no driver) makes a deposed
driver race a successor on the same batch's records (:class:`RecordRace`): its host is
suspended at one place per seed (before or after reading a ``_txn/`` record, before a
record or outcome write past its gate and confirm, before sweeping a batch's staging)
until another driver changed that object or batch, so its lease gate still passes when
it wakes at the worst moment; or its transaction writes hang in the network past the
lease. With no other driver running, Airflow starts a replacement for the silent one.
Most other seeds (:data:`FRESH_SEEDS`, a generator of their own, few faults) race where
a successor's own work is at stake (:data:`FRESH_PLACES`): before a record staged over
the one read, or before sweeping an undecided batch's staging, waking once the
successor staged that batch afresh; or before listing the records, waking once another
driver changed one. The seeds without a record race hold a driver's record of a
staging in the network until that batch's staging was swept (:class:`LateRecord`), then
a user's run goes back to a checkpoint listing the batch (the ``sinks-late`` world, also:
a run that went back aborts a batch the newest checkpoint lists, its record swap held
until the next run judged that batch committable). Only checkpoints whose marker
was confirmed count (the ground truth of what a successor may restore).

Invariants, checked after every step against the source plan (the ground truth:
batch ``b`` planned from ``start`` to ``end`` holds exactly those numbers):

* ``sink-lost``: once a driver's ``commit(b)`` (or ``recover`` of the restored
  checkpoint) returned, ``part-b`` holds exactly the rows of the batch that driver
  staged (or restored): nothing lost, nothing else published (in a shifted life: or the
  decision of a batch id below holds exactly them: published under the id that first
  read them); and a driver's commit of a batch its completed checkpoint lists is never
  refused as aborted (:meth:`SinkWorld.commit`);
* ``sink-duplicate``: no source number is published twice;
* ``decision-changed``: a commit decision (``_committed/``) or a published part never
  changes nor disappears once written;
* ``sink-replay``: a replay of a committed batch is skipped only if it read the
  committed batch's offsets, and refused (``SinkReplayMismatchError``) only if it read
  others, never silently dropped (in a shifted life: skipped also when a decision below
  its id holds exactly its rows; refused only when none does; a ``pre_commit`` whose own
  attempt storage held as the batch's staged record was staged, not dropped, whatever a
  successor did to it since: :meth:`SinkWorld.check_replay`);
* ``sink-error``: a driver dies of nothing but a lost lease, an unreachable storage or
  a refused replay (not, e.g., ``CorruptCheckpointError``: a wedged sink);
* ``ungated-write``: every write a driver starts through its ``FencedStorage`` passed
  the lease's gate first.

Planted defects (``--plant``) restore the old behaviour of items 1 and 2:
``plain-txn-writes`` (the ``_txn/`` record written by plain overwrite, not create-only /
compare-and-swap) and ``no-offsets`` (transactions keyed by batch id alone).
"""

from __future__ import annotations

import builtins
import json
import random
import re
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

from airflow_ckpt.errors import (
    ConcurrentDriverError,
    EndpointUnreachableError,
    LeaseExpiredError,
    OutcomeUnknownError,
    SinkReplayMismatchError,
    SinkTransactionAbortedError,
)
from airflow_ckpt.runtime.lease.holder import JobLease
from airflow_ckpt.runtime.lease.record import DEFAULT_MAX_WRITE_S, DEFAULT_TTL_S
from airflow_ckpt.runtime.sinks.jsonl import JsonLinesSink
from airflow_ckpt.runtime.sinks.offsets import BatchOffsets
from airflow_ckpt.runtime.sinks.transactions import LOOK_DOWN, Transaction
from airflow_ckpt.runtime.storage.base import ObjectInfo, Versioned
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
    STORAGE_DAMAGED,
    STORAGE_HANG,
    STORAGE_LATE,
    STORAGE_LOST_ANSWER,
    STORAGE_MISSING,
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
from airflow_ckpt.testing.sim.scheduler import Actor, Crash, Host, Scheduler
from airflow_ckpt.testing.sim.storage import Faults, RacingView, SimObjects, SimStorage

JOB = "simjob"
SINK = "out"

SINK_LOST = "sink-lost"
SINK_DUPLICATE = "sink-duplicate"
DECISION_CHANGED = "decision-changed"
SINK_REPLAY = "sink-replay"
SINK_ERROR = "sink-error"
INVARIANTS = (SINK_LOST, SINK_DUPLICATE, DECISION_CHANGED, SINK_REPLAY, SINK_ERROR,
              UNGATED_WRITE)

#: the drivers' ``_txn/`` records are written by plain overwrite (item 1's old code)
PLANT_PLAIN_TXN = "plain-txn-writes"
#: the sink is handed no source offsets: transactions keyed by batch id alone (item 2)
PLANT_NO_OFFSETS = "no-offsets"
#: the sink is handed end offsets only, not where a batch started (issue 25 item 5)
PLANT_NO_STARTS = "no-starts"
PLANTS = (PLANT_PLAIN_TXN, PLANT_NO_OFFSETS, PLANT_NO_STARTS)

#: how long a driver's write that timed out may stay in the network (longer than a
#: lease's expiry: it lands after a successor took over)
HOLD_S = 2 * (DEFAULT_TTL_S + DEFAULT_MAX_WRITE_S)
#: the errors a driver may stop with (anything else is ``sink-error``)
#: lives of a driver's query: a storage error fails the query, which restarts in-process
#: (restore, recover, replay) under the same lease, as the runtime's restart strategy does
QUERY_LIVES = 3
#: ``SinkTransactionAbortedError``: the restored checkpoint lists a transaction an
#: earlier run's recovery aborted (e.g. a ``restore=none`` start): refused, as designed
EXPECTED = (ConcurrentDriverError, LeaseExpiredError, EndpointUnreachableError,
            SinkTransactionAbortedError)
SKEWS = (0.0, 0.0, 0.5, -0.5, 3600.0, -3600.0)
#: the sink world's fault sites (sim/buggify.py)
SITES = (STORAGE_503, STORAGE_LOST_ANSWER, STORAGE_LATE, STORAGE_HANG, STORAGE_DAMAGED,
         STORAGE_MISSING, SCHED_PAUSE, SCHED_CRASH, SCHED_CLOCK_JUMP, SCHED_SUSPEND, ACTORS_MORE,
         ACTORS_TOGETHER)
#: the ``sinks-late`` world's fault sites: its stories run without 503s, stalls and
#: host suspensions (see :data:`LATE_STORIES`)
LATE_SITES = tuple(s for s in SITES if s not in (STORAGE_503, SCHED_PAUSE, SCHED_SUSPEND))
#: base chance per turn of a host's clock stepping (when the seed enables it)
CLOCK_JUMP_P = 0.002
#: base chance, per gated write, that it hangs in the network past the lease (a deposed
#: driver's write that passed its gate in time; see sim/storage.py)
HANG_P = 0.08
#: base chance, per checkpoint a restore looks at, that it is damaged (half: missing)
DAMAGED_P = 0.15
#: chance that an explicit older restore rescales (``state_partitions``): its life's batch
#: ids shift by one (drawn from the world's ``rescales`` generator)
RESCALE_P = 0.7
#: chance that a submission's first query goes to an older checkpoint (if there is one)
#: whatever the seed's setup drew, drawn from the ``rescales`` generator: more rescales,
#: and the schedules of the seeds that draw none unchanged
RESCALE_OLDER_P = 0.3
#: the mildest faults a seed draws
CALM = Faults(0.01, 0.03, 0.01, HOLD_S, HANG_P)
#: chance per seed (drawn from the world's ``revisits`` generator) of the go-back-and-
#: return story: a submission goes back to an older checkpoint (its batches planned
#: again, mostly from other input), and a later one returns, explicitly, to the newest
#: checkpoint whose pending batch was planned again since: a user going back to the
#: earlier run's checkpoint (sinks seed 308234, one of 30,000 before: a restored batch
#: is committed only from the input it read). Such a seed runs three drivers at least.
REVISIT_P = 0.3
#: batch ids below a shifted replay where the invariants look for its rows (the sinks'
#: :data:`~airflow_ckpt.runtime.sinks.transactions.LOOK_DOWN`)
SHIFT_WINDOW = LOOK_DOWN


#: per seed (a generator of its own; none in the go-back-and-return story): the chance
#: that a batch passes without a checkpoint (the checkpoint interval spans more batches:
#: the next one commits them all)
SPANS = (0.0, 0.0, 0.5, 0.8)

#: the share of seeds whose drivers race a successor on the same batch's records
RACE_SEEDS = 0.7
#: per guard read / transaction write of such a seed: the chance it races
RACE_P = (0.3, 0.6, 1.0)
#: where a race seed's drivers race (one per seed; see :class:`RecordRace`)
RACE_PLACES = ("write", "write", "write", "swap", "swap", "read", "read", "list", "list",
               "after-read", "hang")
#: the share of the other seeds (no race drawn, not the go-back-and-return story) whose
#: drivers race where a successor's own work is at stake, drawn on a generator of their
#: own (the race seeds keep their places): right before a ``_txn/`` write that stages
#: an attempt over the record read (``supersede``), before sweeping an undecided batch's
#: staging (``list``), waking once another driver staged that batch afresh;
#: or before listing the ``_txn/`` records (``records``: a recovery about to count the
#: pending batches, after or before judging its restored ones), waking once another
#: driver changed a record (see :class:`RecordRace`)
FRESH_SEEDS = 0.8
FRESH_PLACES = ("supersede", "list", "records")
#: a ``records`` seed's chance per completed checkpoint that its driver dies before the
#: commit (the process killed between Flink's completion and ``notifyCheckpointComplete``)
COMPLETION_CRASH_P = 0.3
#: the faults of a :data:`FRESH_PLACES` seed: no 503s, a few late writes and lost answers
FRESH_FAULTS = Faults(0.0, 0.01, 0.01, HOLD_S, 0.01)
#: how long a :data:`FRESH_PLACES` racer may stay suspended (a successor first waits out
#: the racer's lease, then restores and replays up to the batch)
FRESH_HOLD_S = 3 * HOLD_S
#: the stories of the ``sinks-late`` world (:func:`run_late_sink_seed`), one per seed,
#: drawn on a generator of its own: ``supersede``: a driver's ``_txn/`` write staging an
#: attempt over an aborted record is held in the network until that attempt's staging
#: was swept (:class:`LateRecord`); ``create``: a deposed driver's record create is held
#: so, and its successor restores two batches below, rescaled; ``sweep``: the fresh
#: record race at ``list`` (:class:`RecordRace`)
LATE_STORIES = ("supersede", "supersede", "create", "sweep")
#: the share of ``sinks-late`` seeds telling the ``abort`` story instead (drawn on a
#: generator of its own, so the other seeds keep their stories and schedules): a run
#: that went back aborts a batch the newest completed checkpoint lists, its record swap
#: held in the network until a later run restoring that checkpoint judged the batch
#: committable (:class:`LateRecord`; sinks seed 401637 of session 18's scan)
LATE_ABORT_P = 0.25
#: a ``supersede`` seed's chance that a submission's first query goes to an older
#: checkpoint besides the ``rescales`` generator's
LATE_OLDER_P = 0.5
#: drivers started per race seed in place of one that went silent while no other ran
REPLACEMENTS = 2
#: a racing driver's host is suspended in steps of this, until another driver changed
#: the batch it works on
SUSPEND_STEP_S = 2.0
#: a key of a sink's batch: its record, outcome, decision or staging
_BATCH = re.compile(r"/(_txn|_outcome|_committed|_pending)/(\d{12})")
#: the prefix of a batch's whole staging (every attempt)
_STAGING = re.compile(r"/_pending/\d{12}/$")


class RecordRace:
    """A deposed driver racing its successor on one batch's transaction records. Each
    race seed draws one place where its drivers race (:data:`RACE_PLACES`), each driver
    races once, at that place, with the seed's chance each time it gets there:

    * ``read``, ``after-read``: its host is suspended right before, or right after, it
      reads a ``_txn/`` record (a commit about to read the record it decides from, an
      abort or a staging the record it supersedes);
    * ``write``: right before it sends a ``_txn/`` or ``_outcome/`` write (``swap``: a
      ``_txn/`` compare-and-swap only), past its gate and the confirm before it;
    * ``list``: right before it lists a batch's whole staging (to delete it);

    so only the confirm or the conditions of the writes that follow can stop it: its
    monotonic clock stopped, so its lease gate passes. The suspension lasts until
    another driver changed the object (once or twice) or the batch (1-5 times: record,
    outcomes, decision, staging), the worst moment to wake, or :data:`HOLD_S` at most.
    ``hang``: a record swap or outcome write that passed the gate hangs in the network
    past the lease. A driver races only while another one runs (a successor to race);
    with none, Airflow declares the silent driver dead and starts another
    (:data:`REPLACEMENTS` per seed). Drawn on a generator of its own.

    Of the other seeds, :data:`FRESH_SEEDS` race (a generator of their own) at one of
    :data:`FRESH_PLACES`: ``supersede`` (right before a ``_txn/`` write that stages an
    attempt over the record it read, whatever the write's condition: a replay of a
    batch whose record is in place) and ``list`` (an undecided batch's sweep) wake
    only once another driver staged the batch afresh (its ``_txn/`` record names an
    attempt whose staged data appeared during the suspension: a successor that
    restored before the batch and replays it, the moment its fresh record and data are
    at stake); ``records`` (right before listing the ``_txn/`` records while one is
    staged: a recovery about to count the pending batches) wakes once another driver
    changed a record 1-3 times (a successor that restored elsewhere, aborting the
    batches the racer's checkpoint lists)."""

    def __init__(self, seed: int, scheduler: Scheduler, objects: SimObjects,
                 replace: Callable[[], None]) -> None:
        self.rng = random.Random(f"sinks-record-race-{seed}")
        self.scheduler = scheduler
        self.objects = objects
        self.replace = replace  # starts one more driver (Airflow's replacement)
        self.replacements = REPLACEMENTS
        self.p = self.rng.choice(RACE_P) if self.rng.random() < RACE_SEEDS else 0.0
        self.place = self.rng.choice(RACE_PLACES)
        fresh = random.Random(f"sinks-record-race-fresh-{seed}")
        #: whether the seed races at one of :data:`FRESH_PLACES` (the other seeds' share)
        self.fresh = not self.p and fresh.random() < FRESH_SEEDS
        if self.fresh:
            self.p, self.place = fresh.choice(RACE_P), fresh.choice(FRESH_PLACES)
        #: whether a driver is suspended racing now (its successor is left to work)
        self.racing = False
        #: the drivers' hosts that raced once (woken, a racer runs on undisturbed)
        self.raced: set[str] = set()

    def race_fresh(self, place: str) -> None:
        """Race at ``place`` of :data:`FRESH_PLACES` on every chance (the ``sinks-late``
        world's ``sweep`` story)."""
        self.p, self.place, self.fresh = 1.0, place, True

    def hold_before_reads(self) -> None:
        """Race at ``read`` on every chance: the go-back-and-return story of the sinks
        world needs a completed checkpoint whose batch is not committed yet when
        another run goes back past it."""
        self.p, self.place, self.fresh = 1.0, "read", False

    def _races(self, places: tuple[str, ...]) -> bool:
        """Whether the calling driver races now, at one of ``places`` (drawn)."""
        current = self.scheduler.current()
        if (not self.p or self.place not in places or self.racing or current is None
                or current.host.name in self.raced):
            return False
        contended = self.contended()
        if (not contended and not self.replacements) or self.rng.random() >= self.p:
            return False
        self.raced.add(current.host.name)
        if not contended:
            self.replacements -= 1
            self.replace()
        return True

    def contended(self) -> bool:
        """Whether another driver runs beside the calling one (a successor to race)."""
        current = self.scheduler.current()
        return current is not None and any(
            actor.alive and actor.name.startswith("driver-") and actor.host != current.host
            for actor in self.scheduler.actors)

    def _watched(self, key: str, whole_batch: bool) -> dict[str, str]:
        """The ETags of the objects under ``key`` (an object or a prefix), or of every
        object of its batch (record, outcomes, decision, staging), as storage holds
        them now."""
        found = _BATCH.search(key)
        objects = self.objects.objects
        if not whole_batch or found is None:
            return {k: stored.etag for k, stored in objects.items() if k.startswith(key)}
        return {k: stored.etag for k, stored in objects.items()
                if (m := _BATCH.search(k)) is not None and m.group(2) == found.group(2)}

    def staged(self, prefix: str) -> bool:
        """Whether a staged ``_txn/`` record is stored under ``prefix`` (a listing of
        the records with a pending batch to count)."""
        return any(k.startswith(prefix) and b'"state": "staged"' in stored.data
                   for k, stored in self.objects.objects.items())

    def undecided(self, key: str) -> bool:
        """Whether ``key``'s batch has no commit decision."""
        found = _BATCH.search(key)
        return found is not None and (
            f"{key[:found.start()]}/_committed/{found.group(2)}.json" not in self.objects.objects)

    def _restaged(self, key: str, before: dict[str, str]) -> bool:
        """Whether ``key``'s batch is staged afresh: its ``_txn/`` record is staged and
        names an attempt with staged data not among ``before`` (the batch's objects
        when the racer fell asleep)."""
        found = _BATCH.search(key)
        if found is None:
            return False
        root, batch = key[:found.start()], found.group(2)
        stored = self.objects.objects.get(f"{root}/_txn/{batch}.json")
        if stored is None:
            return False
        record = json.loads(stored.data)
        staging = f"{root}/_pending/{batch}/{record['attempt']}"
        return record["state"] == "staged" and any(
            k.startswith(staging) and k not in before for k in self.objects.objects)

    def suspend(self, places: str | tuple[str, ...], key: str, what: str) -> None:
        """Maybe (at one of ``places``) suspend the calling driver's host (its
        monotonic clock stops) until another driver changed ``key`` once or twice, or
        its batch 1-5 times, or (a :data:`FRESH_PLACES` seed's ``supersede`` or
        ``list``) staged its batch afresh (or :data:`HOLD_S` at most)."""
        if not self._races((places,) if isinstance(places, str) else places):
            return
        whole_batch = self.rng.random() < 0.5
        changes = self.rng.randint(1, 5) if whole_batch else self.rng.randint(1, 3)
        restaged = self.fresh and self.place != "records"
        seen = self._watched(key, whole_batch or restaged)
        before = seen
        gone = 0.0
        self.racing = True
        try:
            while gone < (FRESH_HOLD_S if self.fresh else HOLD_S):
                self.scheduler.suspend(SUSPEND_STEP_S, what)
                gone += SUSPEND_STEP_S
                if restaged:
                    if self._restaged(key, before):
                        self.scheduler.log(f"wakes after {gone:g} s: another driver staged "
                                           "its batch afresh")
                        return
                    continue
                now = self._watched(key, whole_batch)
                changes -= sum(now.get(k) != etag for k, etag in seen.items()) + len(
                    now.keys() - seen.keys())
                seen = now
                if changes <= 0:
                    self.scheduler.log(f"wakes after {gone:g} s: another driver changed "
                                       + ("its batch" if whole_batch else key))
                    return
        finally:
            self.racing = False

    def hang(self, key: str) -> None:
        """Maybe hold a gated write in the network for longer than a lease."""
        if self._races(("hang",)):
            gone = self.rng.uniform(DEFAULT_TTL_S, HOLD_S)
            self.scheduler.log(f"{key}: the write hangs {gone:.1f} s in the network")
            self.scheduler.sleep(gone)


class LateRecord:
    """A driver's record of a staging whose answer is lost and which the network holds
    until another life or driver swept that batch's staging (sinks seed 346417 of
    session 16's scan: a supersede read before an abort landed after the sweep; sinks
    seed 315040 of session 15's: a deposed driver's record create landed after the
    holder's recovery swept the batch), then lands, its conditions judged then. One
    write held per seed of the ``sinks-late`` world, of its story
    (:data:`LATE_STORIES`):

    * ``supersede``: a staging over an aborted record of a batch a completed checkpoint
      lists. Its caller meets ``OutcomeUnknownError`` (the query restarts in-process
      and its recovery sweeps). Once it landed after the sweep, a user submits one more
      run going back to the newest checkpoint that lists that batch (one that read the
      input the held record names, if any): a restore that commits the batch from the
      record, if the record names the swept attempt;
    * ``create``: a driver's record create of the batch after one it published, while
      another driver runs: its caller waits for the answer (its lease expires), and the
      successor's recovery sweeps (:attr:`creating` names the batch meanwhile);
    * ``abort``: a recovery's record swap aborting a batch the newest completed
      checkpoint lists (a run that went back: an explicit older restore). Its caller
      waits for the answer (its lease expires); the next run to start restores the
      newest checkpoint (``restore=latest``; :attr:`aborting` names the batch
      meanwhile, and Airflow starts a driver if none runs), and the swap lands right
      after that run's recovery judged the batch committable (``require_committable``
      read the record staged: :meth:`judge`), before its commit reads the record
      (sinks seed 401637 of session 18's scan). The commit must refuse the batch
      (``SinkTransactionAbortedError``), never return as if it were published."""

    def __init__(self, story: str | None, scheduler: Scheduler, objects: SimObjects,
                 contended: Callable[[], bool], listed: Callable[[int], bool],
                 landed: Callable[[Transaction], None],
                 newest_lists: Callable[[int], bool] = lambda batch: False,
                 takeover: Callable[[], None] = lambda: None) -> None:
        self.story = story  # None: no write is held (the ``sinks`` world)
        self.listed = listed  # whether a completed checkpoint lists a batch
        #: whether the newest completed checkpoint (``restore=latest``'s) lists a batch
        self.newest_lists = newest_lists
        self.takeover = takeover  # Airflow starts a driver if none runs (``abort``)
        self.contended = contended  # whether another driver runs beside the caller
        self.scheduler = scheduler
        self.objects = objects
        self.landed = landed  # the follow-up: a run going back to a checkpoint listing it
        self.held = False  # one hold per seed
        #: the batch of a held create not landed yet (its successor restores below it)
        self.creating: int | None = None
        #: the batch of a held abort swap not landed yet (the next run restores latest)
        self.aborting: int | None = None
        #: the batches a recovery judged committable while an abort swap was held
        self.judged: set[int] = set()

    def holds(self, key: str, data: bytes, create_only: bool) -> Callable[[], bool] | None:
        """Whether the network holds this ``_txn/`` write: the condition it waits for
        (the staging of the attempt it records swept), or None."""
        if (self.story is None or self.held or create_only != (self.story == "create")
                or "/_txn/" not in key):
            return None
        txn = Transaction.from_json(data)
        if self.story == "abort":  # a staged record swapped to aborted (not one found
            # aborted already, its fence counted up) of a batch restore=latest judges
            stored = self.objects.objects.get(key)
            if (txn.state != "aborted" or stored is None or txn.replay
                    or Transaction.from_json(stored.data).state != "staged"
                    or not self.newest_lists(txn.batch)):
                return None
            self.held, self.aborting = True, txn.batch
            self.takeover()
            return lambda: txn.batch in self.judged
        if txn.state != "staged":
            return None
        root = key[:key.index('/_txn/')]
        staging = f"{root}/_pending/{txn.batch:012d}/{txn.attempt}"
        if not any(k.startswith(staging) for k in self.objects.objects):
            return None
        if create_only:  # a racer's create (another driver runs: a successor sweeps) of
            # the batch after one it published (a successor may skip that input's replay)
            if (not self.contended() or txn.batch < 2
                    or f"{root}/_committed/{txn.batch - 1:012d}.json" not in self.objects.objects):
                return None
            self.creating = txn.batch
        else:  # a staging over an aborted record (a batch a recovery aborted, replayed)
            # that a completed checkpoint lists (a later run may restore it)
            stored = self.objects.objects.get(key)
            if (stored is None or Transaction.from_json(stored.data).state != "aborted"
                    or not self.listed(txn.batch)):
                return None
        self.held = True
        return lambda: not any(k.startswith(staging) for k in self.objects.objects)

    def judge(self, driver: str, batches: Iterable[int]) -> None:
        """``driver``'s recovery judged ``batches`` committable (its
        ``require_committable`` returned): a held abort swap of one of them lands right
        after this step."""
        if self.aborting is not None and self.aborting in batches:
            self.judged.add(self.aborting)
            self.scheduler.log(f"{driver} judged batch {self.aborting} committable (its "
                               "record read staged; the abort swap is in the network)")

    def hold_answer(self, label: str, apply: Callable[[], str],
                    judged: Callable[[], bool]) -> str:
        """Hold ``apply`` (an abort's record swap) until ``judged()``: it lands right
        after the step that judged its batch, or after :data:`FRESH_HOLD_S` at most.
        The calling driver waits for its answer meanwhile (its lease expires); returns
        what ``apply`` returned, or raises what it raised."""
        sched = self.scheduler
        answer: list[str | Exception] = []

        def land() -> str:
            self.aborting = None
            try:
                answer.append(apply())
            except Exception as exc:
                answer.append(exc)
                return type(exc).__name__
            return ("applied after a recovery judged its batch committable" if judged()
                    else "applied")

        def watch() -> None:
            if not answer and judged():
                sched.log(f"deliver {label}: {land()}")

        sched.log(f"{label}: the write hangs in the network until a recovery judges its "
                  "batch")
        sched.observers.append(watch)
        sched.defer(label, lambda: "landed already" if answer else land(),
                    sched.now + FRESH_HOLD_S)
        while not answer:
            sched.sleep(SUSPEND_STEP_S)
        if isinstance(answer[0], Exception):
            raise answer[0]
        return answer[0]

    def wait(self, key: str, swept: Callable[[], bool]) -> None:
        """The calling driver waits for its write's answer (the network holds it) until
        ``swept()``, or :data:`FRESH_HOLD_S` at most; its lease expires meanwhile."""
        sched = self.scheduler
        sched.log(f"{key}: the write hangs in the network until its staging is swept")
        gone = 0.0
        while not swept() and gone < FRESH_HOLD_S:
            sched.sleep(SUSPEND_STEP_S)
            gone += SUSPEND_STEP_S

    def hold(self, label: str, apply: Callable[[], str], swept: Callable[[], bool],
             data: bytes) -> None:
        """Hold ``apply`` until ``swept()``: it lands right after the step that swept
        the staging (the worst moment: before anyone stages the batch again), or after
        :data:`FRESH_HOLD_S` at most."""
        sched = self.scheduler
        landed = [False]

        def land() -> str:
            landed[0] = True
            try:
                apply()
            except Exception as exc:
                return type(exc).__name__
            if not swept():
                return "applied"
            self.landed(Transaction.from_json(data))
            return "applied after the sweep of its attempt's staging"

        def watch() -> None:
            if not landed[0] and swept():
                sched.log(f"deliver {label}: {land()}")

        sched.observers.append(watch)
        sched.defer(label, lambda: "landed already" if landed[0] else land(),
                    sched.now + FRESH_HOLD_S)


class _RacingView(RacingView):
    """A driver's storage view whose transaction-record reads and writes race
    (:class:`RecordRace`)."""

    race: RecordRace
    late: LateRecord
    #: the condition the next write waits for in the network (:class:`LateRecord`)
    _held: Callable[[], bool] | None = None
    _holding = b""  # the bytes of that write

    @classmethod
    def racing(cls, view: SimStorage, race: RecordRace, late: LateRecord) -> _RacingView:
        racing = cls.of(view, race)
        racing.late = late
        return racing

    def checked_view(self, check: Callable[[str, str], None]) -> SimStorage:
        checked = super().checked_view(check)
        assert isinstance(checked, _RacingView)
        checked.late = self.late
        return checked

    def _write(self, op: str, key: str, apply: Callable[[], str]) -> str:
        held, self._held = self._held, None
        if held is None:
            return super()._write(op, key, apply)
        if self.late.story == "abort":  # its caller waits for the answer: a later run
            # restores the checkpoint listing the batch and judges it
            if self.checked is not None:
                self.checked(op, key)
            self._enter(op, key)
            try:
                result = self.late.hold_answer(f"late {op} {key}",
                                               self._tracked(op, key, apply), held)
            except Exception as exc:
                self._log(op, key, f"{type(exc).__name__} (landed late)")
                raise
            self._log(op, key, "ok (landed late)")
            return result
        if "create-only" in op:  # its caller waits for the answer: a successor sweeps
            self.late.wait(key, held)
            result = super()._write(op, key, apply)
            self.late.creating = None
            if held():
                self.scheduler.log(f"{key}: applied after the sweep of its attempt's staging")
            return result
        if self.checked is not None:
            self.checked(op, key)
        self._enter(op, key)
        self.late.hold(f"late {op} {key}", self._tracked(op, key, apply), held,
                       self._holding)
        self._log(op, key, "timeout (held in the network until its staging is swept)")
        raise OutcomeUnknownError(f"sim: {op} {key}: no answer (it may land later)")

    def get_bytes(self, key: str) -> bytes:
        if "/_txn/" in key:  # e.g. a commit about to read the record it decides from
            self.race.suspend("read", key, f"reading {key}")
        return super().get_bytes(key)

    def get_versioned(self, key: str) -> Versioned:
        if "/_txn/" in key:  # e.g. an abort about to read the record it aborts
            self.race.suspend("read", key, f"reading {key}")
        try:
            return super().get_versioned(key)
        finally:
            if "/_txn/" in key:
                self.race.suspend("after-read", key, f"its next request, after reading {key}")

    def list(self, prefix: str = "") -> builtins.list[ObjectInfo]:
        if _STAGING.search(prefix) and (not self.race.fresh or self.race.undecided(prefix)):
            # a recovery or abort about to sweep a batch's staging (a fresh race: a batch
            # a successor will stage again, not one published)
            self.race.suspend("list", prefix, f"listing {prefix}")
        if prefix.endswith("/_txn/") and self.race.place == "records" and self.race.staged(prefix):
            # e.g. a recovery about to count the pending batches it judged
            self.race.suspend("records", prefix, f"listing {prefix}")
        return super().list(prefix)

    def put_bytes(self, key: str, data: bytes, *, create_only: bool = False,
                  if_match: str | None = None) -> str:
        if "/_txn/" in key or "/_outcome/" in key:
            # passed its gate (and the confirm before it): the host stops before sending
            swap = "/_txn/" in key and if_match is not None
            # a record staged over the one read (whatever the write's condition)
            supersede = ("/_txn/" in key and not create_only
                         and json.loads(data)["state"] == "staged")
            places = ("swap",) if swap else ("write",)
            self.race.suspend((*places, "supersede") if supersede else places, key,
                              f"writing {key}")
        if ("/_txn/" in key and if_match is not None) or "/_outcome/" in key:
            self.race.hang(key)
        if "/_txn/" in key:
            self._held, self._holding = self.late.holds(key, data, create_only), data
        return super().put_bytes(key, data, create_only=create_only, if_match=if_match)


class _ManualLease(JobLease):
    """The real lease without its heartbeat thread: the driver actor beats explicitly."""

    def _start_heartbeat(self) -> None:
        return None


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A completed checkpoint (marker written and confirmed): the batch it covers, that
    batch's planned offsets and the transaction it leaves pending (the batch itself:
    committed once the checkpoint completed)."""

    checkpoint_id: int
    batch: int
    start: int
    end: int
    driver: int
    #: batch ids above the ones that first planned the same input (a rescale's each)
    shift: int = 0
    #: whether it lists the batch's transaction (not a rescale's repartition batch's,
    #: nor, in a shifted life, a replay the sink skipped)
    staged: bool = True
    #: the transactions of batches before ``batch`` it lists too, (batch, start, end):
    #: staged since the life's previous checkpoint (the interval spanned them)
    earlier: tuple[tuple[int, int, int], ...] = ()

    @property
    def transactions(self) -> tuple[tuple[int, int, int], ...]:
        """Every transaction it lists (committed by its completion or by a restore)."""
        return (*self.earlier, *(((self.batch, self.start, self.end),) if self.staged else ()))


@dataclass(frozen=True, slots=True)
class SinkSetup:
    """One seed's sink system (drawn from the seed)."""

    drivers: int
    skews: tuple[float, ...]
    faults: Faults
    crash_p: float
    stall_p: float
    older_restore_p: float
    same_offsets_p: float
    new_start_p: float
    plants: frozenset[str] = frozenset()

    @classmethod
    def draw(cls, rng: random.Random, plants: Iterable[str] = (),
             swarm: Swarm | None = None) -> SinkSetup:
        drivers = driver_count(rng, swarm)
        return cls(
            drivers=drivers,
            skews=tuple(rng.choice(SKEWS) for _ in range(drivers)),
            faults=rng.choice((CALM,
                               Faults(0.02, 0.06, 0.02, HOLD_S, HANG_P),
                               Faults(0.02, 0.12, 0.02, HOLD_S, HANG_P))),
            crash_p=rng.choice((0.0, 0.01, 0.03)),
            stall_p=rng.choice((0.02, 0.05, 0.1)),
            older_restore_p=rng.choice((0.0, 0.3, 0.6)),
            same_offsets_p=rng.choice((0.3, 0.7, 1.0)),
            new_start_p=rng.choice((0.0, 0.5, 1.0)),
            plants=frozenset(plants),
        )

    @property
    def skewed(self) -> bool:
        return any(self.skews)

    def describe(self) -> str:
        return (f"sinks: {self.drivers} drivers (clocks {', '.join(f'{s:+g}' for s in self.skews)}"
                f" s), faults {self.faults}, crash p {self.crash_p}, stall p {self.stall_p}, "
                f"older restore p {self.older_restore_p}, same offsets p "
                f"{self.same_offsets_p}, new start p {self.new_start_p}"
                + (f", planted {sorted(self.plants)}" if self.plants else ""))


class SinkWorld(Judged):
    """The simulated sink system of one seed (see the module doc)."""

    def __init__(self, seed: int, plants: Iterable[str] = (), max_steps: int = 6000,
                 late: bool = False) -> None:
        self.scheduler = Scheduler(seed, max_steps=max_steps,
                                   sites=LATE_SITES if late else SITES,
                                   clock_jump_p=CLOCK_JUMP_P)
        self.rng = self.scheduler.rng
        self.setup = SinkSetup.draw(self.rng, plants, self.scheduler.swarm)
        self.objects = SimObjects()
        self.race = RecordRace(seed, self.scheduler, self.objects, self.replace_driver)
        #: the ``sinks-late`` world's story of this seed (:data:`LATE_STORIES`), or None
        self.story = (random.Random(f"sinks-late-story-{seed}").choice(LATE_STORIES)
                      if late else None)
        if late and random.Random(f"sinks-late-abort-{seed}").random() < LATE_ABORT_P:
            self.story = "abort"
        self.world = "sinks-late" if late else "sinks"
        #: the go-back-and-return story (:data:`REVISIT_P`): a generator of its own, so
        #: the seeds without it keep their schedules; ``went_back``: its first step done
        self.revisits = random.Random(seed ^ 0x2E715)
        self.revisiting = self.revisits.random() < REVISIT_P and not late
        self.went_back = False
        if late:  # one story per seed (the record race only as the ``sweep`` story's),
            # with three drivers at least and few faults (a story of several steps)
            self.race.p, self.race.fresh = 0.0, False
            if self.story == "sweep":
                self.race.race_fresh("list")
            drivers = max(self.setup.drivers, 3)
            self.setup = replace(self.setup, drivers=drivers, faults=FRESH_FAULTS,
                                 skews=(*self.setup.skews, 0.0, 0.0)[:drivers], stall_p=0.0)
        if self.revisiting:  # the checkpoint's own driver is held before its commit
            self.setup = replace(self.setup, drivers=max(self.setup.drivers, 3),
                                 skews=(*self.setup.skews, 0.0, 0.0)[:max(self.setup.drivers, 3)],
                                 same_offsets_p=min(self.setup.same_offsets_p, 0.3),
                                 stall_p=0.0, faults=CALM)  # a story of four steps
            self.race.hold_before_reads()
        self.started = self.setup.drivers  # drivers started (the supervisor's, replacements)
        if self.race.p and not self.race.fresh:
            # the successor lives to work on the racer's batch
            self.setup = replace(self.setup, crash_p=0.0)
        if self.race.fresh:  # a story of its own: few faults (a successor waiting out
            # the racer's lease polls the lease for a minute, and a single 503 ends its
            # wait; a hung write deposes it)
            self.setup = replace(self.setup, faults=FRESH_FAULTS, stall_p=0.0)
        #: a record held until its batch's staging was swept (:class:`LateRecord`: the
        #: ``supersede`` and ``create`` stories), and the runs going back after it
        #: landed: driver -> the late record (its first query restores a checkpoint
        #: listing it)
        self.late = LateRecord(self.story if self.story != "sweep" else None,
                               self.scheduler, self.objects, self.race.contended,
                               lambda batch: bool(self.listing(batch)), self.go_back,
                               self.newest_lists, self.take_over)
        self.gone_back: dict[int, Transaction] = {}
        #: a ``supersede`` seed's chance per first query of an older restore (a generator
        #: of its own)
        self.older = random.Random(f"sinks-late-older-{seed}")
        #: a ``records`` seed's drivers may die between a checkpoint's completion and its
        #: commit (:data:`COMPLETION_CRASH_P`, a generator of its own), so a recovery
        #: finds the checkpoint's batches staged; the racer's successor goes elsewhere
        #: (a user's explicit older restore), aborting what the racer's checkpoint lists
        self.completion_crashes = random.Random(f"sinks-completion-crash-{seed}")
        self.completion_crash_p = 0.0
        if self.story == "supersede":  # a checkpoint that lists a batch a later recovery
            # aborts (a run that went back, or started anew into the same output, as at
            # sinks seed 346417), replayed from the same input
            self.completion_crash_p = COMPLETION_CRASH_P
            self.setup = replace(self.setup, older_restore_p=max(self.setup.older_restore_p,
                                                                 0.3), same_offsets_p=1.0)
        if self.story == "abort":  # the newest checkpoint lists a batch not committed
            # yet (its driver died before the commit), and a run goes back past it
            self.completion_crash_p = COMPLETION_CRASH_P
            self.setup = replace(self.setup, older_restore_p=max(self.setup.older_restore_p,
                                                                 0.3), new_start_p=0.0)
        if self.story == "create":  # the successor's rescaled life replays the batches
            # its predecessor published (the same plans): skipped, under shifted ids
            self.setup = replace(self.setup, same_offsets_p=1.0, crash_p=0.0)
        if self.race.fresh and self.race.place == "records":
            self.completion_crash_p = COMPLETION_CRASH_P
            self.setup = replace(self.setup, older_restore_p=0.6, new_start_p=0.5,
                                 crash_p=0.0)
        self.base = SimStorage(self.objects, self.scheduler, tag="oracle", oracle=True)
        self.truth = JsonLinesSink(self.base, SINK)  # the harness's faultless reader
        self.checkpoints: list[Checkpoint] = []
        self.last_id = 0
        self.damaged: set[int] = set()  # checkpoints a restore found damaged
        self.floors: dict[int, int] = {}  # driver -> its run's initial checkpoint id
        #: driver -> where its run started, when not from the latest checkpoint
        self.origins: dict[int, tuple[Checkpoint | None, int, bool]] = {}
        #: whether an explicit older restore rescales: a generator of its own
        self.rescales = random.Random(seed ^ 0x5CA1E)
        #: the highest shift a life completed its initial checkpoint with: restores
        #: choose among the checkpoints of that shift (see the module doc)
        self.shift = 0
        self.plans: dict[int, list[tuple[int, int]]] = {}  # batch -> every (start, end)
        #: driver -> the batch it stages now: (batch, start, end)
        self.staging: dict[int, tuple[int, int, int]] = {}
        #: driver -> the restored batches its recovery judges (Spark's restored offsets log)
        self.recovering: dict[int, tuple[tuple[int, int, int], ...]] = {}
        #: whether a batch passes without a checkpoint: a generator of its own (not in
        #: the go-back-and-return story, whose schedules stay as they were)
        self.spans = random.Random(f"sinks-spans-{seed}")
        self.span_p = 0.0 if self.revisiting else self.spans.choice(SPANS)
        #: the world's own coverage counters (``--coverage``)
        self.coverage: Counter[str] = Counter()
        self.frozen: dict[str, str] = {}  # decision / part key -> its first ETag
        #: driver -> the id its sink drew for its latest ``pre_commit``'s attempt
        self.attempts: dict[int, str] = {}
        #: (batch, attempt) of every attempt storage ever held as a batch's staged
        #: ``_txn/`` record (seen after each step); ``_records``: each record's last ETag
        self.recorded: set[tuple[int, str]] = set()
        self._records: dict[str, str] = {}
        self.violations: list[Violation] = []
        self._seen_version = -1
        self.scheduler.observers.append(self.check_storage)

    # ------------------------------------------------------------------ ground truth

    def _rows(self, key: str) -> list[int] | None:
        stored = self.objects.objects.get(key)
        if stored is None:
            return None
        return [json.loads(line)["n"] for line in stored.data.decode().splitlines() if line]

    def published(self, batch: int) -> list[int] | None:
        """The numbers ``part-<batch>`` holds (None: not published)."""
        return self._rows(self.truth.part_key(batch))

    def decided(self, batch: int) -> list[int] | None:
        """The numbers of the attempt the batch's commit decision names (published, or
        still staged), None if there is no decision or its data is gone."""
        decision = self.truth.transactions.decision(batch)
        if decision is None:
            return None
        rows = self.published(batch)
        if rows is not None:
            return rows
        return self._rows(self.truth._staging(batch, decision["attempt"]))

    def check_storage(self) -> None:
        """``decision-changed`` and ``sink-duplicate`` over what storage holds, and the
        records it names (:meth:`watch_records`): once per change of storage."""
        if self.objects.version == self._seen_version:
            return
        self._seen_version = self.objects.version
        self.watch_records()
        objects = self.objects.objects
        for key, stored in objects.items():
            if key.startswith((f"{SINK}/_committed/", f"{SINK}/part-")):
                first = self.frozen.setdefault(key, stored.etag)
                if first != stored.etag:
                    self.violate(DECISION_CHANGED, f"{key} was written again with other bytes")
        gone = sorted(k for k in self.frozen if k not in objects)
        if gone:
            self.violate(DECISION_CHANGED, f"deleted after it was written: {', '.join(gone)}")
        seen: dict[int, str] = {}
        for key in sorted(objects):
            if key.startswith(f"{SINK}/part-"):
                for n in self._rows(key) or []:
                    if n in seen:
                        self.violate(SINK_DUPLICATE, f"number {n} published in {seen[n]} "
                                     f"and in {key}")
                    seen[n] = key

    def watch_records(self) -> None:
        """Note every attempt a batch's ``_txn/`` record names as staged (the ground
        truth of whether a ``pre_commit`` recorded its attempt, whatever happened to
        the record since)."""
        for key, stored in self.objects.objects.items():
            if (key.startswith(f"{SINK}/_txn/") and key.endswith(".json")
                    and self._records.get(key) != stored.etag):
                self._records[key] = stored.etag
                record = json.loads(stored.data)
                if record["state"] == "staged" and not record.get("replay"):
                    self.recorded.add((record["batch"], record["attempt"]))

    def attempt_ids(self, driver: int) -> Callable[[], uuid.UUID]:
        """The sink's id source for ``driver`` (the scheduler's): notes the id each
        ``pre_commit`` draws for its attempt."""
        def fresh() -> uuid.UUID:
            drawn = self.scheduler.uuid4()
            self.attempts[driver] = drawn.hex
            return drawn
        return fresh

    def decided_below(self, batch: int, rows: list[int], *, start_only: bool = False
                      ) -> int | None:
        """The batch id below ``batch`` (within :data:`SHIFT_WINDOW`) whose decision
        holds exactly ``rows`` (``start_only``: starts where they start), or None."""
        for below in range(batch - 1, max(batch - 1 - SHIFT_WINDOW, -1), -1):
            decided = self.decided(below)
            if decided and (decided[0] == rows[0] if start_only else decided == rows):
                return below
        return None

    def check_published(self, batch: int, start: int, end: int, what: str,
                        shifted: bool = False) -> None:
        """``sink-lost``: after ``what`` returned, ``part-<batch>`` is exactly the plan
        (``shifted``: or a decision below it is)."""
        rows = self.published(batch)
        planned = list(range(start, end))
        if shifted and rows != planned and self.decided_below(batch, planned) is not None:
            return
        if rows != planned:
            self.violate(SINK_LOST, f"{what}, which read numbers {start}..{end - 1}, returned; "
                         + ("nothing is published" if rows is None else
                            f"part-{batch} holds {_span(rows)}"))

    def check_replay(self, batch: int, start: int, end: int, refused: bool,
                     offsets: BatchOffsets | None = None, shifted: bool = False,
                     attempt: str | None = None) -> None:
        """``sink-replay``: a skip only over the same numbers, a refusal only over
        others. A ``pre_commit`` that returned while the batch's record is its own
        staging (``offsets``: what it read) was staged, not dropped: a deposed driver
        read no decision, its create-only record landed late, after the successor's
        decision and ``finish`` deleted the record (seed 104949). Such a staging is
        never published as this batch: the driver's next checkpoint confirms the lease
        and raises, and a commit of it would publish the decided attempt, which
        ``sink-lost`` judges against the plan; a later recovery rolls the decision
        forward over the stale record.

        Nor was a ``pre_commit`` that returned after storage held its own ``attempt``
        (the id it drew) as the batch's staged record, whatever happened to the record
        since: a deposed driver recorded its attempt (no decision yet), was paused past
        its lease before deleting the attempt its record superseded, and a successor
        aborted its attempt and committed the batch from other input before it returned
        (sinks seed 366671). The same fate as above: never published as this batch."""
        if not refused and attempt is not None and any(
                b == batch and attempt.startswith(a) for b, a in self.recorded):
            current = self.truth.transactions.current(batch)
            if current is None or not attempt.startswith(current.attempt):
                self.coverage["pre-commits whose recorded attempt was superseded"] += 1
            return
        if not refused and offsets is not None:
            txn = self.truth.transactions.current(batch)
            if txn is not None and txn.state == "staged" and txn.offsets == offsets:
                return
        decided = self.decided(batch)
        planned = list(range(start, end))
        if shifted and decided != planned:
            below = self.decided_below(batch, planned)
            if below is not None:
                if refused:
                    self.violate(SINK_REPLAY, f"batch {batch} ({start}..{end - 1}) was refused, "
                                 f"but batch {below} published exactly its rows (shifted id)")
                else:
                    self.scheduler.log(f"the replay of batch {batch} read what batch {below} "
                                       "published: skipped (shifted id)")
                return
            if refused and decided is None and self.decided_below(
                    batch, planned, start_only=True) is not None:
                return  # a batch below started there and read other rows: refused
        if refused and (decided is None or decided == planned):
            self.violate(SINK_REPLAY, f"batch {batch} ({start}..{end - 1}) was refused as a "
                         "replay of other offsets, but " + (
                             "it has no commit decision" if decided is None else
                             "its committed batch read the same"))
        if not refused and decided == planned:
            self.scheduler.log(f"the replay of committed batch {batch} read the same "
                               "offsets: skipped")
        if not refused and decided is not None and decided != planned:
            self.violate(SINK_REPLAY, f"the replay of committed batch {batch} read numbers "
                         f"{start}..{end - 1}, the committed batch {_span(decided)}; it was "
                         "dropped silently (neither published nor refused)")

    # ------------------------------------------------------------------ actors

    def plan(self, batch: int, start: int) -> int:
        """The end offset of ``batch`` planned from ``start``: an earlier plan's end
        (the same offsets, or from another start the same end offset: a range source
        reaching the end a batch reached before from an earlier start) or a new one."""
        earlier = [e for s, e in self.plans.get(batch, []) if e > start]
        if earlier and self.rng.random() < self.setup.same_offsets_p:
            end = self.rng.choice(earlier)
        else:
            end = start + self.rng.randint(1, 3)
        self.plans.setdefault(batch, []).append((start, end))
        return end

    def offsets_of(self, driver: int) -> Callable[[int], BatchOffsets | None]:
        """The runtime's offsets reader for ``driver``: Spark's offsets log holds each
        source's end offset, and where the batch started (the previous entry's end, or
        the source's initial offset for batch 0)."""
        def read(batch: int) -> BatchOffsets | None:
            staging = self.staging.get(driver)
            if staging is None or staging[0] != batch:
                staging = next((r for r in self.recovering.get(driver, ()) if r[0] == batch),
                               None)
            if staging is None:
                return None
            _, start, end = staging
            starts = () if PLANT_NO_STARTS in self.setup.plants else (
                json.dumps({"end": start}),)
            return BatchOffsets((json.dumps({"end": end}),), starts=starts)
        return read

    def restore_target(self, explicit: bool, floor: int | None = None,
                       older: bool = False, revisit: bool = False
                       ) -> tuple[Checkpoint | None, bool]:
        """What a query restores, as :func:`~airflow_ckpt.runtime.restore.choose.restore` picks
        it, and whether it is an explicit (older) target. ``explicit``: this query may
        have been given one (a submission's first query: the operator's ``restore``;
        a restart in-process restores ``latest``). ``latest`` falls back past a newest
        checkpoint found damaged (for good: no later restore uses it), never below
        ``floor`` (the run's initial checkpoint: an in-process restart never resumes an
        older run's state). ``older``: an explicit target goes to an older checkpoint
        if there is one (the ``rescales`` generator's choice); ``revisit``: to the
        newest older one with a pending transaction whose batch was planned again from
        other input since (by a run that restored further back), if there is one."""
        usable = [c for c in self.checkpoints if c.checkpoint_id not in self.damaged
                  and (floor is None or c.checkpoint_id >= floor) and c.shift == self.shift]
        if explicit and len(usable) > 1:
            # planned again since from other input, by a run that restored further back
            replanned = [c for c in usable[:-1] if c.staged and any(
                plan != (c.start, c.end) for plan in self.plans.get(c.batch, ()))]
            if revisit and replanned:
                return replanned[-1], True
            if self.rng.random() < self.setup.older_restore_p:
                return self.rng.choice(usable[:-1]), True
            if older:  # one more, chosen by the rescales generator
                return self.rescales.choice(usable[:-1]), True
        while len(usable) > 1:
            if self.scheduler.chance(STORAGE_DAMAGED, DAMAGED_P):
                how = "damaged"
            elif self.scheduler.chance(STORAGE_MISSING, DAMAGED_P / 2):
                how = "missing an object"
            else:
                break
            self.damaged.add(usable[-1].checkpoint_id)
            self.scheduler.log(f"checkpoint {usable[-1].checkpoint_id} is {how}: fallback")
            usable.pop()
        return (usable[-1] if usable else None), False

    def complete_checkpoint(self, number: int, lease: JobLease, storage: FencedStorage,
                            batch: int, start: int, end: int, shift: int = 0,
                            staged: bool = True,
                            earlier: tuple[tuple[int, int, int], ...] = ()) -> Checkpoint:
        """The coordinator's completion: the marker (create-only, a fresh id), then
        ``lease.confirm()``; only then does the checkpoint count."""
        self.last_id += 1  # ids are never reused (the lease reserves them)
        checkpoint = Checkpoint(self.last_id, batch, start, end, number, shift, staged,
                                earlier)
        storage.put_bytes(JobLayout(JOB).checkpoint_metadata(checkpoint.checkpoint_id),
                          json.dumps({"batch": batch}).encode(), create_only=True)
        lease.confirm()
        self.checkpoints.append(checkpoint)
        self.scheduler.log(f"completed {checkpoint}")
        return checkpoint

    def driver(self, number: int) -> Callable[[], None]:
        def program() -> None:
            try:
                self._drive(number)
            except EXPECTED as exc:
                self.scheduler.log(f"stops: {type(exc).__name__}: {exc}")
            except Exception as exc:
                self.violate(SINK_ERROR, f"driver-{number} died of {type(exc).__name__}: {exc}")
        return program

    def _drive(self, number: int) -> None:
        sched, rng, setup = self.scheduler, self.rng, self.setup
        view = _RacingView.racing(self.base.view(setup.faults, f"driver-{number}", unconditional=(
            "/_txn/" if PLANT_PLAIN_TXN in setup.plants else None)), self.race, self.late)
        lease = _ManualLease(view, JOB, owner=f"driver-{number}", clock=sched.monotonic,
                             wall_clock=sched.wall_clock, sleep=sched.sleep)
        self.acquire(lease)
        storage = FencedStorage(*self.fence(view, lease.gate, f"driver-{number}"))
        sink = JsonLinesSink(storage, SINK, ids=self.attempt_ids(number))
        sink.fence(lease.gate, lease.confirm)
        if self.story == "abort":  # the harness notes each judgement (a held abort swap
            # lands right after it: :class:`LateRecord`)
            judge = sink.transactions.require_committable

            def judged(batches: Iterable[int],
                       offsets: Callable[[int], BatchOffsets | None] | None = None) -> None:
                batches = tuple(batches)
                judge(batches, offsets)
                self.late.judge(f"driver-{number}", batches)
            sink.transactions.require_committable = judged  # type: ignore[method-assign]
        if PLANT_NO_OFFSETS not in setup.plants:
            sink.track_offsets(self.offsets_of(number))
        for life in range(1, QUERY_LIVES + 1):
            try:
                if not self._query(number, lease, storage, sink, life == 1):
                    return  # refused: final for the run
                break
            except EndpointUnreachableError as exc:
                if life == QUERY_LIVES:
                    raise
                sched.log(f"the query failed ({type(exc).__name__}); it restarts in-process")
        if rng.random() < 0.7:
            lease.release()

    def _query(self, number: int, lease: JobLease, storage: FencedStorage,
               sink: JsonLinesSink, first: bool) -> bool:
        """One life of the driver's query (``first``: of its submission): restore,
        recover the sink, run batches. Returns False if the sink refused a replay (final
        for the run)."""
        sched, rng, setup = self.scheduler, self.rng, self.setup
        initial = 0  # where the source starts a query that restores nothing
        rescaled = False
        # an older restore, drawn apart so that seeds without one keep their schedules
        older = first and (self.rescales.random() < RESCALE_OLDER_P or (
            self.story in ("supersede", "abort") and self.older.random() < LATE_OLDER_P))
        goback = first and self.revisiting and not older and not self.went_back
        revisit = first and self.revisiting and not older and self.went_back
        restored: Checkpoint | None
        back = self.going_back(self.gone_back[number]) if (
            first and number in self.gone_back) else None
        below = self.below_create() if first and back is None else None
        latest = (self.newest() if first and back is None and below is None
                  and self.late.aborting is not None else None)
        if back is not None:  # a user's run after a late record
            restored, explicit = back, True
            sched.log(f"restores {restored} (explicit: it lists the late record's batch)")
        elif below is not None:  # a user's rescaled run while a record create is held
            restored, explicit, rescaled = below, True, True
            sched.log(f"restores {restored} (explicit, two batches below the held record "
                      "create), rescaled")
        elif latest is not None:  # the next run while an abort swap is held (restore=latest)
            restored, explicit = latest, False
            sched.log(f"restores {restored} (latest: it lists batch {self.late.aborting}, "
                      "whose abort is in the network)")
        elif not first and number in self.origins and number not in self.floors:
            # the run started elsewhere and its initial checkpoint never completed (in
            # the runtime that fails the attempt before any in-process restart, and the
            # supervisor resubmits the run from where it started): it starts over from
            # there, never from an older run's checkpoint
            restored, initial, rescaled = self.origins[number]
            explicit = True
            sched.log(f"starts over from its own start {restored} at offset {initial}")
        elif (first and rng.random() < setup.new_start_p and self.shift == 0 and not older
              and not self.revisiting):
            # restore=none into the same output, the source started elsewhere (e.g.
            # Kafka's startingOffsets earliest after a first run from latest)
            restored, explicit, initial = None, True, rng.randint(0, 3)
            sched.log(f"restore=none: starts anew at offset {initial}")
        else:
            restored, explicit = self.restore_target(first, self.floors.get(number),
                                                     older or goback, revisit)
            self.went_back = self.went_back or (goback and explicit)
            rescaled = (explicit and not self.revisiting and restored is not None
                        and restored.batch >= 0
                        and self.rescales.random() < RESCALE_P)
            sched.log(f"restores {restored}" + (" (explicit)" if explicit else "")
                      + (", rescaled" if rescaled else ""))
        if explicit:
            self.origins[number] = (restored, initial, rescaled)
        shift = (restored.shift if restored is not None else 0) + rescaled
        shifted = shift > 0
        # nothing restored, a new start's initial checkpoint or a repartition batch: no
        # transaction to commit
        listed = restored is not None and restored.batch >= 0 and restored.staged
        txns = restored.transactions if restored is not None and restored.batch >= 0 else ()
        self.recovering[number] = txns
        try:
            sink.recover(tuple(b for b, _, _ in txns))
        finally:
            self.recovering.pop(number, None)
        for txn in txns:
            assert restored is not None
            self.check_published(*txn, f"recover of checkpoint {restored.checkpoint_id}",
                                 shifted)
        if explicit:
            # the runtime's initial checkpoint: a restart with restore=latest resumes
            # this run, never the newer checkpoints it went back past nor (restore=none)
            # an older run's (batch -1: nothing ran yet, the source starts at `initial`)
            # (rescaled: at Spark's repartition batch, the restored batch's offsets)
            self.floors[number] = self.complete_checkpoint(
                number, lease, storage, *((restored.batch + rescaled, restored.start,
                                           restored.end) if restored is not None
                                          else (-1, initial, initial)),
                shift=shift, staged=listed and not rescaled,
                earlier=restored.earlier if restored is not None and not rescaled else ()
            ).checkpoint_id
            if rescaled:
                self.shift = max(self.shift, shift)
        batch, start = ((0, initial) if restored is None
                        else (restored.batch + 1 + rescaled, restored.end))
        #: the batches staged since the life's last checkpoint: (batch, start, end)
        window: list[tuple[int, int, int]] = []
        for _ in range(rng.randint(3, 16)):
            sched.sleep(rng.uniform(0.5, 4.0))
            if self.scheduler.chance(SCHED_PAUSE, setup.stall_p):
                sched.log("stalls past its lease")
                sched.sleep(rng.uniform(DEFAULT_TTL_S, HOLD_S))
            lease.beat()
            end = self.plan(batch - shift, start)  # as the batch id that first read it
            self.staging[number] = (batch, start, end)
            try:
                sink.pre_commit(batch, [{"n": n} for n in range(start, end)])
            except SinkReplayMismatchError as exc:
                sched.log(f"refused: {exc}")
                self.check_replay(batch, start, end, refused=True, shifted=shifted)
                return False  # final for the run
            self.check_replay(batch, start, end, refused=False,
                              offsets=self.offsets_of(number)(batch), shifted=shifted,
                              attempt=self.attempts.get(number))
            window.append((batch, start, end))
            sched.sleep(rng.uniform(0.5, 8.0))  # until the checkpoint that covers it
            lease.beat()
            if self.span_p and self.spans.random() < self.span_p:
                sched.log(f"batch {batch} passes without a checkpoint")
                batch, start = batch + 1, end
                continue  # the interval spans the next batch too
            # (what the sink has pending, as the runtime commits it; the other seeds'
            # unshifted lives commit their window, as before)
            pending = (sink.tracked_pending() if shifted or self.story is not None
                       else [b for b, _, _ in window])
            earlier = tuple(w for w in window if w[0] in pending and w[0] != batch)
            self.complete_checkpoint(number, lease, storage, batch, start, end, shift=shift,
                                     staged=batch in pending, earlier=earlier)
            if self.completion_crash_p and (
                    self.completion_crashes.random() < self.completion_crash_p):
                sched.log("dies between the checkpoint's completion and its commit")
                raise Crash("after a checkpoint's completion")
            self.commit(number, sink, [b for b in pending if b <= batch])
            for staged in window:
                self.check_published(*staged, f"driver-{number}'s commit of batch {staged[0]}",
                                     shifted)
            window = []
            batch, start = batch + 1, end
        return True

    def commit(self, number: int, sink: JsonLinesSink, batches: Sequence[int]) -> None:
        """``sink.commit_batches(batches)`` of batches the driver staged in this life,
        which its checkpoint (marker confirmed) lists: ``sink-lost`` if one is refused as
        aborted. Only a holder aborts an attempt, one it read before its confirm: a
        successor aborts this attempt after its claim, and then this driver's own
        confirm raises first; a predecessor's confirm after reading this attempt's
        record (written after this driver's claim) raises. A refusal is a counted
        checkpoint's output lost by another driver's abort."""
        if len(batches) > 1:
            self.coverage["checkpoints committing several batches"] += 1
            self.coverage["batches committed by them"] += len(batches)
        try:
            sink.commit_batches(batches)
        except SinkTransactionAbortedError as exc:
            self.violate(SINK_LOST, f"driver-{number}'s commit of batches {list(batches)}, "
                         f"which its completed checkpoint lists, was refused: {exc}")
            raise

    def supervisor(self) -> None:
        """Starts the drivers: the next one when the last ended, or earlier (it then
        waits for the lease, or gives up if the holder is alive)."""
        self.start_drivers(self.setup.drivers, self.spawn_driver)

    def spawn_driver(self, number: int) -> Actor:
        setup = self.setup
        return self.scheduler.spawn(
            f"driver-{number}", Host(f"driver-{number}", setup.skews[(number - 1) % setup.drivers]),
            self.driver(number), crash_p=setup.crash_p, pause_p=setup.stall_p / 10,
            pause_s=(DEFAULT_TTL_S, HOLD_S), suspend_p=setup.stall_p / 10)

    def replace_driver(self) -> None:
        """Airflow declares the calling driver dead (it went silent) and starts another
        (:class:`RecordRace`)."""
        self.started += 1
        self.scheduler.log(f"Airflow starts driver-{self.started} in its place")
        self.spawn_driver(self.started)

    def listing(self, batch: int) -> list[Checkpoint]:
        """The completed checkpoints a restore may choose that list ``batch``."""
        return [c for c in self.checkpoints if c.checkpoint_id not in self.damaged
                and c.shift == self.shift and any(b == batch for b, _, _ in c.transactions)]

    def newest(self) -> Checkpoint | None:
        """The newest completed checkpoint a restore may choose (``restore=latest``'s
        when none is found damaged), or None."""
        usable = [c for c in self.checkpoints if c.checkpoint_id not in self.damaged
                  and c.shift == self.shift]
        return usable[-1] if usable else None

    def newest_lists(self, batch: int) -> bool:
        """Whether :meth:`newest` lists ``batch``'s transaction."""
        newest = self.newest()
        return newest is not None and any(b == batch for b, _, _ in newest.transactions)

    def take_over(self) -> None:
        """:class:`LateRecord`'s ``abort`` story: the aborting driver waits for its
        swap's answer; if no other driver runs, Airflow declares it dead (it went
        silent) and starts another."""
        if not self.race.contended():
            self.replace_driver()

    def below_create(self) -> Checkpoint | None:
        """While a record create of batch ``B`` is held (:class:`LateRecord`'s
        ``create`` story): the newest checkpoint a restore may choose at batch ``B - 2``
        or below (a rescaled life from it replays ``B`` under a shifted id, reading what
        ``B - 1`` published: skipped), or None."""
        creating = self.late.creating
        if creating is None:
            return None
        below = [c for c in self.checkpoints if c.checkpoint_id not in self.damaged
                 and c.shift == self.shift and 0 <= c.batch <= creating - 2]
        return max(below, key=lambda c: (c.batch, c.checkpoint_id), default=None)

    def go_back(self, txn: Transaction) -> None:
        """:class:`LateRecord`'s follow-up, once ``txn`` landed after its attempt's
        staging was swept: a user stops the running drivers (cancels their runs: the
        processes end) and submits one more run, restoring (explicitly) the newest
        checkpoint that lists ``txn.batch``, one whose batch read ``txn``'s input if
        there is one (none: no run)."""
        if not self.listing(txn.batch):
            return
        for actor in self.scheduler.actors:
            if actor.alive and actor.name.startswith("driver-"):
                self.scheduler.log(f"a user stops {actor.name} (cancels its run)")
                self.scheduler.kill(actor)
        self.started += 1
        self.gone_back[self.started] = txn
        self.scheduler.log(f"a user submits driver-{self.started}, going back to a checkpoint "
                           f"listing batch {txn.batch}")
        self.spawn_driver(self.started)

    def going_back(self, txn: Transaction) -> Checkpoint | None:
        """The checkpoint a run going back after ``txn`` landed restores (chosen when
        its query starts, among the checkpoints of the highest shift): the newest that
        lists ``txn.batch``, one whose batch read ``txn``'s input if there is one."""
        listing = self.listing(txn.batch)
        ends = txn.offsets.sources if txn.offsets is not None else ()
        same = [c for c in listing if any(b == txn.batch and ends == (json.dumps({"end": e}),)
                                          for b, _, e in c.transactions)]
        chosen = same or listing
        return chosen[-1] if chosen else None

    def run(self) -> Outcome:
        sched = self.scheduler
        sched.log(f"setup: {self.setup.describe()}")
        self.supervise(Host("airflow"), self.supervisor, SINK_ERROR)
        self.check_storage()
        return Outcome(sched.seed, self.setup, self.violations, sched.trace, sched.step,
                       sched.cut_off, self.world,
                       Coverage.of(sched, self.objects, dict(self.coverage)))


def _span(rows: list[int]) -> str:
    """Numbers as ``a..b`` when contiguous."""
    if rows and rows == list(range(rows[0], rows[-1] + 1)):
        return f"{rows[0]}..{rows[-1]}"
    return str(rows)


def run_sink_seed(seed: int, plants: Iterable[str] = ()) -> Outcome:
    """Simulate the sink world of one seed."""
    return SinkWorld(seed, plants).run()


def run_late_sink_seed(seed: int, plants: Iterable[str] = ()) -> Outcome:
    """Simulate the ``sinks-late`` world of one seed: the sink world telling one of
    :data:`LATE_STORIES` (a record held in the network until its staging was swept,
    or the fresh race before a sweep), its other draws as the sink world's."""
    return SinkWorld(seed, plants, late=True).run()
