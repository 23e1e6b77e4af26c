"""SinkTransactions: the one reader and writer of a two-phase-commit sink's records.

Layout under a sink's root (keys relative to it)::

    _txn/<batch>.json        the batch's transaction: its current attempt and state
    _committed/<batch>.json  the commit decision (create-only): the attempt published

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
  :meth:`~airflow_ckpt.runtime.lease.JobLease.confirm`) that no successor claimed the
  job since the record was read: a successor's records all come after its claim.
* **Staged data lives under attempt-scoped keys** (``attempt`` is fresh per staging),
  so deleting an aborted attempt never touches another attempt's files.

Why a replay of a committed batch is skipped or refused, never dropped blindly: the
record and the decision carry the batch's source offsets
(:class:`~airflow_ckpt.runtime.sinks.offsets.BatchOffsets`); a batch id whose decision
exists is staged again only after a restore older than the sink's output, and then it is
the same batch only if it read the same offsets (``check_replay``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from airflow_ckpt.errors import (
    ObjectAlreadyExistsError,
    ObjectNotFoundError,
    PreconditionFailedError,
)
from airflow_ckpt.runtime.sinks.offsets import BatchOffsets, check_replay
from airflow_ckpt.runtime.storage.base import CheckpointStorage

log = logging.getLogger("airflow_ckpt.sinks")

TxnState = Literal["staged", "aborted"]
#: compare-and-swap rounds before a record that keeps changing is reported
_SWAP_ROUNDS = 8


@dataclass(frozen=True, slots=True)
class Transaction:
    """A batch's transaction record: the attempt staged last, its state, the sink's
    own description of the staged data (``payload``: e.g. the file list) and the
    source offsets the batch read (None when the sink runs without the runtime)."""

    batch: int
    attempt: str
    state: TxnState
    payload: dict[str, Any] = field(default_factory=dict)
    offsets: BatchOffsets | None = None

    def to_json(self) -> bytes:
        return json.dumps({"batch": self.batch, "attempt": self.attempt, "state": self.state,
                           "payload": self.payload,
                           "offsets": self.offsets.to_dict() if self.offsets else None},
                          sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> Transaction:
        obj = json.loads(raw)
        if "payload" not in obj:  # a record written before states existed
            payload = {k: v for k, v in obj.items() if k not in ("batch", "attempt")}
            return cls(int(obj["batch"]), str(obj["attempt"]), "staged", payload)
        offsets = obj.get("offsets")
        return cls(int(obj["batch"]), str(obj["attempt"]), obj["state"], obj["payload"],
                   BatchOffsets.from_dict(offsets) if offsets else None)


class SinkTransactions:
    """The records of one sink (see the module doc). ``confirm`` raises if this driver
    lost the job; sinks get it from :meth:`TwoPhaseCommitSink.fence`."""

    def __init__(self, storage: CheckpointStorage, prefix: str = "",
                 confirm: Callable[[], None] = lambda: None, name: str = "sink") -> None:
        self.storage = storage
        self.prefix = prefix
        self.confirm = confirm
        self.name = name  # the sink, as error messages name it

    # ------------------------------------------------------------------ keys
    def txn_key(self, batch_id: int) -> str:
        return f"{self.prefix}_txn/{batch_id:012d}.json"

    def decision_key(self, batch_id: int) -> str:
        return f"{self.prefix}_committed/{batch_id:012d}.json"

    # ------------------------------------------------------------------ reads
    def current(self, batch_id: int) -> Transaction | None:
        """The batch's transaction record, or None."""
        try:
            return Transaction.from_json(self.storage.get_bytes(self.txn_key(batch_id)))
        except ObjectNotFoundError:
            return None

    def decision(self, batch_id: int) -> dict[str, Any] | None:
        """The batch's commit decision, or None if it was never committed."""
        try:
            data: dict[str, Any] = json.loads(self.storage.get_bytes(self.decision_key(batch_id)))
        except ObjectNotFoundError:
            return None
        return data

    def _batches(self, directory: str) -> list[int]:
        out = []
        for info in self.storage.list(self.prefix + directory):
            name = info.key.rsplit("/", 1)[-1]
            if name.endswith(".json") and name[:-5].isdigit():
                out.append(int(name[:-5]))
        return sorted(out)

    def recorded(self) -> list[int]:
        """Batches with a transaction record (staged or aborted), ascending."""
        return self._batches("_txn/")

    def staged(self) -> list[int]:
        """Batches whose record is staged and not decided: the pending transactions."""
        return [b for b in self.recorded()
                if (t := self.current(b)) is not None and t.state == "staged"]

    def committed_batches(self) -> list[int]:
        """Batches with a commit decision, ascending."""
        return self._batches("_committed/")

    # ------------------------------------------------------------------ writes
    def record(self, txn: Transaction) -> Transaction | None:
        """Make ``txn`` (state ``staged``) the batch's transaction; durable on return.

        Returns the attempt it superseded (its staged data is now garbage), or None.
        If the batch is committed already, records nothing and raises (the caller
        discards its staging either way): ``ObjectAlreadyExistsError`` if ``txn`` read
        the offsets the decision recorded (or carries none), so skipping it is exactly
        once; :class:`~airflow_ckpt.errors.SinkReplayMismatchError` if it read others."""
        key = self.txn_key(txn.batch)
        for _ in range(_SWAP_ROUNDS):
            decided = self.decision(txn.batch)
            if decided is not None:
                verified = check_replay(self.name, txn.batch, decided.get("offsets"),
                                        txn.offsets)
                raise ObjectAlreadyExistsError(
                    f"batch {txn.batch} is committed already; its replay "
                    + ("read the same source offsets" if verified else
                       "carries no source offsets to compare (the sink runs without the "
                       "runtime)"))
            try:
                stored = self.storage.get_versioned(key)
            except ObjectNotFoundError:
                try:
                    self.storage.put_bytes(key, txn.to_json(), create_only=True)
                except ObjectAlreadyExistsError:
                    continue  # someone recorded it meanwhile: look again
                return None
            previous = Transaction.from_json(stored.data)
            self.confirm()  # the record read above is not a successor's
            try:
                self.storage.put_bytes(key, txn.to_json(), if_match=stored.etag)
            except PreconditionFailedError:
                continue
            return previous if previous.attempt != txn.attempt else None
        raise PreconditionFailedError(f"{key} kept changing while batch {txn.batch} was "
                                      "recorded: another driver writes this sink")

    def decide(self, batch_id: int, describe: Callable[[Transaction], dict[str, Any]]
               ) -> dict[str, Any] | None:
        """The batch's commit decision: the existing one, or one taken now (create-only)
        from its staged record, described by ``describe`` plus the record's ``offsets``.
        None if nothing is staged."""
        existing = self.decision(batch_id)
        if existing is not None:
            return existing
        txn = self.current(batch_id)
        if txn is None or txn.state != "staged":
            return None
        self.confirm()  # the record read above is not a successor's
        decision = describe(txn)
        if txn.offsets is not None:
            decision["offsets"] = txn.offsets.to_dict()
        try:
            self.storage.put_bytes(self.decision_key(batch_id), json.dumps(
                decision, sort_keys=True).encode(), create_only=True)
        except ObjectAlreadyExistsError:
            decided = self.decision(batch_id)
            assert decided is not None
            return decided
        return decision

    def abort(self, batch_id: int) -> Transaction | None:
        """Mark the batch's staged attempt aborted (compare-and-swap); returns the
        aborted transaction (its data is garbage now), or None if none was staged."""
        key = self.txn_key(batch_id)
        for _ in range(_SWAP_ROUNDS):
            try:
                stored = self.storage.get_versioned(key)
            except ObjectNotFoundError:
                return None
            txn = Transaction.from_json(stored.data)
            if txn.state == "aborted":
                return txn
            self.confirm()  # the record read above is not a successor's
            aborted = Transaction(txn.batch, txn.attempt, "aborted", txn.payload)
            try:
                self.storage.put_bytes(key, aborted.to_json(), if_match=stored.etag)
            except PreconditionFailedError:
                continue
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

    def finish(self, batch_id: int) -> None:
        """Forget the record of a committed batch (its decision exists: nothing records
        the batch again, so this delete may land late without harm)."""
        self.storage.delete_many([self.txn_key(batch_id)])
