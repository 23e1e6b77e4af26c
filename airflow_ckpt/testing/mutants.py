"""The mutation score of the simulation: how many planted bugs of the real runtime it
kills (``make mutants``).

A *mutant* is one realistic one-line bug in the real code (never in the simulation): an
exact source-text replacement (``old`` -> ``new``) in one file of the package, breaking
one condition the design relies on (a create-only or ``If-Match`` write, a gate, a lease
confirm, GC pinning, the adoption filter, the sealed mark, recorded offsets, answer-once,
restore's choice, the run floor). ``old`` must occur exactly once in its file (checked
before anything runs, so a mutant never rots into a no-op after a refactoring).

Each mutant is applied to a temporary copy of the package (the worktree is never
touched), put first on the ``PYTHONPATH`` of a subprocess that runs the simulation over
``make test``'s seed budget (seeds 0-199, every world of
:data:`~airflow_ckpt.testing.simulation.WORLDS`, so new worlds count by themselves) and
stops at the first seed that breaks an invariant: the mutant is *killed*, after that
many seeds. A mutant that makes the simulation itself fail (an error, a stuck actor) is
killed too: ``make test`` would fail. The rest *survive*. Two subprocesses at most run
at once, niced.

``python -m airflow_ckpt.testing.mutants [--seeds N] [--jobs J] [--only NAME]`` prints
one line per mutant and ``N of M mutants killed``; exit status 1 if one survived. An
*equivalent* mutant (no execution can tell it apart: e.g. create-only on a key that is
a fresh random id or a content digest) carries its argument, is printed as such and is
neither run nor counted unless ``--equivalent`` (or ``--only``) asks for it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import airflow_ckpt
from airflow_ckpt.errors import AirflowCkptError

PACKAGE = Path(airflow_ckpt.__file__).resolve().parent
#: the seeds ``make test`` explores (tests/unit/test_simulation.py)
SEEDS = 200
#: the longest one mutant's run may take (a mutant that hangs the simulation is killed)
TIMEOUT_S = 1800.0


class MutantRotError(AirflowCkptError):
    """A mutant's ``old`` text is not exactly once in its file (the code moved on)."""


@dataclass(frozen=True, slots=True)
class Mutant:
    """One planted bug: in ``file`` (relative to the package), ``old`` becomes ``new``;
    ``condition`` is what it breaks. ``equivalent``: why no execution of the system can
    tell it apart (empty for a mutant the simulation must kill): such a mutant is a
    regression guard of its construction, listed but not in the score nor run unless
    asked (``--equivalent``); docs/architecture.md has each argument."""

    name: str
    file: str
    old: str
    new: str
    condition: str
    equivalent: str = ""

    def apply(self, root: Path) -> None:
        """Plant it in the package copy at ``root`` (raises :class:`MutantRotError`)."""
        path = root / self.file
        text = path.read_text()
        found = text.count(self.old)
        if found != 1:
            raise MutantRotError(f"mutant {self.name}: its old text occurs {found} times in "
                                 f"{self.file}, not once: update the mutant")
        path.write_text(text.replace(self.old, self.new))


TXN = "runtime/sinks/transactions.py"
LEASE = "runtime/lease/holder.py"
JOURNAL = "runtime/history/journal.py"
STORE = "runtime/checkpoint/store.py"
HISTORY = "runtime/checkpoint/savepoint_history.py"
CHOOSE = "runtime/restore/choose.py"
CHANNEL = "runtime/control/channel.py"
FENCED = "runtime/storage/fenced.py"
OFFSETS = "runtime/sinks/offsets.py"

#: every mutant ``make mutants`` plants (docs/architecture.md, "Mutation score")
MUTANTS: tuple[Mutant, ...] = (
    # ---------------------------------------------------------------- create-only writes
    Mutant("marker-overwrite", "runtime/checkpoint/marker.py",
           "storage.put_bytes(key, data, create_only=True)",
           "storage.put_bytes(key, data, create_only=False)",
           "the completion marker _metadata is written create-only"),
    Mutant("decision-overwrite", TXN,
           "decision, sort_keys=True).encode(), create_only=True)",
           "decision, sort_keys=True).encode(), create_only=False)",
           "a sink's commit decision _committed/<b> is written create-only"),
    Mutant("txn-record-overwrite", TXN,
           "self.storage.put_bytes(key, txn.to_json(), create_only=True)",
           "self.storage.put_bytes(key, txn.to_json(), create_only=False)",
           "a batch's first transaction record _txn/<b> is written create-only"),
    Mutant("outcome-overwrite", TXN,
           "self.storage.put_bytes(key, outcome.value.encode(), create_only=True)",
           "self.storage.put_bytes(key, outcome.value.encode(), create_only=False)",
           "an attempt's outcome _outcome/<b>.<attempt> is written create-only (commit "
           "and abort race on it)"),
    # staged-overwrite was equivalent: a staging key names a fresh random attempt id, so
    # only its own writer (retrying the same bytes) writes it; the id's freshness is the
    # condition (docs/architecture.md, "Mutation score")
    Mutant("attempt-id-reused", "runtime/sinks/jsonl.py",
           "attempt = self.ids().hex[:16]",
           "attempt = f\"{batch_id:016x}\"",
           "a JSON-lines staging is written under an attempt id fresh per staging"),
    Mutant("lease-claim-overwrite", LEASE,
           "record.to_json(), create_only=True)",
           "record.to_json(), create_only=False)",
           "a lease claim lease/<epoch> is create-only (of two claimants one wins)"),
    Mutant("history-append-overwrite", JOURNAL,
           "self.storage.put_bytes(key, raw, create_only=True)",
           "self.storage.put_bytes(key, raw, create_only=False)",
           "a history event takes its number create-only"),
    Mutant("segment-overwrite", JOURNAL,
           "self.storage.put_bytes(segment.key, data, create_only=True)",
           "self.storage.put_bytes(segment.key, data, create_only=False)",
           "a history segment is written create-only",
           equivalent="a segment's name carries the digest of its events: a second write "
           "of one name has the same bytes (the digest's condition is the seal's second "
           "look, compaction-ignores-seal)"),
    Mutant("control-answer-overwrite", CHANNEL,
           "json.dumps(asdict(result)).encode(),\n            create_only=True,",
           "json.dumps(asdict(result)).encode(),\n            create_only=False,",
           "a control request is answered create-only (answered once)"),
    Mutant("control-request-overwrite", CHANNEL,
           "self.storage.put_bytes(self.layout.control_request(request_id), request.to_json(),"
           "\n                               create_only=True)",
           "self.storage.put_bytes(self.layout.control_request(request_id), request.to_json(),"
           "\n                               create_only=False)",
           "a control request is written create-only",
           equivalent="a request id is <ms>-<32 random bits>, fresh: only a requester "
           "repeating its own PUT (equal bytes) meets an existing key"),
    # ---------------------------------------------------------------- If-Match writes
    Mutant("lease-swap-unconditional", LEASE,
           "try:\n                    etag = self.storage.put_bytes(key, record.to_json(), "
           "if_match=self._etag)",
           "try:\n                    etag = self.storage.put_bytes(key, record.to_json(), "
           "if_match=None)",
           "a holder rewrites its lease record If-Match its last version",
           equivalent="an epoch's record has one writer, its claimant (create-only claim: "
           "lease-claim-overwrite); the If-Match guards against its own late swaps, "
           "which regress liveness fields only"),
    Mutant("txn-swap-unconditional", TXN,
           "self.storage.put_bytes(key, txn.to_json(), if_match=stored.etag)",
           "self.storage.put_bytes(key, txn.to_json(), if_match=None)",
           "a transaction record is superseded If-Match the version judged"),
    Mutant("abort-swap-unconditional", TXN,
           "self.storage.put_bytes(key, aborted.to_json(), if_match=stored.etag)",
           "self.storage.put_bytes(key, aborted.to_json(), if_match=None)",
           "an abort rewrites the transaction record If-Match the version judged"),
    Mutant("abort-unfenced", TXN,
           "if txn.state == \"aborted\":\n                aborted = replace(",
           "if txn.state == \"aborted\":\n                self._known(batch_id, replay, "
           "staged=False)\n                return txn\n                aborted = replace(",
           "an abort that finds the record aborted rewrites it before the caller sweeps "
           "the batch's staging (a supersede read before it fails its If-Match)"),
    Mutant("restart-decision-not-at-head", JOURNAL,
           "seq = at if at is not None else self._known_head() + 1",
           "seq = self._known_head() + 1",
           "a restart decision is appended at head + 1 exactly (append_if_head: a CAS "
           "on the whole history)"),
    # ---------------------------------------------------------------- gates
    Mutant("fenced-put-ungated", FENCED,
           "if_match: str | None = None) -> str:\n        self.gate()",
           "if_match: str | None = None) -> str:\n        pass",
           "FencedStorage gates every put"),
    Mutant("fenced-delete-ungated", FENCED,
           "self.gate()\n            self.inner.delete_many(batch)",
           "self.inner.delete_many(batch)",
           "FencedStorage gates every delete"),
    Mutant("fenced-upload-ungated", FENCED,
           "self.gate()\n        self.inner.upload_file(path, key)",
           "self.inner.upload_file(path, key)",
           "FencedStorage gates every upload"),
    Mutant("fenced-hashed-upload-ungated", FENCED,
           "self.gate()\n        return self.inner.upload_file_hashed(path, key)",
           "return self.inner.upload_file_hashed(path, key)",
           "FencedStorage gates every upload that hashes while it sends (issue 26)"),
    Mutant("gate-never-expires", LEASE,
           "if self.clock() >= self._valid_until:\n            self._lose(",
           "if False:\n            self._lose(",
           "the gate stops writes once the lease may have expired"),
    # ---------------------------------------------------------------- lease confirms
    Mutant("confirm-ignores-newer-epoch", LEASE,
           "if not epochs or epochs[-1] != self.record.epoch:",
           "if not epochs:",
           "confirm notices a newer epoch"),
    Mutant("beat-without-confirm", LEASE,
           "epochs = self._confirmed_epochs()\n        self._valid_until",
           "epochs = lease_epochs(self.storage, self.job)\n        self._valid_until",
           "a heartbeat extends the validity only after confirming the epoch"),
    Mutant("claim-jumps-epochs", LEASE,
           "epoch = state.epoch + 1",
           "epoch = max(lease_epochs(self.storage, self.job), default=0) + 1",
           "the claim is the judged epoch + 1 (never over a live epoch it did not judge)"),
    Mutant("claim-without-rejudging", LEASE,
           "if max(lease_epochs(self.storage, self.job), default=0) > state.epoch:",
           "if False:",
           "a claim is made only while no newer epoch than the judged one exists",
           equivalent="the claim is create-only; a stale claim of a swept epoch lies below "
           "the newest, which every confirm, reader and later claim go by (the rejudge "
           "is liveness)"),
    Mutant("marker-out-of-order", "runtime/checkpoint/coordinator.py",
           "if p.checkpoint_id < self._last_marked:",
           "if False:",
           "a checkpoint marker is written only while no higher checkpoint id's marker "
           "was (with max-concurrent-checkpoints >= 2 the later one subsumes it)"),
    Mutant("abandoned-marker-not-subsuming", "runtime/checkpoint/coordinator.py",
           "if written or p.state is PendingState.ABANDONED:",
           "if written:",
           "a checkpoint whose marker's outcome is unknown (abandoned: it may count) "
           "subsumes every lower id, as a written marker does"),
    Mutant("outage-forgets-unknown", "runtime/storage/outage.py",
           "unknown = exc",
           "unknown = None",
           "a write whose answer was lost once stays of unknown outcome through the "
           "outage budget: a repetition refused without evidence (the lease's gate) or "
           "a spent budget never makes it a definite failure"),
    Mutant("restart-ignores-decision", "runtime/job/checkpointed_job.py",
           "if (decided := self._decided_to_stop(coordinator)) is not None:",
           "if (decided := None) is not None:",
           "a driver whose coordinator decided to stop (a marker of unknown outcome, "
           "another driver) or whose lease another driver took stops, also when its "
           "query failed for another reason first: no restart in process"),
    Mutant("marker-unconfirmed", "runtime/checkpoint/marker.py",
           "confirm()  # the marker counts only if no successor claimed before it",
           "pass  # the marker counts only if no successor claimed before it",
           "a completion marker counts only after the lease is confirmed after it"),
    Mutant("record-unconfirmed", TXN,
           "previous = Transaction.from_json(stored.data)\n            self.confirm()",
           "previous = Transaction.from_json(stored.data)\n            pass",
           "a sink supersedes a staged attempt only after confirming the lease"),
    Mutant("decide-unconfirmed", TXN,
           "if decided or any(read.txn is not None for read in reads if read.decided is None):",
           "if decided:",
           "a sink decides a commit only after confirming the lease (once for every "
           "batch a checkpoint commits, after all their records were read)"),
    Mutant("abort-unconfirmed", TXN,
           "else:\n                self.confirm()  # the record read above",
           "else:\n                pass  # the record read above",
           "a sink aborts an attempt only after confirming the lease"),
    Mutant("discard-unconfirmed", TXN,
           "if keys:\n            self.confirm()",
           "if keys:\n            pass",
           "a sink deletes staged data only after confirming the lease after its listing"),
    Mutant("decided-unconfirmed", TXN,
           "decided = any(read.decided is not None for read in reads)",
           "decided = False",
           "a commit that finds a decision and no staged record returns it only after "
           "confirming the lease (a successor's decision of the batch id is not its batch)"),
    Mutant("aborted-record-committed-as-nothing", TXN,
           'if txn is not None and txn.state == "aborted" and not replay:',
           "if False:",
           "a commit that reads its batch's record aborted with no decision refuses it "
           "(its output is lost), never returns as if nothing were staged"),
    Mutant("recover-judges-unlisted", "runtime/sinks/staged.py",
           "self.tracked_pending()\n        self.transactions.require_committable(",
           "self.transactions.require_committable(",
           "a sink's recovery lists the records before it judges the restored batches "
           "(one aborted in between is committed, and confirmed, or refused)"),
    Mutant("abort-outcome-unconfirmed", TXN,
           "self.confirm()\n            existing = self.decision(batch_id, replay)",
           "existing = self.decision(batch_id, replay)",
           "a commit that finds its attempt's outcome abort confirms the lease before it "
           "returns a decision of the batch (a successor's abort and decision come after "
           "its claim)"),
    Mutant("relist-trusts-late-records", TXN,
           "self._staged = {k for k, attempt in listed.items() if trusted.get(k) == attempt}",
           "self._staged = set(listed)",
           "a sink's listing later in a life counts only attempts its first listing found "
           "or it recorded (a deposed driver's late record is not its to commit)"),
    Mutant("restored-input-unjudged", TXN,
           "restored = offsets(batch_id) if offsets is not None else None",
           "restored = None",
           "a restored batch is committed only from the input it read: a decision or "
           "staged record of other offsets (another run's, after it aborted the restored "
           "attempt) is refused, never recovered onto"),
    Mutant("collect-unconfirmed", STORE,
           "cleared, self._cleared = self._cleared, []",
           "cleared, self._cleared = [*self._cleared, *(k for _, ks in self._stash "
           "for k in ks)], []",
           "GC deletes a subsumed checkpoint's files only after a lease confirmation that "
           "followed the deletion of its marker"),
    # ---------------------------------------------------------------- GC pinning
    Mutant("gc-ignores-retained", STORE,
           "garbage = self.shared.collectable(shared, referenced)",
           "garbage = self.shared.collectable(shared, set())",
           "GC pins every retained checkpoint's shared files (decided again at deletion: "
           "a stashed key a newer checkpoint reuses by content stays)"),
    Mutant("gc-ignores-reservations", STORE,
           "pinned = referenced.union(*self._reserved.values())",
           "pinned = referenced",
           "GC pins the shared files a pending checkpoint reserved"),
    Mutant("gc-deletes-newer-epochs", STORE,
           "return (self.layout.shared_key_epoch(key) or 0) <= (self.epoch or 0)",
           "return True",
           "GC never deletes a shared key of a newer epoch",
           equivalent="a newer epoch's key reaches a registry only through a listing made "
           "after the newer claim, and every stashed key is deleted only after a "
           "confirmation that followed its stash (collect-unconfirmed, confirm-noop)"),
    Mutant("restored-not-pinned", STORE,
           "keep = [m for m in self._retained if m.checkpoint_id != self._pinned]",
           "keep = list(self._retained)",
           "the checkpoint a run restored from is not subsumed before the run has its own"),
    Mutant("base-files-unpinned", STORE,
           "            self._base = base",
           "            self._base = None",
           "the files of a run's base below the retention floor stay while its marker is "
           "stored (its marker is subsumed first, once the run has a checkpoint of its own)"),
    # ---------------------------------------------------------------- adoption filter
    Mutant("late-markers-count", "runtime/lease/record.py",
           "return [n for n in ids if n in adopted or n >= lease.first_id]",
           "return ids",
           "a marker counts only if adopted or the holder's own (late markers never count)"),
    Mutant("no-late-adoption", LEASE,
           "self._adopt_late_markers(adopt, previous) if adopt is not None",
           "self._adopt_late_markers(adopt, previous) if False",
           "markers that landed between the first listing and the claim are adopted"),
    Mutant("adoption-judges-one-record", LEASE,
           "if current.adoption_final:\n            return judges",
           "if True:\n            return judges",
           "a successor of a claimant that died before its second look also judges by "
           "the older records still stored"),
    Mutant("adoption-judges-past-final", LEASE,
           "if older.adoption_final:\n                break",
           "if False:\n                break",
           "the post-claim look never judges past a final record (a marker a deposed "
           "holder wrote after its successor's second look never counts)"),
    Mutant("first-id-reused", "runtime/checkpoint/catalog.py",
           "return max([floor - 1, *used]) + 1",
           "return max([0, *used]) + 1",
           "a successor's first id is past every id its predecessor reserved"),
    # ---------------------------------------------------------------- sealed mark
    Mutant("append-ignores-seal", JOURNAL,
           "sealed = self._sealed()\n",
           "sealed = 0\n",
           "an append re-reads the sealed mark after its create (a void number is taken "
           "back)"),
    Mutant("compaction-ignores-seal", JOURNAL,
           "sealed = max(listing.sealed, self._sealed())",
           "sealed = listing.sealed",
           "a compaction re-reads the sealed mark after reading the raw events"),
    Mutant("compaction-deletes-written", JOURNAL,
           "delete = [k for k in dict.fromkeys(delete) if k not in written]",
           "delete = list(dict.fromkeys(delete))",
           "a compaction never deletes a segment it just wrote"),
    Mutant("in-segment-no-relist", JOURNAL,
           "return bool(self._retrying(lambda: self._listed_in_segment(event)))",
           "return self._listed_in_segment(event)",
           "an append whose segment vanished lists the history again before judging "
           "itself void"),
    # ---------------------------------------------------------------- recorded offsets
    Mutant("starts-not-compared", OFFSETS,
           "if self.starts and other.starts:\n            return self == other",
           "if False:\n            return self == other",
           "a replay is the same batch only if its starts agree (BatchOffsets.starts)"),
    Mutant("starts-not-recorded", OFFSETS,
           "body[\"starts\"] = list(self.starts)",
           "pass",
           "a transaction record keeps the batch's starts"),
    Mutant("decision-without-offsets", TXN,
           "decision[\"offsets\"] = txn.offsets.to_dict()",
           "pass",
           "a commit decision records the batch's source offsets"),
    Mutant("shifted-replay-not-looked-for", TXN,
           "elsewhere = self._published_elsewhere(txn, decided)",
           "elsewhere = None",
           "a replay under a shifted batch id (a rescale's repartition batch) is found by "
           "its start among the decisions below its id"),
    Mutant("shifted-skip-notes-the-replay", TXN,
           "if decided is not None:\n            self._noted(txn.batch, \"\", decided)",
           "if decided is not None:\n            self._note(txn.batch, offsets)",
           "the batch id a sink knew last is noted with the offsets recorded at that id, "
           "not a skipped shifted replay's"),
    # ---------------------------------------------------------------- answer-once
    Mutant("answered-requests-pending", CHANNEL,
           "and key[: -len(\".json\")] + _RESULT_SUFFIX not in keys)",
           ")",
           "a request with an answer is not pending any more (answered once)"),
    Mutant("savepoint-answered-twice", "runtime/checkpoint/coordinator.py",
           "if p.request_id is None or existing.extra.get(\"request_id\") != p.request_id:",
           "if p.request_id is None:",
           "an existing savepoint answers only its own request"),
    # ---------------------------------------------------------------- restore's choice
    Mutant("restore-ignores-lease", "runtime/checkpoint/catalog.py",
           "valid_checkpoint_ids(ids, record)",
           "ids",
           "restore(latest) counts only the checkpoints the lease holder counts"),
    Mutant("fallback-distrusts-first-key", CHOOSE,
           "damaged |= exc.keys",
           "damaged |= set(sorted(exc.keys)[:1])",
           "a fallback distrusts every damaged key it found"),
    Mutant("fallback-forgets-damage", CHOOSE,
           "damaged=frozenset(damaged), by=by)",
           "damaged=frozenset(), by=by)",
           "a fallback hands the damaged keys on (uploaded again, never reused)"),
    # ---------------------------------------------------------------- the run floor
    Mutant("restore-below-floor", CHOOSE,
           "own = [i for i in counted.ids if floor is None or i >= floor]",
           "own = list(counted.ids)",
           "restore(latest) of a run never goes below the run's first checkpoint"),
    Mutant("job-drops-floor", "runtime/job/checkpointed_job.py",
           "floor=self._run_floor if target == \"latest\" else None",
           "floor=None",
           "the job hands its run floor to restore(latest)"),
    # ---------------------------------------------------------------- the retention floor
    Mutant("reader-ignores-retention-floor", "runtime/checkpoint/catalog.py",
           "tuple(i for i in counting if floor is None or i >= floor), {n: newest})",
           "tuple(counting), {n: newest})",
           "readers ignore a marker below the newest readable marker's retention floor (a "
           "late copy of a subsumed marker never counts again)"),
    Mutant("floor-below-retained", STORE,
           "return ids[-max(self.num_retained, 1):][0]",
           "return ids[0]",
           "a manifest records as its retention floor the lowest id retained once it "
           "completed (not an older one retention deletes)"),
    Mutant("restore-below-retention-floor", CHOOSE,
           "counted = catalog.counted()",
           "counted = catalog.counted()\n"
           "        from airflow_ckpt.runtime.lease.record import read_lease, "
           "valid_checkpoint_ids\n"
           "        counted = type(counted)(tuple(valid_checkpoint_ids(sorted(catalog."
           "_checkpoint_dirs(completed_only=True)), read_lease(storage, job))), counted.read)",
           "restore(latest) falls back only to checkpoints at or above the retention floor: "
           "when none of them restores it refuses, never resumes one below (a design "
           "decision, docs/architecture.md: job seed 304536)"),
    Mutant("resubmit-ignores-own-checkpoint", "supervision.py",
           "if first_restore == RESTORE_LATEST or progress.may_restore_latest:",
           "if first_restore == RESTORE_LATEST:",
           "a resubmission restores latest once the run has a checkpoint of its own"),
    # ---------------------------------------------------------- the savepoint history
    Mutant("history-ignores-restored-mark", HISTORY,
           "return entry.in_history and restored not in keys",
           "return entry.in_history",
           "retention never disposes of a savepoint a run restored from (its mark)"),
    Mutant("history-disposes-named", HISTORY,
           "return entry.in_history and restored not in keys",
           "return restored not in keys",
           "retention disposes only of history savepoints, never a named or imported one"),
    Mutant("history-disposes-newest", HISTORY,
           "key=lambda e: e.checkpoint_id)[:-1]",
           "key=lambda e: e.checkpoint_id)",
           "retention never disposes of the newest history savepoint"),
    Mutant("restore-leaves-no-mark", "runtime/job/checkpointed_job.py",
           "mark_restored(self.storage, restored.manifest)",
           "pass",
           "a run marks the savepoint it restored from before its query starts"),
    Mutant("control-forgets-answer-first", "runtime/control/channel.py",
           "self.storage.delete_many(requests)\n            self.storage.delete_many(old)",
           "self.storage.delete_many(old)\n            self.storage.delete_many(requests)",
           "an answered request is deleted before its answer (never acted on again)"),
    Mutant("control-forgets-busy-request", "runtime/control/channel.py",
           "if self._request_id(request) in busy:",
           "if False:",
           "a request the driver still acts on is never deleted (its answer would land "
           "again)"),
    Mutant("terminal-event-ignored", "runtime/history/restart_log.py",
           "if event.type in TERMINAL_EVENTS:\n            state.attempt_end = event",
           "if False:\n            state.attempt_end = event",
           "a terminal event after the submission ends the supervision"),
)


def check(mutants: Iterable[Mutant] = MUTANTS, root: Path = PACKAGE) -> None:
    """Raise :class:`MutantRotError` unless every mutant's ``old`` text occurs exactly
    once in its file (and names are unique)."""
    seen: set[str] = set()
    for mutant in mutants:
        if mutant.name in seen:
            raise MutantRotError(f"two mutants are named {mutant.name}")
        seen.add(mutant.name)
        found = (root / mutant.file).read_text().count(mutant.old)
        if found != 1:
            raise MutantRotError(f"mutant {mutant.name}: its old text occurs {found} times "
                                 f"in {mutant.file}, not once: update the mutant")


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the simulation did to one mutant."""

    mutant: Mutant
    killed: bool
    seeds: int  # seeds explored (the last one killed it, if killed)
    how: str  # the invariant, seed and world that killed it, or why it counts as killed
    seconds: float

    def line(self) -> str:
        if self.killed:
            return (f"KILLED   {self.mutant.name}: after {self.seeds} seed(s), {self.how} "
                    f"({self.seconds:.0f} s)")
        return (f"SURVIVED {self.mutant.name}: {self.seeds} seeds, every invariant held "
                f"({self.mutant.condition}; {self.seconds:.0f} s)")


def judge(mutant: Mutant, seeds: int = SEEDS, timeout_s: float = TIMEOUT_S) -> Verdict:
    """Run the simulation against ``mutant`` planted in a temporary copy of the package
    (a subprocess, niced); the worktree is never modified."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"mutant-{mutant.name}-") as tmp:
        root = Path(tmp)
        shutil.copytree(PACKAGE, root / "airflow_ckpt",
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        mutant.apply(root / "airflow_ckpt")
        env = {**os.environ, "PYTHONPATH": str(root), "PYTHONDONTWRITEBYTECODE": "1"}
        try:
            done = subprocess.run(
                [sys.executable, "-m", "airflow_ckpt.testing.mutants", "--explore",
                 str(seeds)],
                cwd=root, env=env, capture_output=True, text=True, timeout=timeout_s,
                preexec_fn=lambda: os.nice(10), check=False)
        except subprocess.TimeoutExpired:
            return Verdict(mutant, True, seeds, f"the simulation hung ({timeout_s:g} s)",
                           time.monotonic() - started)
    elapsed = time.monotonic() - started
    lines = done.stdout.strip().splitlines()
    try:
        result = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        result = None
    if done.returncode != 0 or not isinstance(result, dict):
        error = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return Verdict(mutant, True, 0, f"the simulation itself failed: {error}", elapsed)
    if result["invariant"] is None:
        return Verdict(mutant, False, result["seeds"], "", elapsed)
    return Verdict(mutant, True, result["seeds"],
                   f"[{result['invariant']}] seed {result['seed']} world {result['world']}",
                   elapsed)


def _explore(seeds: int) -> int:
    """The subprocess's side: explore seeds 0..seeds-1 in every world (of the package
    on its path, mutated), stop at the first violation, print the result as JSON."""
    import logging

    from airflow_ckpt.testing.sim.job import KNOWN_DEFECTS
    from airflow_ckpt.testing.simulation import INVARIANTS, WORLDS, explore

    logging.disable(logging.CRITICAL)
    # a defect the unmutated runtime still has (reported by make simulate) kills nothing
    judged = set(INVARIANTS) - KNOWN_DEFECTS
    result = explore(range(seeds), worlds=list(WORLDS), stop_when_any=judged)
    found = {i: o for i, o in result.first.items() if i in judged}
    invariant = min(found, key=lambda i: found[i].seed, default=None)
    first = found[invariant] if invariant is not None else None
    print(json.dumps({"seeds": result.seeds, "invariant": invariant,
                      "seed": first.seed if first else None,
                      "world": first.world if first else None}))
    return 0


def run(mutants: Sequence[Mutant], seeds: int = SEEDS, jobs: int = 2) -> list[Verdict]:
    """Judge ``mutants`` (``jobs`` subprocesses at most at once), printing each verdict
    as it comes; in the order given."""
    check(mutants)
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = [pool.submit(judge, m, seeds) for m in mutants]
        verdicts = []
        for future in futures:
            verdict = future.result()
            print(verdict.line(), flush=True)
            verdicts.append(verdict)
    return verdicts


def main(argv: list[str] | None = None) -> int:
    """``python -m airflow_ckpt.testing.mutants [--seeds N] [--jobs J] [--only NAME]``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=SEEDS,
                        help="seeds per mutant (default: make test's 200)")
    parser.add_argument("--jobs", type=int, default=2, help="mutants judged at once")
    parser.add_argument("--only", action="append", default=[],
                        choices=[m.name for m in MUTANTS], help="judge only this mutant")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--equivalent", action="store_true",
                        help="judge the equivalent mutants too (they survive by construction)")
    parser.add_argument("--explore", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.explore is not None:
        return _explore(args.explore)
    chosen = [m for m in MUTANTS if not args.only or m.name in args.only]
    if args.list:
        check(chosen)
        for mutant in chosen:
            print(f"{mutant.name:34s} {mutant.file}: {mutant.condition}"
                  + (f" [equivalent: {mutant.equivalent}]" if mutant.equivalent else ""))
        return 0
    if not args.equivalent and not args.only:
        for mutant in (m for m in chosen if m.equivalent):
            print(f"EQUIVALENT {mutant.name} (not run): {mutant.equivalent}")
        chosen = [m for m in chosen if not m.equivalent]
    started = time.monotonic()
    verdicts = run(chosen, args.seeds, args.jobs)
    killed = sum(v.killed for v in verdicts)
    survivors = [v.mutant.name for v in verdicts if not v.killed]
    print(f"{killed} of {len(verdicts)} mutants killed within {args.seeds} seeds "
          f"({time.monotonic() - started:.0f} s)"
          + (f"; survivors: {', '.join(survivors)}" if survivors else ""))
    return 0 if not survivors else 1


if __name__ == "__main__":
    sys.exit(main())
