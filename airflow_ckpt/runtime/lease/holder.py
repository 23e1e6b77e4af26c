"""JobLease: at most one driver writes a job's checkpoints, sink output and control answers.

Two drivers of one job would subsume each other's checkpoints, sweep each other's
in-flight files and commit each other's transactions. The lease is an epoch-numbered
object per holder, ``<job>/lease/<epoch>.json``, created with a create-only put, so of
two drivers taking over the same lease exactly one wins.

Safety argument (why a deposed driver cannot complete a checkpoint, delete a file or
commit output, however late its writes land; the invariants are listed in
docs/architecture.md with their tests). **Safety rests on the storage alone**: on
create-only and compare-and-swap writes and on the order of reads and writes against
one strongly consistent store, never on a timeout holding or on two hosts' clocks.

* **A takeover is claim, then look.** The successor first *claims* epoch ``e+1``
  (create-only: of two successors exactly one wins), then lists the completed
  checkpoints and records the ones it *adopts* in its record (compare-and-swap). Every
  completion marker that landed before its listing is adopted; one that lands later
  never counts (:func:`~airflow_ckpt.runtime.lease.record.valid_checkpoint_ids`).
* **A holder acts on what it wrote or read only after confirming.** After its
  completion marker is durable, and after the listings a collection, an abort or a
  commit rests on, the holder lists ``lease/`` (:meth:`JobLease.confirm`). If its epoch
  is still the newest, any successor's claim, and so its listing, comes later: the
  successor sees the marker (and adopts it) and sees nothing the successor will create.
  If a newer epoch exists, the holder stops without acting: what counts is the
  successor's decision. So a write of a deposed driver that lands minutes late can
  only be one it issued before it could have known; the layout makes each such write
  harmless (keys a successor never writes again: attempt- and epoch-scoped keys,
  create-only decisions; see docs/architecture.md, "Who writes what").
* **Liveness is judged without comparing clocks.** The holder rewrites its record every
  ``heartbeat_s`` with a new sequence number ``seq`` (compare-and-swap on its own
  record). An observer (the next driver, the Airflow trigger) calls a holder dead only
  after it saw the same ``(epoch, seq)`` for ``ttl_s + max_write_s`` of *its own*
  monotonic clock. No wall-clock timestamps of two hosts are ever compared.
* **The holder stops starting writes when it may have lost the lease** (the
  :meth:`JobLease.gate` of every :class:`~airflow_ckpt.runtime.storage.fenced.FencedStorage`
  write): once ``ttl_s - max_write_s`` passed since its last successful heartbeat
  started, a successor may be about to take over. This is for liveness (a stale
  holder gives way promptly); a heartbeat that is slow but succeeds keeps the lease, as
  writes wait for it instead of giving up.
* **Fast takeover after ``kill -9`` on the same machine**: a record whose holder ran in
  this boot, in this pid namespace, under a pid that is gone (or now belongs to a process
  started later) is free at once. Containers that share a hostname have different pid
  namespaces (or boot ids) and never steal each other's live lease.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace

from airflow_ckpt.errors import (
    ConcurrentDriverError,
    ConfigError,
    LeaseExpiredError,
    ObjectAlreadyExistsError,
    ObjectNotFoundError,
    PreconditionFailedError,
)
from airflow_ckpt.runtime import interleave
from airflow_ckpt.runtime.driver.process import HolderIdentity
from airflow_ckpt.runtime.lease.observer import LeaseObserver
from airflow_ckpt.runtime.lease.record import (
    DEFAULT_HEARTBEAT_S,
    DEFAULT_MAX_WRITE_S,
    DEFAULT_TTL_S,
    ID_BLOCK,
    Clock,
    LeaseRecord,
    lease_epochs,
    lease_key,
    read_epoch,
)
from airflow_ckpt.runtime.storage.base import CheckpointStorage
from airflow_ckpt.runtime.storage.layout import JobLayout

log = logging.getLogger("airflow_ckpt.lease")

#: (the previous holder's record) -> (completed ids this driver adopts, its first id);
#: judged against the previous record, as a reader did before this driver's claim
Adopt = Callable[[LeaseRecord | None], tuple[tuple[int, ...], int]]


class JobLease:
    """The exclusive right to write one job's checkpoints. Use ``with lease: ...``.

    :param ttl_s: how long a silent holder keeps the lease (observers wait
        ``ttl_s + max_write_s`` of their own time before taking over)
    :param heartbeat_s: how often the holder renews it
    :param max_write_s: the longest one storage write may take; the holder stops
        starting writes ``max_write_s`` before its lease could expire
    :param clock: the holder's monotonic clock (its validity, its waits)
    :param wall_clock: the record's display timestamps (``acquired_ts``,
        ``heartbeat_ts``); never read back to judge liveness
    :param sleep: how the holder waits while it watches a holder it may take over from
    """

    def __init__(
        self,
        storage: CheckpointStorage,
        job: str,
        owner: str,
        *,
        ttl_s: float = DEFAULT_TTL_S,
        heartbeat_s: float = DEFAULT_HEARTBEAT_S,
        max_write_s: float = DEFAULT_MAX_WRITE_S,
        clock: Clock = time.monotonic,
        wall_clock: Clock = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not 0 < heartbeat_s < ttl_s - max_write_s or max_write_s < 0:
            raise ConfigError("lease settings", {
                "lease": f"need 0 < heartbeat ({heartbeat_s:g} s) < ttl ({ttl_s:g} s) - "
                         f"max write time ({max_write_s:g} s)"})
        self.storage = storage
        self.prefix = JobLayout(job).lease_prefix
        self.job = job
        self.owner = owner
        self.ttl_s = ttl_s
        self.heartbeat_s = heartbeat_s
        self.max_write_s = max_write_s
        self.clock = clock
        self.wall_clock = wall_clock
        self.sleep = sleep
        self.record: LeaseRecord | None = None
        #: set when this driver must stop writing; ``failure`` says why
        self.lost = threading.Event()
        self.failure: ConcurrentDriverError | LeaseExpiredError | None = None
        #: called (in the renewing thread) after each successful claim or heartbeat
        self.on_renewed: Callable[[], None] | None = None
        self._valid_until = float("-inf")
        self._etag = ""  # of the record as we wrote it last (compare-and-swap)
        self._beating = threading.Condition()
        self._in_flight = False  # a heartbeat write is under way
        self._swapping = threading.Lock()  # one rewrite of our record at a time (_swap)
        self._unanswered: bytes | None = None  # our last record write of unknown outcome
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ taking it
    def acquire(self, wait_s: float | None = None, adopt: Adopt | None = None) -> LeaseRecord:
        """Take the lease, waiting up to ``wait_s`` for the holder to release or expire.

        The default wait is one full expiry (``ttl_s + max_write_s``) plus a heartbeat;
        a holder whose heartbeat moves meanwhile is alive, and the wait ends at once.
        ``adopt`` (given the previous holder's record) returns the completed checkpoint
        ids this driver takes over and its first checkpoint id. It runs before the
        claim (so readers never see a record without them) and again after it: the
        union is recorded with a compare-and-swap that also marks the record
        ``adoption_final``, so every marker that landed before the claim counts (see
        the module doc and :meth:`_adopt_late_markers`). Raises
        ``ConcurrentDriverError`` naming the holder if it stays alive.
        """
        budget = self.ttl_s + self.max_write_s + self.heartbeat_s if wait_s is None else wait_s
        deadline = self.clock() + budget
        observer = LeaseObserver(self.storage, self.job, self.clock)
        first_seen: tuple[int, int] | None = None
        while True:
            state = observer.poll()
            if state.free:
                previous = state.record
                adopted, first_id = adopt(previous) if adopt is not None else (None, None)
                interleave.point(interleave.LEASE_BEFORE_CLAIM)
                if max(lease_epochs(self.storage, self.job), default=0) > state.epoch:
                    # Another driver claimed since this poll judged the lease free: its
                    # epoch is judged like any holder's, never jumped over (two claims
                    # of different epochs from one judgement would both hold the job).
                    observer = LeaseObserver(self.storage, self.job, self.clock)
                    first_seen = None
                    continue
                interleave.point(interleave.LEASE_BEFORE_CLAIM_PUT)
                epoch = state.epoch + 1
                me = HolderIdentity.current()
                now = self.wall_clock()
                record = LeaseRecord(
                    epoch, self.owner, me.host, me.pid, now, now, ttl_s=self.ttl_s,
                    max_write_s=self.max_write_s, boot_id=me.boot_id, pid_ns=me.pid_ns,
                    start_ticks=me.start_ticks, adopted=adopted, first_id=first_id,
                    id_limit=None if first_id is None else first_id + ID_BLOCK,
                    adoption_final=adopt is None,
                )
                started = self.clock()
                try:
                    etag = self.storage.put_bytes(lease_key(self.prefix, epoch),
                                                  record.to_json(), create_only=True)
                except ObjectAlreadyExistsError:
                    observer = LeaseObserver(self.storage, self.job, self.clock)
                    first_seen = None
                    continue  # another driver took it first: watch the new holder
                self.record, self._etag = record, etag
                self.failure = None
                self.lost.clear()
                self._valid_until = started + self.ttl_s - self.max_write_s
                self._renewed()
                interleave.point(interleave.LEASE_AFTER_CLAIM)
                epochs = (self._adopt_late_markers(adopt, previous) if adopt is not None
                          else lease_epochs(self.storage, self.job))
                self.storage.delete_many(lease_key(self.prefix, e) for e in epochs if e < epoch)
                self._start_heartbeat()
                log.info("acquired the lease of job %s (epoch %d)%s", self.job, epoch,
                         f" from {previous.owner} ({state.status}, heartbeat unchanged "
                         f"for {state.unchanged_for_s:.0f} s)" if previous else "")
                assert self.record is not None
                return self.record
            holder = state.record
            assert holder is not None
            now = self.clock()
            first_seen = first_seen or (holder.epoch, holder.seq)
            # The heartbeat moved while we watched: the holder is alive, waiting for its
            # expiry is pointless. Only a silent holder is waited out.
            if now >= deadline or (holder.epoch, holder.seq) != first_seen:
                raise ConcurrentDriverError(
                    f"job {self.job!r} is being run by another driver ({holder.owner} on "
                    f"{holder.host}, pid {holder.pid}; its heartbeat moved within the last "
                    f"{state.unchanged_for_s:.0f} s). Stop that driver, or wait: a dead "
                    f"driver's lease expires {holder.ttl_s + holder.max_write_s:g} s after "
                    "its last heartbeat."
                )
            self.sleep(min(0.5, self.heartbeat_s, max(deadline - now, 0.01)))

    def _adopt_late_markers(self, adopt: Adopt, previous: LeaseRecord | None) -> list[int]:
        """After the claim: adopt the markers that landed between the first listing and
        the claim (a deposed holder's writes land when they land), and mark the record
        ``adoption_final``. From the claim on, no holder can confirm a marker any more,
        so this listing is final. The record's write is also a heartbeat
        (:meth:`_renew`): with slow lease PUTs, a second write that did not extend the
        validity the claim started made the first beat come too late. Returns the
        epochs its confirmation listed (the caller deletes the older records by them:
        one listing of ``lease/`` per takeover).

        Judged by ``previous``'s record, and when that holder never finished this same
        step (it died between its claim and its second look: its record adopts only
        what it listed before its claim, not a marker its predecessor completed and
        confirmed in between), also by each older record still stored, down to the
        first final one (:meth:`_judges`)."""
        assert self.record is not None and self.record.adopted is not None
        again = {n for judge in self._judges(previous) for n in adopt(judge)[0]}
        late = sorted(again - set(self.record.adopted))
        if late:
            log.info("job %s: adopting checkpoints %s whose markers landed during the "
                     "takeover", self.job, late)
        return self._renew(self.clock(), lambda r: replace(
            r, adopted=tuple(sorted({*(r.adopted or ()), *late})), adoption_final=True))

    def _judges(self, previous: LeaseRecord | None) -> list[LeaseRecord | None]:
        """The records the post-claim look judges markers by: ``previous`` as stored
        now, and while the one judged last is not ``adoption_final``, the next older
        record still stored.

        Why this is safe without a clock: a holder deletes the older records (and only
        then collects anything) after its own record became final, so an older record
        stored behind a non-final one was never swept, and nothing its holder's
        successors could have collected is gone: every marker it counts still names
        intact files. Read after our claim, a non-final predecessor can no longer
        collect either (its confirmation sees our epoch). Costs one GET, and one
        listing plus one GET per older record only when a claimant died mid-takeover.
        """
        if previous is None:
            return [None]
        current = read_epoch(self.storage, self.job, previous.epoch) or previous
        judges: list[LeaseRecord | None] = [current]
        if current.adoption_final:
            return judges
        for epoch in reversed(lease_epochs(self.storage, self.job)):
            if epoch >= current.epoch:
                continue
            older = read_epoch(self.storage, self.job, epoch)
            if older is None:
                continue
            judges.append(older)
            if older.adoption_final:
                break
        return judges

    def _swap(self, change: Callable[[LeaseRecord], LeaseRecord]) -> None:
        """Replace our record by ``change(current record)``, conditioned on the version we
        wrote last (nobody else writes an epoch's record; a mismatch means it was
        tampered with: we lose).

        The heartbeat thread and the coordinator (:meth:`reserve_ids`) both rewrite the
        record: one swap at a time, each built from the record the previous one wrote.
        Two swaps in flight at once would both be conditioned on the same version, and
        the loser's 412 would read as another driver's write (a final
        ``ConcurrentDriverError`` with no other driver anywhere).
        """
        interleave.point(interleave.LEASE_BEFORE_SWAP)
        with self._swapping:
            assert self.record is not None
            record = change(self.record)
            key = lease_key(self.prefix, record.epoch)
            try:
                try:
                    etag = self.storage.put_bytes(key, record.to_json(), if_match=self._etag)
                except PreconditionFailedError:
                    if not self._landed_unanswered(key):
                        raise
                    record = change(self.record)
                    etag = self.storage.put_bytes(key, record.to_json(), if_match=self._etag)
            except PreconditionFailedError as exc:
                self._lose(ConcurrentDriverError(
                    f"job {self.job!r}: the lease record of epoch {record.epoch} was changed "
                    f"or deleted by someone else ({exc}); this driver must stop"))
                assert self.failure is not None
                raise self.failure from exc
            except Exception:
                self._unanswered = record.to_json()  # it may land, or have landed
                raise
            self._unanswered = None
            self._etag = etag
            self.record = record

    def _landed_unanswered(self, key: str) -> bool:
        """Whether our record now holds our own earlier write whose answer was lost (an
        outcome-unknown heartbeat that did land): then that is the version we wrote
        last, and the swap goes on from it. Judged by the exact bytes, never by time."""
        if self._unanswered is None:
            return False
        try:
            current = self.storage.get_versioned(key)
        except ObjectNotFoundError:
            return False  # deleted by a successor's claim: nothing of ours landed there
        landed = LeaseRecord.from_json(current.data)
        if current.data != self._unanswered or landed is None:
            return False
        log.info("job %s: an earlier lease write whose answer was lost had landed", self.job)
        self._etag, self.record, self._unanswered = current.etag, landed, None
        return True

    # ------------------------------------------------------------------ holding it
    def gate(self) -> None:
        """Raise unless this driver may start a write now (see the module doc).

        A heartbeat in flight when the validity runs out is waited for (up to its
        ``max_write_s``): liveness is judged on what succeeded, so a slow heartbeat that
        succeeds keeps the lease."""
        if self.failure is not None:
            raise self.failure
        if self.record is None:
            raise ConcurrentDriverError(f"job {self.job!r}: the lease is not held")
        if self.clock() >= self._valid_until:
            with self._beating:
                self._beating.wait_for(lambda: not self._in_flight, self.max_write_s)
            if self.failure is not None:
                raise self.failure
        if self.clock() >= self._valid_until:
            self._lose(LeaseExpiredError(
                f"job {self.job!r}: no successful lease heartbeat for "
                f"{self.ttl_s - self.max_write_s:g} s (storage unreachable?); this driver "
                "stopped writing so that another one can take over safely"))
            assert self.failure is not None
            raise self.failure

    def check(self) -> None:
        """:meth:`gate`, and :meth:`confirm`."""
        self.gate()
        self.confirm()

    def confirm(self) -> None:
        """Raise ``ConcurrentDriverError`` if another driver claimed the job.

        Lists ``lease/``: if this driver's epoch is still the newest, every successor's
        claim, and so everything a successor writes, comes after this call. Call it
        after a write or a read that a decision rests on (a completion marker, the
        listing a collection deletes from) and before acting on it. Storage only: no
        clock is read.
        """
        self._confirmed_epochs()

    def _confirmed_epochs(self) -> list[int]:
        """:meth:`confirm`, returning the epochs it listed (ours the newest)."""
        if self.record is None:
            raise ConcurrentDriverError(f"job {self.job!r}: the lease is not held")
        epochs = lease_epochs(self.storage, self.job)
        if not epochs or epochs[-1] != self.record.epoch:
            self._lose(ConcurrentDriverError(
                f"job {self.job!r}: another driver took over the lease (epochs {epochs[-3:]}, "
                f"ours {self.record.epoch}); this driver must stop"))
            assert self.failure is not None
            raise self.failure
        return epochs

    def reserve_ids(self, checkpoint_id: int) -> None:
        """Make sure ``checkpoint_id`` is reserved in the lease record before it is used.

        Ids are reserved in blocks of :data:`ID_BLOCK` with a (gated) write of the
        record. A successor starts past the reserved range, so a deposed driver's
        in-flight checkpoint never shares an id with the successor's (in incremental
        mode a checkpoint may have no directory until its marker lands, so storage alone
        cannot tell which ids are taken), and ids never repeat, also after every
        checkpoint was discarded.
        """
        if self.record is None:
            raise ConcurrentDriverError(f"job {self.job!r}: the lease is not held")
        if self.record.id_limit is not None and checkpoint_id < self.record.id_limit:
            return
        self.gate()
        self._swap(lambda r: replace(r, id_limit=max(r.id_limit or 0, checkpoint_id + ID_BLOCK)))

    def _renew(self, started: float,
               change: Callable[[LeaseRecord], LeaseRecord] = lambda r: r) -> list[int]:
        """Write ``change(record)`` as the next heartbeat (``seq`` + 1), confirm, and only
        then extend the validity from ``started`` (a clock reading taken before the
        write was sent: a newer epoch means we were deposed, and nothing is extended).
        Returns the epochs the confirmation listed."""
        self._swap(lambda r: replace(change(r), seq=r.seq + 1, heartbeat_ts=self.wall_clock()))
        epochs = self._confirmed_epochs()
        self._valid_until = started + self.ttl_s - self.max_write_s
        self._renewed()
        return epochs

    def _renewed(self) -> None:
        if self.on_renewed is not None:
            self.on_renewed()

    def _lose(self, failure: ConcurrentDriverError | LeaseExpiredError) -> None:
        if self.failure is None:
            self.failure = failure
            log.error("%s", failure)
        self.lost.set()

    def _start_heartbeat(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._beat, name="ckpt-lease", daemon=True)
        self._thread.start()

    def beat(self) -> None:
        """One heartbeat: renew the record and extend the validity (raises on failure)."""
        started = self.clock()
        self.gate()
        assert self.record is not None
        with self._beating:
            self._in_flight = True
        try:
            interleave.point(interleave.LEASE_BEFORE_BEAT)
            self._renew(started)
        finally:
            with self._beating:
                self._in_flight = False
                self._beating.notify_all()

    def _beat(self) -> None:
        # Beats are spaced from their starts: a slow heartbeat does not delay the next.
        next_start = self.clock() + self.heartbeat_s
        while not self._stop.wait(max(next_start - self.clock(), 0.0)):
            next_start = self.clock() + self.heartbeat_s
            try:
                self.beat()
            except (ConcurrentDriverError, LeaseExpiredError):
                return  # _lose recorded it; the job stops
            except Exception:  # a storage hiccup: the next beat may still make it in time
                log.warning("lease heartbeat of job %s failed", self.job, exc_info=True)

    # ------------------------------------------------------------------ letting go
    def release(self) -> None:
        """Stop heartbeating and mark the lease released (the next driver need not wait)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self.record is not None and self.failure is None:
            try:
                self.check()
                self._swap(lambda r: replace(r, seq=r.seq + 1, released=True,
                                   heartbeat_ts=self.wall_clock()))
            except Exception:  # best effort: expiry frees it anyway
                log.warning("could not release the lease of job %s", self.job, exc_info=True)
        self.record = None
        self._valid_until = float("-inf")

    def __enter__(self) -> JobLease:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(Exception):
            self.release()
