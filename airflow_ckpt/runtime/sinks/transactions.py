"""SinkTransactions: the one reader and writer of a two-phase-commit sink's records.

Layout under a sink's root (keys relative to it)::

    _txn/<batch>.json              the batch's transaction: its current attempt and state
    _committed/<batch>.json        the commit decision (create-only): the attempt published
    _outcome/<batch>.<attempt>     the attempt's outcome, ``commit`` or ``abort``
                                   (create-only: whichever lands first is the outcome)
    _txn/<batch>.<tag>.json        the same for an extra publication of the batch: a replay
    _committed/<batch>.<tag>.json  that read other offsets, under AT_LEAST_ONCE (``tag``:
                                   :attr:`BatchOffsets.tag` of the replay's offsets)

Why each write is safe however late it lands (a deposed driver's request may be held
by the network for minutes and land after a successor took over):

* **The transaction record is only ever replaced by compare-and-swap** (created
  create-only, then rewritten with ``If-Match`` on the version read): a staging that
  supersedes an earlier attempt, or an abort, conditioned on a version a successor has
  since replaced, fails instead of overwriting it. It is never deleted while the batch
  may be staged again: only once a commit decision exists (then a replay of the batch
  is dropped, so nothing writes the key again).
* **The commit decision is create-only** and its content is a function of the record
  it was taken from: two drivers deciding from the same record write the same bytes
  (the storage's equal-bytes rule makes that a success for both), and a decision never
  changes once made.
* **Decisions are taken only after confirming** (``confirm``: the job lease's
  :meth:`~airflow_ckpt.runtime.lease.holder.JobLease.confirm`) that no successor claimed the
  job since the record was read: a successor's records all come after its claim.
* **An attempt is committed or aborted, never both: its outcome object decides.** The
  confirmation says no successor had claimed when it was made, not when a write lands:
  a deposed driver's commit decision, held by the network past a takeover, used to
  land after the successor had aborted the attempt (record aborted, staging deleted)
  on the absent decision key, and name deleted data. So a commit first creates
  ``_outcome/<batch>.<attempt>`` = ``commit`` and an abort ``abort`` (create-only, one
  object per attempt, both writers' first write): whichever lands first is the
  attempt's outcome. A commit whose outcome is ``abort`` decides nothing; an abort that
  finds ``commit`` rolls the commit forward instead (the staging is still there: only
  an abort that won deletes it); a late decision can only follow a ``commit`` outcome,
  and then it carries the same bytes as the one the roll-forward wrote. The outcome of
  a committed attempt is deleted with its record; an aborted attempt's stays (one small
  object per attempt a recovery aborted), so that no late ``commit`` can land there.
* **Staged data lives under attempt-scoped keys** (``attempt`` is fresh per staging),
  so deleting an aborted attempt never touches another attempt's files.

Why a replay of a committed batch is skipped, refused or published as extra output, never
dropped blindly: the record and the decision carry the batch's source offsets
(:class:`~airflow_ckpt.runtime.sinks.offsets.BatchOffsets`); a batch id whose decision
exists is staged again only after a restore older than the sink's output (or, under
AT_LEAST_ONCE, after any failure), and then it is the same batch only if it read the same
offsets. One that read others is refused, or, where the
:class:`~airflow_ckpt.runtime.sinks.offsets.ReplayPolicy` publishes it, recorded as a
transaction of its own (``<batch>.<tag>``) with the same rules: its decision is
create-only and never changes, and a later replay with the same offsets is skipped.

Why a replay is also looked for under a lower batch id (issue 29): a rescale on restore
(``state_partitions``) appends Spark's repartition batch, which takes the restored
batch's offsets under the next id, so every later batch reads under an id one higher
than the batch that first read it. A batch's input is its start and end offsets, not
its id: after a discontinuity (the decision at the id started elsewhere, or there is
none and the id below did not end where the batch starts) the decisions below are read
for one that started where the batch starts (:meth:`SinkTransactions._published_elsewhere`,
at most :data:`LOOK_DOWN` GETs): the same end is published already (skipped), another
end is judged as above. The steady path sends no extra request: the object remembers
the newest batch id whose record or decision it wrote or read, with the offsets
recorded *at that id*. Reads and notes only: nothing new is written, so every rule
above stands as it was.
"""

from __future__ import annotations

import enum
import json
import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from airflow_ckpt.errors import (
    ObjectAlreadyExistsError,
    ObjectNotFoundError,
    PreconditionFailedError,
    SinkTransactionAbortedError,
)
from airflow_ckpt.runtime import interleave
from airflow_ckpt.runtime.sinks.offsets import REFUSE, BatchOffsets, ReplayPolicy, ReplayVerdict
from airflow_ckpt.runtime.storage.base import CheckpointStorage

log = logging.getLogger("airflow_ckpt.sinks")

TxnState = Literal["staged", "aborted"]
#: a sink's commit decision for a staged transaction (a pure function of it)
Describe = Callable[["Transaction"], dict[str, Any]]
#: compare-and-swap rounds before a record that keeps changing is reported
_SWAP_ROUNDS = 8
#: batch ids below a staged batch whose decisions a look for its input published under
#: another id reads at most (one GET each; a rescale shifts the ids by one)
LOOK_DOWN = 16


class AttemptOutcome(enum.Enum):
    """What became of a staged attempt: the first of the two to be stored wins."""

    COMMIT = "commit"
    ABORT = "abort"


@dataclass(frozen=True, slots=True)
class Transaction:
    """A batch's transaction record: the attempt staged last, its state, the sink's
    own description of the staged data (``payload``: e.g. the file list), the
    source offsets the batch read (None when the sink runs without the runtime), and
    ``replay``: "" for the batch's publication, the tag of an extra publication (a
    replay that read other offsets, published under AT_LEAST_ONCE) otherwise."""

    batch: int
    attempt: str
    state: TxnState
    payload: dict[str, Any] = field(default_factory=dict)
    offsets: BatchOffsets | None = None
    replay: str = ""

    def to_json(self) -> bytes:
        body = {"batch": self.batch, "attempt": self.attempt, "state": self.state,
                "payload": self.payload,
                "offsets": self.offsets.to_dict() if self.offsets else None}
        if self.replay:
            body["replay"] = self.replay
        return json.dumps(body, sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> Transaction:
        obj = json.loads(raw)
        if "payload" not in obj:  # a record written before states existed
            payload = {k: v for k, v in obj.items() if k not in ("batch", "attempt")}
            return cls(int(obj["batch"]), str(obj["attempt"]), "staged", payload)
        offsets = obj.get("offsets")
        return cls(int(obj["batch"]), str(obj["attempt"]), obj["state"], obj["payload"],
                   BatchOffsets.from_dict(offsets) if offsets else None,
                   str(obj.get("replay", "")))


@dataclass(frozen=True, slots=True)
class Finished:
    """A committed publication whose records :meth:`SinkTransactions.finish_all`
    deletes: the batch, its extra publication's tag ("" for the batch itself), the
    committed attempt (None: its outcome is not deleted) and that attempt's staged keys
    (none when a sweep deleted them already)."""

    batch: int
    replay: str
    attempt: str | None
    staged: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class _DecisionRead:
    """What a decision rests on, read before the lease is confirmed: the publication's
    record, and its decision (read only when the record is not staged)."""

    batch: int
    replay: str
    txn: Transaction | None
    decided: dict[str, Any] | None


class SinkTransactions:
    """The records of one sink (see the module doc). ``confirm`` raises if this driver
    lost the job; sinks get it from :meth:`TwoPhaseCommitSink.fence`."""

    def __init__(self, storage: CheckpointStorage, prefix: str = "",
                 confirm: Callable[[], None] = lambda: None, name: str = "sink") -> None:
        self.storage = storage
        self.prefix = prefix
        self.confirm = confirm
        self.name = name  # the sink, as error messages name it
        #: (batch, replay) of every staged record as this driver knows it: its last
        #: listing plus its own writes since; None: list again (see :meth:`staged`)
        self._staged: set[tuple[int, str]] | None = None
        #: (batch, replay) -> the attempt this life may commit there: what its first
        #: listing found (an earlier life's) and what it recorded itself, until its own
        #: finish or abort (so bounded by the pending batches, not the life's length);
        #: None until the life's first listing. A listing later in the life (after a
        #: write whose outcome is unknown) counts no other record: a deposed driver's
        #: late record is not this life's to commit
        self._trusted: dict[tuple[int, str], str] | None = None
        self._staged_lock = threading.Lock()
        #: the newest batch id whose record or decision this object wrote or read in
        #: this life, with the offsets recorded there: a batch staged next that starts
        #: where it ended needs no look for its input under another id
        #: (:meth:`_published_elsewhere`)
        self._last: tuple[int, BatchOffsets] | None = None

    # ------------------------------------------------------------------ keys
    @staticmethod
    def _name(batch_id: int, replay: str) -> str:
        return f"{batch_id:012d}.{replay}.json" if replay else f"{batch_id:012d}.json"

    def txn_key(self, batch_id: int, replay: str = "") -> str:
        return f"{self.prefix}_txn/{self._name(batch_id, replay)}"

    def decision_key(self, batch_id: int, replay: str = "") -> str:
        return f"{self.prefix}_committed/{self._name(batch_id, replay)}"

    def outcome_key(self, batch_id: int, attempt: str, replay: str = "") -> str:
        name = self._name(batch_id, replay).removesuffix(".json")
        return f"{self.prefix}_outcome/{name}.{attempt}"

    def _settle(self, txn: Transaction, outcome: AttemptOutcome) -> AttemptOutcome:
        """Store ``outcome`` as the attempt's (create-only) unless one is stored
        already; return the attempt's outcome. Durable on return."""
        key = self.outcome_key(txn.batch, txn.attempt, txn.replay)
        try:
            self.storage.put_bytes(key, outcome.value.encode(), create_only=True)
        except ObjectAlreadyExistsError:
            return AttemptOutcome(self.storage.get_bytes(key).decode())
        return outcome

    # ------------------------------------------------------------------ reads
    def current(self, batch_id: int, replay: str = "") -> Transaction | None:
        """The transaction record of the batch (or of its extra publication
        ``replay``), or None."""
        try:
            return Transaction.from_json(self.storage.get_bytes(self.txn_key(batch_id, replay)))
        except ObjectNotFoundError:
            return None

    def decision(self, batch_id: int, replay: str = "") -> dict[str, Any] | None:
        """The commit decision of the batch (or of its extra publication ``replay``),
        or None if it was never committed."""
        try:
            data: dict[str, Any] = json.loads(
                self.storage.get_bytes(self.decision_key(batch_id, replay)))
        except ObjectNotFoundError:
            return None
        return data

    def _records(self, directory: str) -> list[tuple[int, str]]:
        """(batch, replay tag) of every record in ``directory``, ascending."""
        out = []
        for info in self.storage.list(self.prefix + directory):
            name = info.key.rsplit("/", 1)[-1]
            batch, _, replay = name.removesuffix(".json").partition(".")
            if name.endswith(".json") and batch.isdigit():
                out.append((int(batch), replay))
        return sorted(out)

    def recorded(self) -> list[int]:
        """Batches with a transaction record (staged or aborted), ascending."""
        return sorted({b for b, _ in self._records("_txn/")})

    def staged(self) -> list[int]:
        """Batches with a staged record not decided (of the batch or of an extra
        publication of it): the pending transactions, ascending.

        Listed (a LIST of ``_txn/`` and a GET per record) on first use and after
        :meth:`forget`; afterwards known from this object's own writes, as only the
        holder writes records: what else may land is a deposed driver's late record,
        which this driver never staged and so must not commit (the next life's listing
        finds it and rolls it forward or aborts it). A write whose outcome is unknown
        (it raised) makes the next call list again, and that listing counts only the
        attempts the life's first listing found or the life recorded itself (sinks seed
        315040: a deposed driver's record create, held in the network, landed after this
        life's recovery swept its staging; listed again after a skipped replay, it was
        committed, naming deleted data). :meth:`listed` is what storage holds now, for
        any reader."""
        with self._staged_lock:
            if self._staged is None:
                listed = self._listed_attempts()
                if self._trusted is None:  # the life's first listing: an earlier life's
                    self._trusted = dict(listed)
                trusted = self._trusted
                self._staged = {k for k, attempt in listed.items() if trusted.get(k) == attempt}
            return sorted({b for b, _ in self._staged})

    def listed(self) -> list[int]:
        """Batches with a staged record not decided, as storage holds them now (a LIST
        of ``_txn/`` and a GET per record; this object's :meth:`staged` is unchanged)."""
        return sorted({b for b, _ in self._listed_attempts()})

    def _listed_attempts(self) -> dict[tuple[int, str], str]:
        """(batch, replay) -> attempt of every staged record storage holds now."""
        return {(b, replay): t.attempt for b, replay in self._records("_txn/")
                if (t := self.current(b, replay)) is not None and t.state == "staged"}

    def forget(self) -> None:
        """Make the next :meth:`staged` list the records again (a new life of the sink:
        what an earlier driver left is read from storage)."""
        with self._staged_lock:
            self._staged = None

    def restart(self) -> None:
        """A new life of the sink (its recovery): :meth:`forget`, and forget the batch
        it knew last (a restore may plan any batch next) and the attempts it trusted."""
        self.forget()
        with self._staged_lock:
            self._last = None
            self._trusted = None

    def _note(self, batch_id: int, offsets: BatchOffsets | None) -> None:
        """Storage holds ``offsets`` at ``batch_id`` (its record or decision), as this
        object wrote or read them."""
        if offsets is None:
            return
        with self._staged_lock:
            if self._last is None or batch_id >= self._last[0]:
                self._last = (batch_id, offsets)

    def _continues(self, batch_id: int, offsets: BatchOffsets) -> bool:
        """Whether ``batch_id`` starts where the batch id before it ended, as recorded
        there (or is the batch recorded at its id): known without a request."""
        with self._staged_lock:
            last = self._last
        if last is None:
            return False
        known, read = last
        return (known == batch_id - 1 and read.sources == offsets.starts) or (
            known == batch_id and read == offsets)

    def _known(self, batch_id: int, replay: str, *, staged: bool) -> None:
        """This object's own write just made the record staged (or gone, or aborted)."""
        with self._staged_lock:
            if self._staged is not None:
                if staged:
                    self._staged.add((batch_id, replay))
                else:
                    self._staged.discard((batch_id, replay))
            if not staged and self._trusted is not None:
                self._trusted.pop((batch_id, replay), None)

    def require_committable(self, batches: Iterable[int],
                            offsets: Callable[[int], BatchOffsets | None] | None = None) -> None:
        """Raise :class:`~airflow_ckpt.errors.SinkTransactionAbortedError` for the first
        of ``batches`` (a restored snapshot's transactions, about to be committed) whose
        record was aborted and that has no decision, or whose decision, or staged record,
        holds other source offsets than the restored batch read (``offsets``: the
        restored working directory's, per batch): its output is gone (another attempt,
        e.g. of a run started anew, was published or staged in its place, and the
        restored attempt's staging deleted), and the restored state will not replay it
        (unless it is an extra publication of the batch, committed or staged under its
        offsets' tag). One GET per batch (its decision), one more without a decision
        (its record), two more on a mismatch."""
        for batch_id in sorted(set(batches)):
            decided = self.decision(batch_id)
            if decided is not None:
                self.require_restored_input(batch_id, decided.get("offsets"), offsets)
                continue
            txn = self.current(batch_id)
            if txn is not None and txn.state == "aborted":
                raise SinkTransactionAbortedError(batch_id, self.name)
            if txn is not None and txn.offsets is not None:
                self.require_restored_input(batch_id, txn.offsets.to_dict(), offsets,
                                            decided=False)

    def require_restored_input(self, batch_id: int, recorded: dict[str, Any] | None,
                               offsets: Callable[[int], BatchOffsets | None] | None, *,
                               decided: bool = True) -> None:
        """Raise :class:`~airflow_ckpt.errors.SinkTransactionAbortedError` if the
        batch's decision (``decided``) or staged record read ``recorded`` offsets, other
        than the restored batch's (``offsets``), and the restored batch is no extra
        publication of it either (no decision nor record under its offsets' tag)."""
        restored = offsets(batch_id) if offsets is not None else None
        if restored is None or recorded is None \
                or BatchOffsets.from_dict(recorded).same_input(restored):
            return
        tag = restored.tag  # the restored batch may be an extra publication of it
        if self.decision(batch_id, tag) is None and self.current(batch_id, tag) is None:
            raise SinkTransactionAbortedError(
                batch_id, self.name, BatchOffsets.from_dict(recorded).describe(),
                decided=decided)

    def replays(self, batch_id: int) -> list[str]:
        """Tags of the batch's extra publications that have a transaction record."""
        return [replay for b, replay in self._records(f"_txn/{batch_id:012d}.")
                if b == batch_id and replay]

    def committed_batches(self) -> list[int]:
        """Batches with a commit decision, ascending."""
        return sorted({b for b, _ in self.decisions()})

    def decisions(self) -> list[tuple[int, str]]:
        """(batch, replay tag) of every commit decision, ascending ("" first)."""
        return self._records("_committed/")

    # ------------------------------------------------------------------ writes
    def record(self, txn: Transaction, replays: ReplayPolicy = REFUSE, *,
               describe: Describe | None = None) -> Transaction | None:
        """Make ``txn`` (state ``staged``) the batch's transaction; durable on return.

        Returns the attempt it superseded (its outcome is ``abort`` and its staged data
        garbage now), or None. A staged attempt whose commit won its outcome is not
        superseded: its decision is written (``describe``, as :meth:`decide`) and the
        replay judged against it.
        If the batch is committed already: a replay that read the offsets the decision
        recorded (or carries none) records nothing and raises
        ``ObjectAlreadyExistsError`` (the caller discards its staging: skipping it is
        exactly once); one that read other offsets is judged by ``replays``
        (:meth:`ReplayPolicy.judge`): refused with
        :class:`~airflow_ckpt.errors.SinkReplayMismatchError` (nothing recorded), or
        recorded as the extra publication ``txn.offsets.tag`` of the batch, with the
        same rules (a replay with those offsets again is skipped)."""
        try:
            return self._record(txn, replays, describe)
        except BaseException:
            self.forget()  # it may have landed
            raise

    def _record(self, txn: Transaction, replays: ReplayPolicy,
                describe: Describe | None) -> Transaction | None:
        key = self.txn_key(txn.batch, txn.replay)
        with self._staged_lock:  # this life's own attempt, whatever its write's outcome
            if self._trusted is not None:
                self._trusted[(txn.batch, txn.replay)] = txn.attempt
        looked = bool(txn.replay)  # an extra publication is judged by its own decision
        for _ in range(_SWAP_ROUNDS):
            decided = self.decision(txn.batch, txn.replay)
            if not looked:
                looked = True
                elsewhere = self._published_elsewhere(txn, decided)
                # (no decision at this id: published as the batch itself, below)
                if elsewhere is not None and self._judge_elsewhere(txn, replays, decided,
                                                                   *elsewhere):
                    assert txn.offsets is not None  # only known offsets are looked for
                    extra = replace(txn, replay=txn.offsets.tag)
                    return self._record(extra, replays, describe)
            if decided is not None:
                verdict = (replays if not txn.replay else REFUSE).judge(
                    self.name, txn.batch, decided.get("offsets"), txn.offsets)
                self._noted(txn.batch, txn.replay, decided)
                if verdict is ReplayVerdict.PUBLISH:
                    assert txn.offsets is not None  # only known offsets can differ
                    extra = replace(txn, replay=txn.offsets.tag)
                    if self.decision(txn.batch, extra.replay) is None:  # else: skipped
                        replays.announce(self.name, txn.batch, decided.get("offsets"),
                                         txn.offsets)
                    return self._record(extra, replays, describe)
                raise ObjectAlreadyExistsError(
                    f"batch {txn.batch} is committed already; its replay "
                    + ("read the same source offsets" if verdict is ReplayVerdict.SAME else
                       "carries no source offsets to compare (the sink runs without the "
                       "runtime)"))
            # The batch's first staging creates its record (a new batch: one request);
            # a record in place is read and superseded below.
            try:
                self.storage.put_bytes(key, txn.to_json(), create_only=True)
            except ObjectAlreadyExistsError:
                pass
            else:
                self._known(txn.batch, txn.replay, staged=True)
                if not txn.replay:
                    self._note(txn.batch, txn.offsets)
                return None
            try:
                stored = self.storage.get_versioned(key)
            except ObjectNotFoundError:
                continue  # finished meanwhile (its batch was decided): look again
            previous = Transaction.from_json(stored.data)
            self.confirm()  # the record read above is not a successor's
            if (previous.state == "staged" and previous.attempt != txn.attempt
                    and self._settle(previous, AttemptOutcome.ABORT) is AttemptOutcome.COMMIT):
                if describe is None:
                    raise ObjectAlreadyExistsError(
                        f"batch {txn.batch}'s attempt {previous.attempt} is being committed")
                self.decide(previous.batch, describe, previous.replay)
                continue  # committed: judge the replay against the decision
            try:
                self.storage.put_bytes(key, txn.to_json(), if_match=stored.etag)
            except PreconditionFailedError:
                continue
            self._known(txn.batch, txn.replay, staged=True)
            if not txn.replay:
                self._note(txn.batch, txn.offsets)
            return previous if previous.attempt != txn.attempt else None
        raise PreconditionFailedError(f"{key} kept changing while batch {txn.batch} was "
                                      "recorded: another driver writes this sink")

    def _published_elsewhere(self, txn: Transaction, decided: dict[str, Any] | None
                             ) -> tuple[int, dict[str, Any]] | None:
        """The decision of a batch below ``txn.batch`` that started where ``txn`` starts,
        with its id, if the batch ids shifted: Spark's offline state repartitioning
        (``state_partitions``) appends a repartition batch that takes the restored
        batch's offsets under the next id, so every later batch reads under an id one
        higher than the batch that first read it.

        Looked for (one GET per batch id, at most :data:`LOOK_DOWN`, downwards) only
        after a discontinuity: the decision at ``txn.batch`` started elsewhere, or there
        is none and the batch this object knew last is not the one before, ending where
        ``txn`` starts. The look stops at a decision ending where ``txn`` starts (the
        batch before it: nothing below started there). None: judged as before (by the
        decision at ``txn.batch``, or recorded if there is none)."""
        offsets = txn.offsets
        if offsets is None or not offsets.starts:
            return None  # no start to look for (no runtime, or purged)
        if decided is not None:
            recorded = decided.get("offsets")
            at_id = BatchOffsets.from_dict(recorded) if recorded else None
            if at_id is None or at_id.starts == offsets.starts or at_id.same_input(offsets):
                return None  # the same batch, or a replay of this one to another end
        elif self._continues(txn.batch, offsets):
            return None  # the steady path: no request
        for batch_id in range(txn.batch - 1, max(txn.batch - 1 - LOOK_DOWN, -1), -1):
            below = self.decision(batch_id)
            recorded = below.get("offsets") if below is not None else None
            if below is None or recorded is None:
                continue  # never decided here (e.g. the repartition batch's id)
            read = BatchOffsets.from_dict(recorded)
            if read.starts == offsets.starts:
                return batch_id, below
            if read.sources == offsets.starts:
                return None  # the batch right before this input
        return None

    def _judge_elsewhere(self, txn: Transaction, replays: ReplayPolicy,
                         decided: dict[str, Any] | None, published_as: int,
                         elsewhere: dict[str, Any]) -> bool:
        """Judge ``txn``, whose start batch ``published_as`` published already (its
        decision ``elsewhere``): the same input is skipped (raises
        ``ObjectAlreadyExistsError``: exactly once); another end is refused
        (``SinkReplayMismatchError``, by ``replays``) or announced and published as
        extra output: True to record it as an extra publication of ``txn.batch`` (which
        has a decision, ``decided``), False as the batch itself (none)."""
        offsets = txn.offsets
        verdict = replays.judge(self.name, txn.batch, elsewhere.get("offsets"), offsets,
                                published_as=published_as)
        if decided is not None:
            self._noted(txn.batch, "", decided)
        elif published_as == txn.batch - 1 and verdict is ReplayVerdict.SAME:
            self._note(txn.batch, offsets)  # as if recorded here: the batch below read it
        if verdict is ReplayVerdict.SAME:
            raise ObjectAlreadyExistsError(
                f"batch {txn.batch} read the source offsets batch {published_as} published "
                "(its batch id shifted, e.g. by a rescale's repartition batch)")
        assert offsets is not None  # only known offsets are looked for
        if decided is None or self.decision(txn.batch, offsets.tag) is None:
            replays.announce(self.name, txn.batch, elsewhere.get("offsets"), offsets,
                             published_as=published_as)
        return decided is not None

    def decide(self, batch_id: int, describe: Describe,
               replay: str = "") -> dict[str, Any] | None:
        """The commit decision of the batch (or of its extra publication ``replay``):
        :meth:`decide_all` of that one publication."""
        return self.decide_all([(batch_id, replay)], describe)[0]

    def decide_all(self, publications: Sequence[tuple[int, str]],
                   describe: Describe) -> list[dict[str, Any] | None]:
        """The commit decision of each publication ``(batch, replay)`` (a checkpoint's
        pending transactions, committed together), in order: the existing one, or one
        taken now (create-only) from its staged record, described by ``describe`` plus
        the record's ``offsets``. None if nothing is staged (an extra publication's
        aborted record included). Raises
        :class:`~airflow_ckpt.errors.SinkTransactionAbortedError` for the first whose
        staged attempt's outcome is ``abort``, or whose record is aborted without a
        decision (an earlier driver's recovery aborted it; its record swap may not have
        landed, or landed after the caller judged the batch): its output is lost, never
        published (the ones before it are decided, durable, and published by the next
        commit).

        Every record is read first, then the lease is confirmed **once**, then each
        outcome and decision is written: every read a decision rests on precedes the
        confirm, and every write follows it, for each publication as for one (a LIST
        of ``lease/`` per checkpoint, not per batch; docs/architecture.md, "What a
        batch's transaction costs"). The record is read first: a staged one is decided
        from (a decision already in place is found by the create-only write, below, or
        by the outcome); the decision is read only when there is no staged record (a
        batch committed and finished, or never staged), so a batch's commit reads one
        object, not two."""
        reads = [self._read_for_decision(batch_id, replay) for batch_id, replay in publications]
        # A decision found without a staged record may be a successor's (its own staging
        # of the batch id, after it aborted this driver's: a restore=none or an older
        # restore), not this driver's batch: the confirm, after the read, raises.
        decided = any(read.decided is not None for read in reads)
        # A record read is not a successor's once the confirm after it passed. An aborted
        # record is a recovery's, and only a holder of the lease aborts, after its claim:
        # a deposed driver's confirm (a read after the aborted record's) sees that claim
        # and raises, so its commit never returns as if the batch were published.
        if decided or any(read.txn is not None for read in reads if read.decided is None):
            interleave.point(interleave.SINK_DECIDE_BEFORE_CONFIRM)
            self.confirm()
        return [self._decide_read(read, describe) for read in reads]

    def _read_for_decision(self, batch_id: int, replay: str) -> _DecisionRead:
        """What deciding the publication rests on: its record, and its decision when
        the record is not staged."""
        txn = self.current(batch_id, replay)
        if txn is not None and txn.state == "staged":
            return _DecisionRead(batch_id, replay, txn, None)
        return _DecisionRead(batch_id, replay, txn, self.decision(batch_id, replay))

    def _decide_read(self, read: _DecisionRead, describe: Describe) -> dict[str, Any] | None:
        """:meth:`decide_all` of one publication, after the confirm: its outcome and
        decision written, or the decision found."""
        batch_id, replay, txn = read.batch, read.replay, read.txn
        if read.decided is not None:
            return self._noted(batch_id, replay, read.decided)
        if txn is not None and txn.state == "aborted" and not replay:
            # Aborted by a predecessor's recovery (a successor's abort would have made
            # the confirm above raise), possibly after the caller judged the batch
            # committable: its record swap held in the network, landing late (sinks
            # seed 401637). Its output is lost, not "never staged": a caller committing
            # it must not return as if it were published.
            raise SinkTransactionAbortedError(batch_id, self.name)
        if txn is None or txn.state != "staged":
            return None
        if self._settle(txn, AttemptOutcome.COMMIT) is AttemptOutcome.ABORT:
            # The abort outcome may be a successor's, written after the confirm above
            # (this driver held between that confirm and its outcome write: sinks seed
            # 310469): confirmed again after reading it, a successor's raises here, before
            # its decision of the batch id (other input, its own attempt) can be returned
            # as this attempt's. One that passes is a predecessor's (a recovery that did
            # not list the batch, whose record swap never landed): the batch is aborted,
            # not "never staged", and a caller committing it must not return as if
            # published. (A decision in place then, of the batch's earlier attempt, is
            # the batch's.)
            self.confirm()
            existing = self.decision(batch_id, replay)
            if existing is not None:
                return existing
            raise SinkTransactionAbortedError(batch_id, self.name)
        decision = describe(txn)
        if txn.offsets is not None:
            decision["offsets"] = txn.offsets.to_dict()
        try:
            self.storage.put_bytes(self.decision_key(batch_id, replay), json.dumps(
                decision, sort_keys=True).encode(), create_only=True)
        except ObjectAlreadyExistsError:  # decided before: that decision stands
            decided = self.decision(batch_id, replay)
            assert decided is not None
            return self._noted(batch_id, replay, decided)
        return self._noted(batch_id, replay, decision)

    def _noted(self, batch_id: int, replay: str, decision: dict[str, Any]) -> dict[str, Any]:
        """``decision``, noted as the batch's (:meth:`_note`) if it is its own."""
        recorded = decision.get("offsets")
        if not replay and recorded:
            self._note(batch_id, BatchOffsets.from_dict(recorded))
        return decision

    def abort(self, batch_id: int, replay: str = "") -> Transaction | AttemptOutcome | None:
        """Mark the staged attempt of the batch (or of its extra publication ``replay``)
        aborted (its outcome ``abort``, then the record by compare-and-swap); returns the
        aborted transaction (its data is garbage now), None if none was staged, or
        :attr:`AttemptOutcome.COMMIT` if the attempt's commit won (the caller commits it).

        When it returns an aborted transaction, the record's version changed after
        every read of it made before this call: a supersede computed from such a read
        (its answer lost, its PUT held in the network) fails its If-Match, so it never
        names an attempt whose staging the caller deletes next. A record found aborted
        already is rewritten for that (its ``fence`` counted up: the content, hence an
        S3 ETag, changes; sinks seed 346417, session 16)."""
        key = self.txn_key(batch_id, replay)
        for _ in range(_SWAP_ROUNDS):
            try:
                stored = self.storage.get_versioned(key)
            except ObjectNotFoundError:
                self._known(batch_id, replay, staged=False)
                return None
            txn = Transaction.from_json(stored.data)
            if txn.state == "aborted":
                aborted = replace(txn, payload={
                    **txn.payload, "fence": int(txn.payload.get("fence", 0)) + 1})
            else:
                self.confirm()  # the record read above is not a successor's
                if self._settle(txn, AttemptOutcome.ABORT) is AttemptOutcome.COMMIT:
                    return AttemptOutcome.COMMIT
                aborted = replace(txn, state="aborted", offsets=None)
            try:
                self.storage.put_bytes(key, aborted.to_json(), if_match=stored.etag)
            except PreconditionFailedError:
                continue
            except BaseException:
                self.forget()  # it may have landed
                raise
            self._known(batch_id, replay, staged=False)
            return aborted
        raise PreconditionFailedError(f"{key} kept changing while batch {batch_id} was "
                                      "aborted: another driver writes this sink")

    def discard(self, prefix: str) -> None:
        """Delete what is stored under ``prefix`` (a batch's staged data, every attempt),
        listed first and confirmed after the listing: a successor's data, written after
        its claim, is never among what is deleted, however late the deletes land."""
        keys = [info.key for info in self.storage.list(prefix)]
        if keys:
            self.confirm()
            self.storage.delete_many(keys)

    def finish(self, batch_id: int, replay: str = "", *, attempt: str | None = None,
               staged: Iterable[str] = ()) -> None:
        """Forget the record of a committed batch (or extra publication) and, given
        its committed ``attempt``, that attempt's outcome; ``staged``: the published
        attempt's staged data, deleted in the same request (:meth:`finish_all` of one)."""
        self.finish_all([Finished(batch_id, replay, attempt, tuple(staged))])

    def finish_all(self, published: Sequence[Finished]) -> None:
        """Forget the records of committed publications (every one a completion
        committed, at once): each one's staged data, record and attempt outcome, in one
        :meth:`~airflow_ckpt.runtime.storage.base.CheckpointStorage.delete_many` (one
        ``DeleteObjects`` up to 1,000 keys), listed by kind: every staging, then every
        record, then every outcome. Durable on return.

        No lease confirmation: each decision exists, so nothing records those batches
        again, and the staged keys are the committed attempts' alone (no successor
        writes them) with their data published already, so nobody needs any of them,
        whoever holds the job when the delete lands. Nothing rests on the order of the
        keys (S3 gives none within one request, and a delete that raises may have
        deleted any of them): whatever of a publication's three kinds is left, its
        decision is in place, and the next commit or recovery finishes it (a staging
        without a record is rolled forward, a record without its outcome decided again
        to the same bytes). Other attempts of the batches are the next recovery's,
        which lists and confirms (:meth:`discard`)."""
        if not published:
            return
        keys = [*(key for p in published for key in p.staged),
                *(self.txn_key(p.batch, p.replay) for p in published),
                *(self.outcome_key(p.batch, p.attempt, p.replay) for p in published
                  if p.attempt is not None)]
        try:
            self.storage.delete_many(keys)
        except BaseException:
            self.forget()  # it may have landed
            raise
        for p in published:
            self._known(p.batch, p.replay, staged=False)
