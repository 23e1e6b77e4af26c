"""A committed batch id staged again (a replay after a restore older than the sink's
output, issue 19 item 2): skipped if it read the same source offsets; if it read others,
refused with ``SinkReplayMismatchError`` under EXACTLY_ONCE, published as extra output
(reported, nothing lost) under AT_LEAST_ONCE -- never dropped silently, the committed
output never deleted nor changed. The sinks are driven directly over ``file://``
storage; the offsets come from a Spark-shaped offsets log (``read_batch_offsets``), as
the runtime hands them over."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from airflow_ckpt.errors import (
    ConcurrentDriverError,
    PreconditionFailedError,
    SinkReplayMismatchError,
    SinkTransactionAbortedError,
)
from airflow_ckpt.runtime.sinks import JsonLinesSink, ParquetSink, TwoPhaseCommitSink
from airflow_ckpt.runtime.sinks.offsets import (
    BatchOffsets,
    ReplayPolicy,
    check_replay,
    read_batch_offsets,
)
from airflow_ckpt.runtime.sinks.transactions import SinkTransactions, Transaction
from airflow_ckpt.runtime.storage import CheckpointStorage, open_storage
from airflow_ckpt.runtime.storage.base import ObjectInfo
from airflow_ckpt.testing.published import published_numbers


class OwnSink(TwoPhaseCommitSink):
    """A user's sink built on the documented contract without SinkTransactions: it
    publishes each batch into a keyed table (here a dict) and keeps the offsets it
    committed, and checks a replay of a published batch with ``check_replay``."""

    def __init__(self) -> None:
        self.staged: dict[int, tuple[list[dict[str, Any]], BatchOffsets | None]] = {}
        self.table: dict[int, list[dict[str, Any]]] = {}
        self.offsets: dict[int, dict[str, Any] | None] = {}

    def pre_commit(self, batch_id: int, rows: Sequence[dict[str, Any]]) -> None:
        offsets = self.batch_offsets(batch_id)
        if batch_id in self.table:
            check_replay(repr(self), batch_id, self.offsets[batch_id], offsets)
            return  # the same input: published already
        self.staged[batch_id] = (list(rows), offsets)

    def commit(self, batch_id: int) -> None:
        if batch_id in self.staged:
            rows, offsets = self.staged.pop(batch_id)
            self.table[batch_id] = rows
            self.offsets[batch_id] = offsets.to_dict() if offsets else None

    def abort(self, batch_id: int) -> None:
        self.staged.pop(batch_id, None)

    def pending(self) -> list[int]:
        return sorted(self.staged)

    def committed_batches(self) -> list[int]:
        return sorted(self.table)

    def committed_rows(self) -> list[dict[str, Any]]:
        return [r for rows in self.table.values() for r in rows]


@pytest.fixture
def storage(tmp_path: Path) -> Iterator[CheckpointStorage]:
    store = open_storage((tmp_path / "store").as_uri())
    yield store
    store.close()


def make_sink(kind: str, storage: CheckpointStorage) -> TwoPhaseCommitSink:
    if kind == "parquet":
        return ParquetSink(storage.uri.rstrip("/") + "/table")
    if kind == "jsonl":
        return JsonLinesSink(storage, "_out")
    return OwnSink()


def staged_leftovers(sink: TwoPhaseCommitSink) -> list[str]:
    if isinstance(sink, ParquetSink):
        return [i.key for i in sink.storage.list("_staging/")]
    if isinstance(sink, JsonLinesSink):
        return [i.key for i in sink.storage.list("_out/_pending/")]
    assert isinstance(sink, OwnSink)
    return [str(b) for b in sink.staged]


class OffsetsLog:
    """A query's checkpoint directory as Spark writes it: ``offsets/<batch>`` (version,
    metadata with a fresh timestamp each time, one line per source) and, for a file
    source, ``sources/0/<logOffset>`` listing the batch's files."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.timestamp = 1_700_000_000_000

    def write(self, batch_id: int, *sources: str, files: Sequence[str] = ()) -> None:
        self.timestamp += 1
        meta = {"batchWatermarkMs": 0, "batchTimestampMs": self.timestamp, "conf": {}}
        offsets = self.root / "offsets" / str(batch_id)
        offsets.parent.mkdir(parents=True, exist_ok=True)
        offsets.write_text("\n".join(["v1", json.dumps(meta), *sources]))
        if files:
            log_offset = json.loads(sources[0])["logOffset"]
            entry = self.root / "sources" / "0" / str(log_offset)
            entry.parent.mkdir(parents=True, exist_ok=True)
            entry.write_text("\n".join(["v1", *(json.dumps(
                {"path": f, "timestamp": 1, "batchId": log_offset}) for f in files)]))

    def reader(self, batch_id: int) -> BatchOffsets | None:
        return read_batch_offsets(self.root, batch_id)


def rows(start: int, end: int) -> list[dict[str, Any]]:
    return [{"n": n} for n in range(start, end)]


def run_batch(sink: TwoPhaseCommitSink, log: OffsetsLog, batch_id: int, start: int,
              end: int, *, commit: bool = True) -> None:
    """Spark runs batch ``batch_id`` over the numbers ``[start, end)``: its offsets-log
    entry, then the sink stages it and (``commit``) commits it."""
    log.write(batch_id, json.dumps({"end": end}))
    sink.pre_commit(batch_id, rows(start, end))
    if commit:
        sink.commit(batch_id)


def tracked_sink(kind: str, storage: CheckpointStorage, log: OffsetsLog,
                 replays: ReplayPolicy | None = None) -> TwoPhaseCommitSink:
    """A sink of ``kind`` given the offsets of ``log`` (and ``replays``), as the
    runtime registers it."""
    sink = make_sink(kind, storage)
    sink.track_offsets(log.reader, replays)
    return sink


KINDS = ["parquet", "jsonl", "own"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_replay_with_the_same_offsets_is_skipped(
        storage: CheckpointStorage, tmp_path: Path, kind: str) -> None:
    log = OffsetsLog(tmp_path / "work")
    sink = tracked_sink(kind, storage, log)
    run_batch(sink, log, 0, 0, 10)
    run_batch(sink, log, 1, 10, 20)
    # Restore of an older checkpoint: Spark plans batch 1 again, over the same offsets
    # (its metadata line, with the batch timestamp, differs).
    run_batch(sink, log, 1, 10, 20)
    assert published_numbers(sink) == list(range(20))  # once each
    assert sink.pending() == [] and staged_leftovers(sink) == []


@pytest.mark.parametrize("kind", KINDS)
def test_a_replay_with_other_offsets_is_refused_and_the_committed_output_kept(
        storage: CheckpointStorage, tmp_path: Path, kind: str) -> None:
    """The issue's case: batch 5 was [0, 10); after the restore, batch 5 is [0, 40)."""
    log = OffsetsLog(tmp_path / "work")
    sink = tracked_sink(kind, storage, log)
    run_batch(sink, log, 5, 0, 10)
    with pytest.raises(SinkReplayMismatchError) as raised:
        run_batch(sink, log, 5, 0, 40)
    message = str(raised.value)
    assert raised.value.batch_id == 5
    assert '{"end": 10}' in message and '{"end": 40}' in message  # both offset ranges
    assert "restore the newest checkpoint" in message and "new output location" in message
    # nothing of the replay published, the committed batch kept; a commit of batch 5
    # (the checkpoint covering it) changes nothing either
    sink.commit(5)
    assert published_numbers(sink) == list(range(10))
    assert sink.pending() == [] and staged_leftovers(sink) == []


@pytest.mark.parametrize("kind", ["parquet", "jsonl"])
def test_at_least_once_a_replay_with_other_offsets_is_published_as_extra_output(
        storage: CheckpointStorage, tmp_path: Path, kind: str,
        caplog: pytest.LogCaptureFixture) -> None:
    """AT_LEAST_ONCE (duplicates allowed): the issue's replay of batch 5, [0, 40) after a
    committed [0, 10), is published as extra output -- every row of it reaches the sink,
    rows 0..9 twice -- after a WARNING and a report naming the batch and both offset
    ranges; the committed decision is unchanged, and a replay of the same offsets again
    is skipped (that input is published already). Failed on main: refused."""
    log = OffsetsLog(tmp_path / "work")
    reports: list[tuple[str, int, str, str]] = []
    sink = tracked_sink(kind, storage, log,
                        ReplayPolicy(True, lambda *r: reports.append(r)))
    assert isinstance(sink, (JsonLinesSink, ParquetSink))
    run_batch(sink, log, 5, 0, 10)
    decision = sink.storage.get_bytes(sink.transactions.decision_key(5))

    with caplog.at_level(logging.WARNING, logger="airflow_ckpt.sinks"):
        run_batch(sink, log, 5, 0, 40)  # AT_LEAST_ONCE commits right after staging
    assert published_numbers(sink) == sorted([*range(10), *range(40)])
    ((name, batch, committed, replay),) = reports
    assert (name, batch) == (repr(sink), 5)
    assert '{"end": 10}' in committed and '{"end": 40}' in replay
    assert "batch 5" in caplog.text and '{"end": 10}' in caplog.text \
        and '{"end": 40}' in caplog.text and "extra output" in caplog.text
    assert sink.pending() == [] and staged_leftovers(sink) == []
    assert sink.committed_batches() == [5]
    assert sink.storage.get_bytes(sink.transactions.decision_key(5)) == decision  # unchanged

    run_batch(sink, log, 5, 0, 40)  # the same replay once more: skipped
    assert published_numbers(sink) == sorted([*range(10), *range(40)])
    assert len(reports) == 1 and staged_leftovers(sink) == []


@pytest.mark.parametrize("kept", [False, True], ids=["aborted", "kept"])
@pytest.mark.parametrize("next_mode", ["AT_LEAST_ONCE", "EXACTLY_ONCE"])
@pytest.mark.parametrize("kind", ["parquet", "jsonl"])
def test_an_extra_publication_left_staged_is_settled_by_the_next_recovery(
        storage: CheckpointStorage, tmp_path: Path, kind: str, next_mode: str,
        kept: bool) -> None:
    """A crash between staging the extra publication and its commit; the next driver
    life (in either mode) recovers: not in the restored checkpoint, it is aborted (its
    staging deleted, the batch's own publication kept) and the next replay with those
    offsets publishes it after all; in the checkpoint, it is committed."""
    log = OffsetsLog(tmp_path / "work")
    sink = tracked_sink(kind, storage, log, ReplayPolicy(True))
    run_batch(sink, log, 5, 0, 10)
    run_batch(sink, log, 5, 0, 20, commit=False)
    assert sink.pending() == [5]
    later = tracked_sink(kind, storage, log, ReplayPolicy(next_mode == "AT_LEAST_ONCE"))
    later.recover(commit=[5] if kept else [])
    assert later.pending() == [] and staged_leftovers(later) == []
    if kept:
        assert published_numbers(later) == sorted([*range(10), *range(20)])
        return
    assert published_numbers(later) == list(range(10))
    if next_mode == "AT_LEAST_ONCE":
        run_batch(later, log, 5, 0, 20)
        assert published_numbers(later) == sorted([*range(10), *range(20)])


@pytest.mark.parametrize("mode", ["EXACTLY_ONCE", "AT_LEAST_ONCE"])
def test_only_at_least_once_commits_list_the_extra_publications(
        storage: CheckpointStorage, tmp_path: Path, mode: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Looking for a batch's extra publications costs a LIST per commit: paid only where
    the job publishes them (recovery and abort always look)."""
    listed: list[str] = []
    real_list = storage.list

    def tracked_list(prefix: str = "") -> list[ObjectInfo]:
        listed.append(prefix)
        return real_list(prefix)

    monkeypatch.setattr(storage, "list", tracked_list)
    log = OffsetsLog(tmp_path / "work")
    sink = tracked_sink("jsonl", storage, log, ReplayPolicy(mode == "AT_LEAST_ONCE"))
    for b in range(3):
        run_batch(sink, log, b, 10 * b, 10 * b + 10)
    looked = [p for p in listed if p.startswith("_out/_txn/0")]
    assert looked == ([] if mode == "EXACTLY_ONCE" else
                      [f"_out/_txn/{b:012d}." for b in range(3)])
    assert published_numbers(sink) == list(range(30))


@pytest.mark.parametrize("kind", ["parquet", "jsonl"])
def test_a_file_source_replay_listing_other_files_under_the_same_log_offset_is_refused(
        storage: CheckpointStorage, tmp_path: Path, kind: str) -> None:
    """A file source's offset is only ``{"logOffset": n}``: the files are compared."""
    log = OffsetsLog(tmp_path / "work")
    sink = make_sink(kind, storage)
    sink.track_offsets(log.reader)
    offset = json.dumps({"logOffset": 2})
    log.write(2, offset, files=["file:///in/3.txt"])
    sink.pre_commit(2, rows(0, 10))
    sink.commit(2)
    log.write(2, offset, files=["file:///in/3.txt"])
    sink.pre_commit(2, rows(0, 10))  # same files: skipped
    log.write(2, offset, files=["file:///in/3.txt", "file:///in/4.txt"])
    with pytest.raises(SinkReplayMismatchError, match=r"\(2 files\)"):
        sink.pre_commit(2, rows(0, 20))
    assert published_numbers(sink) == list(range(10))


@pytest.mark.parametrize("mode", ["EXACTLY_ONCE", "AT_LEAST_ONCE"])
@pytest.mark.parametrize("kind", ["parquet", "jsonl"])
def test_a_decision_without_recorded_offsets_cannot_vouch_for_a_replay(
        storage: CheckpointStorage, tmp_path: Path, kind: str, mode: str) -> None:
    """A decision taken without offsets (the sink ran without the runtime, or an older
    version wrote it) is no proof that a runtime replay is the same batch: refused, or
    under AT_LEAST_ONCE published as extra output."""
    log = OffsetsLog(tmp_path / "work")
    sink = make_sink(kind, storage)
    sink.pre_commit(3, rows(0, 10))
    sink.commit(3)
    sink.track_offsets(log.reader, ReplayPolicy(mode == "AT_LEAST_ONCE"))
    if mode == "EXACTLY_ONCE":
        with pytest.raises(SinkReplayMismatchError, match="not recorded"):
            run_batch(sink, log, 3, 0, 10)
        assert published_numbers(sink) == list(range(10))
    else:
        run_batch(sink, log, 3, 0, 10)
        assert published_numbers(sink) == sorted([*range(10), *range(10)])


@pytest.mark.parametrize("kind", ["parquet", "jsonl"])
def test_without_the_runtime_a_replay_is_skipped_with_a_warning(
        storage: CheckpointStorage, kind: str, caplog: pytest.LogCaptureFixture) -> None:
    sink = make_sink(kind, storage)
    sink.pre_commit(0, rows(0, 10))
    sink.commit(0)
    with caplog.at_level(logging.WARNING, logger="airflow_ckpt.sinks"):
        sink.pre_commit(0, rows(0, 40))
    assert "no source offsets to compare" in caplog.text
    assert published_numbers(sink) == list(range(10))


def test_the_decision_records_the_offsets_of_the_record_it_was_taken_from(
        storage: CheckpointStorage) -> None:
    txns = SinkTransactions(storage, "t/")
    offsets = BatchOffsets(('{"end": 10}',))
    txns.record(Transaction(4, "a1", "staged", {}, offsets))
    decision = txns.decide(4, lambda txn: {"attempt": txn.attempt})
    assert decision is not None and decision["offsets"] == offsets.to_dict()
    assert BatchOffsets.from_dict(decision["offsets"]).digest == offsets.digest
    assert txns.current(4) == Transaction(4, "a1", "staged", {}, offsets)


def test_offsets_ignore_the_batch_metadata_and_a_missing_entry_is_none(tmp_path: Path) -> None:
    log = OffsetsLog(tmp_path)
    log.write(0, json.dumps({"end": 10}), "-")
    first = read_batch_offsets(tmp_path, 0)
    log.write(0, json.dumps({"end": 10}), "-")  # a new batch timestamp only
    assert first is not None and first == read_batch_offsets(tmp_path, 0)
    assert first.sources == ('{"end": 10}', "-")
    assert read_batch_offsets(tmp_path, 1) is None


def _kafka_start(root: Path, offset: int) -> None:
    """Spark's Kafka source keeps its resolved ``startingOffsets`` in ``sources/0/0``:
    a 0 byte, ``v1``, the offsets as JSON."""
    entry = root / "sources" / "0" / "0"
    entry.parent.mkdir(parents=True, exist_ok=True)
    entry.write_bytes(b"\x00v1\n" + json.dumps({"t": {"0": offset}}).encode())


@pytest.mark.parametrize("kind", ["parquet", "jsonl"])  # the stored sinks: a new run's too
def test_a_new_start_reaching_the_same_end_offset_from_earlier_is_refused(
        storage: CheckpointStorage, tmp_path: Path, kind: str) -> None:
    """Issue 25 item 5: a Kafka job first ran with ``startingOffsets=latest`` (batch 0
    read 50..59), then started into the same output with ``restore=none`` and
    ``earliest``: batch 0 plans 0..59, the same end offset. Compared by end offsets
    alone it was skipped as "the same source offsets" and 0..49 never reached the
    output."""
    first = OffsetsLog(tmp_path / "run-1")
    _kafka_start(first.root, 50)
    sink = tracked_sink(kind, storage, first)
    first.write(0, json.dumps({"t": {"0": 60}}))
    sink.pre_commit(0, rows(50, 60))
    sink.commit(0)

    second = OffsetsLog(tmp_path / "run-2")
    _kafka_start(second.root, 0)
    sink = tracked_sink(kind, storage, second)
    second.write(0, json.dumps({"t": {"0": 60}}))
    with pytest.raises(SinkReplayMismatchError) as raised:
        sink.pre_commit(0, rows(0, 60))
    assert '{"t": {"0": 50}}' in str(raised.value) and '{"t": {"0": 0}}' in str(raised.value)
    assert published_numbers(sink) == list(range(50, 60))


def test_a_replay_from_the_same_start_is_the_same_batch_and_old_records_still_match(
        tmp_path: Path) -> None:
    log = OffsetsLog(tmp_path / "work")
    _kafka_start(log.root, 50)
    log.write(0, json.dumps({"t": {"0": 60}}))
    log.write(1, json.dumps({"t": {"0": 70}}))
    committed = read_batch_offsets(log.root, 1)
    assert committed is not None and committed.starts == ('{"t": {"0": 60}}',)
    log.write(1, json.dumps({"t": {"0": 70}}))  # replayed after a restore of batch 0
    replay = read_batch_offsets(log.root, 1)
    assert replay is not None and check_replay("s", 1, committed.to_dict(), replay)
    # a record written before starts were recorded is compared by its end offsets
    legacy = {k: v for k, v in committed.to_dict().items() if k != "starts"}
    legacy["digest"] = BatchOffsets(committed.sources, committed.files).digest
    assert check_replay("s", 1, legacy, replay)


@pytest.mark.parametrize("kind", ["parquet", "jsonl"])
def test_restoring_a_snapshot_whose_transaction_was_aborted_since_is_refused(
        kind: str, storage: CheckpointStorage, tmp_path: Path) -> None:
    """Found by the job world of the simulation (seed 201646): a savepoint listed batch
    0's staged transaction; the next run found no checkpoint (a savepoint is no
    ``latest``), started afresh and its recovery aborted the transaction; a later
    run restored the savepoint, whose recovery "committed" the aborted transaction as a
    no-op, and the restored state never replayed batch 0: its rows were lost silently.
    Now that recovery is refused (a documented, final refusal)."""
    log = OffsetsLog(tmp_path / "work")
    sink = tracked_sink(kind, storage, log)
    run_batch(sink, log, 0, 0, 3, commit=False)  # listed by the savepoint, not committed
    tracked_sink(kind, storage, log).recover([])  # a fresh start aborts it
    restored = tracked_sink(kind, storage, log)
    with pytest.raises(SinkTransactionAbortedError, match="batch 0"):
        restored.recover([0])  # the savepoint's transactions
    assert published_numbers(restored) == []  # nothing half-published either


@pytest.mark.parametrize("kind", ["parquet", "jsonl"])
def test_restoring_a_snapshot_whose_batch_another_start_published_is_refused(
        kind: str, storage: CheckpointStorage, tmp_path: Path) -> None:
    """Found by the sinks world (seed 1450): a checkpoint listed batch 0's staged
    transaction (numbers 0..2); a run started anew (restore=none, its source at 3)
    aborted it and published its own batch 0 (number 3); a later explicit restore of
    the checkpoint found a decision for batch 0 and "recovered" onto it: numbers 0..2
    were never published. The restored batch's offsets are compared with the
    decision's; other offsets are the documented refusal."""
    log = OffsetsLog(tmp_path / "work")
    run_batch(tracked_sink(kind, storage, log), log, 0, 0, 3, commit=False)  # listed
    anew = OffsetsLog(tmp_path / "anew")
    fresh = tracked_sink(kind, storage, anew)
    fresh.recover([])  # restore=none aborts it
    run_batch(fresh, anew, 0, 3, 4)  # and publishes its own batch 0
    restored = tracked_sink(kind, storage, log)  # Spark's restored log: batch 0 read 0..2
    with pytest.raises(SinkTransactionAbortedError, match="other source offsets"):
        restored.recover([0])
    assert published_numbers(restored) == [3]  # what was published stays
    again = tracked_sink(kind, storage, anew)  # a restore of the new start's checkpoint
    again.recover([0])  # its own batch 0: the same offsets, recovered as committed


@pytest.mark.parametrize("kind", ["parquet", "jsonl"])
def test_restoring_a_snapshot_whose_batch_another_run_staged_again_is_refused(
        kind: str, storage: CheckpointStorage, tmp_path: Path) -> None:
    """Found by the sinks world (seed 308234): checkpoint 2 listed batch 1's staged
    transaction (numbers 3..4); a run that restored an older checkpoint superseded it
    with its own staging of batch 1 from other input (number 3) and was deposed before
    committing; a later explicit restore of checkpoint 2 found that staged record, no
    decision, and "recovered" it: number 4 was never published. A restored batch is
    committed only from the input it read; other offsets are the documented refusal,
    before anything is written."""
    log = OffsetsLog(tmp_path / "work")
    run_batch(tracked_sink(kind, storage, log), log, 0, 0, 3, commit=False)  # listed
    older = OffsetsLog(tmp_path / "older")
    other = tracked_sink(kind, storage, older)
    other.recover([])  # its restore did not list batch 0: aborted
    run_batch(other, older, 0, 0, 1, commit=False)  # staged again, not committed
    restored = tracked_sink(kind, storage, log)
    with pytest.raises(SinkTransactionAbortedError, match="staged batch 0 from other"):
        restored.recover([0])
    assert published_numbers(restored) == []
    assert not restored.committed_batches()  # refused before any decision
    again = tracked_sink(kind, storage, older)  # a restore of the other run's checkpoint
    again.recover([0])
    assert published_numbers(again) == [0]


def restored_then(kind: str, storage: CheckpointStorage, tmp_path: Path,
                  then: Callable[[OffsetsLog], object]) -> tuple[TwoPhaseCommitSink, OffsetsLog]:
    """A sink that staged batch 0 (listed by the checkpoint it restores), restored by a
    sink whose recovery runs ``then`` with another run's offsets log right after it
    judged the restored batches, before their commit reads the records: another run's
    write held in the network, landing late."""
    log = OffsetsLog(tmp_path / "work")
    run_batch(tracked_sink(kind, storage, log), log, 0, 0, 3, commit=False)  # listed
    older = OffsetsLog(tmp_path / "older")
    restored = tracked_sink(kind, storage, log)
    judge = restored.transactions.require_committable  # type: ignore[attr-defined]

    def judged_then(batches: Any, offsets: Any = None) -> None:
        judge(batches, offsets)
        then(older)

    restored.transactions.require_committable = judged_then  # type: ignore[attr-defined]
    return restored, older


@pytest.mark.parametrize("kind", ["parquet", "jsonl"])
def test_a_restored_batch_superseded_after_its_judgement_is_refused_at_its_commit(
        kind: str, storage: CheckpointStorage, tmp_path: Path) -> None:
    """The same story with the other run's record swap landing late (a deposed
    driver's PUT held in the network): after the recovery judged the restored batch,
    before its commit read the record. The decision then names the other input, and
    the commit raises before publishing it as the restored batch (a restore of the
    other run's checkpoint publishes it)."""
    restored, older = restored_then(kind, storage, tmp_path, lambda older: run_batch(
        tracked_sink(kind, storage, older), older, 0, 0, 1, commit=False))
    with pytest.raises(SinkTransactionAbortedError, match="committed batch 0 from other"):
        restored.recover([0])
    again = tracked_sink(kind, storage, older)  # the decision is the other run's batch
    again.recover([0])
    assert published_numbers(again) == [0]


def test_a_driver_held_after_its_confirm_never_returns_its_successors_decision(
        storage: CheckpointStorage) -> None:
    """Found by the sinks world (seed 310469, session 15): a driver read its staged
    record of batch 1 and confirmed its lease, then was held before its outcome write;
    a successor aborted that attempt, staged batch 1 from other input and committed it.
    The held driver's create-only outcome found ``abort``, and its commit returned the
    successor's decision as if its own batch were published. It now confirms again
    after reading an abort outcome: the successor's claim makes that raise."""
    deposed = [False]
    successor = SinkTransactions(storage, "t/", lambda: None)

    def confirm() -> None:
        if deposed[0]:
            raise ConcurrentDriverError("job 'j': another driver claimed the job")
        deposed[0] = True  # passes; the successor acts before the held outcome write
        successor.abort(1)
        successor.record(Transaction(1, "a2", "staged", {}, BatchOffsets(('{"end": 5}',))))
        successor.decide(1, lambda txn: {"attempt": txn.attempt})

    held = SinkTransactions(storage, "t/", confirm)
    held.record(Transaction(1, "a1", "staged", {}, BatchOffsets(('{"end": 4}',))))
    with pytest.raises(ConcurrentDriverError):
        held.decide(1, lambda txn: {"attempt": txn.attempt})
    assert successor.decision(1) == {"attempt": "a2", "offsets": BatchOffsets(
        ('{"end": 5}',)).to_dict()}


def test_a_listing_later_in_a_life_never_counts_a_deposed_drivers_late_record(
        storage: CheckpointStorage) -> None:
    """Found by the sinks world (seed 315040, session 15): a deposed driver's record
    create for batch 5, held in the network, landed after the holder's recovery had
    swept that batch's staging; the holder skipped its own replay of batch 5 (a
    verdict raised through ``record``, which forgets what it knows), listed the
    records again at its next checkpoint, counted the late record as pending and
    committed it: ``CorruptCheckpointError``, its staging gone. A listing later in a
    life counts only the attempts the life's first listing found or it recorded."""
    holder = SinkTransactions(storage, "t/", lambda: None)
    assert holder.staged() == []  # the life's first listing (its recovery)
    deposed = SinkTransactions(storage, "t/", lambda: None)
    deposed.record(Transaction(5, "late", "staged", {}, BatchOffsets(('{"end": 7}',))))
    holder.record(Transaction(4, "mine", "staged", {}, BatchOffsets(('{"end": 6}',))))
    holder.forget()  # e.g. a write whose outcome is unknown
    assert holder.staged() == [4]
    assert holder.listed() == [4, 5]  # what storage holds, for any reader
    holder.restart()  # the next life rolls it forward or aborts it
    assert holder.staged() == [4, 5]


def test_a_deposed_drivers_commit_of_an_aborted_attempt_raises(
        storage: CheckpointStorage) -> None:
    """Found by the simulation (sinks world, seed 58 once the swarm suspends hosts): a
    driver whose host was suspended past a takeover commits a batch its completed
    checkpoint lists; the successor's recovery had aborted it. The commit must not
    return as if the batch were published: the confirm after reading the aborted
    record sees the successor's claim."""
    deposed = [False]

    def confirm() -> None:
        if deposed[0]:
            raise ConcurrentDriverError("job 'j': another driver claimed the job")

    txns = SinkTransactions(storage, "t/", confirm)
    txns.record(Transaction(1, "a1", "staged", {}, BatchOffsets(('{"end": 5}',))))
    txns.abort(1)  # the successor's recovery (it claimed the lease first)
    deposed[0] = True
    with pytest.raises(ConcurrentDriverError):
        txns.decide(1, lambda txn: {"attempt": txn.attempt})
    deposed[0] = False  # the holder itself: the aborted attempt's output is lost
    with pytest.raises(SinkTransactionAbortedError):
        txns.decide(1, lambda txn: {"attempt": txn.attempt})


@pytest.mark.parametrize("kind", ["parquet", "jsonl"])
def test_a_restored_batch_aborted_after_its_judgement_is_refused_at_its_commit(
        kind: str, storage: CheckpointStorage, tmp_path: Path) -> None:
    """Found by the sinks world (seed 401637, session 18's scan): a run that went back
    to an older checkpoint aborted batch 0 (its outcome ``abort``), its record swap held
    in the network; a later run restored the newer checkpoint that lists batch 0 and
    judged it committable (the record still read staged). The swap then landed, and the
    commit read the record aborted with no decision and returned as if nothing were
    staged: the restored batch was never published and nothing was refused. It is
    refused now (``SinkTransactionAbortedError``), as when the recovery reads it
    aborted."""
    # the other run's restore does not list batch 0
    restored, _ = restored_then(kind, storage, tmp_path,
                                lambda older: tracked_sink(kind, storage, older).recover([]))
    with pytest.raises(SinkTransactionAbortedError):
        restored.recover([0])
    assert published_numbers(restored) == []
    assert not restored.committed_batches()


def test_a_supersede_read_before_an_abort_never_lands_after_the_sweep(
        storage: CheckpointStorage) -> None:
    """Found by the sinks world (seed 346417, session 16's scan): a run started anew
    aborted batch 0's attempt a1, staged a2 and read the aborted record to supersede
    it; the swap's answer was lost (held in the network) and the query restarted in
    process. That life's recovery found the record aborted, so it swept batch 0's
    staging (a2's too) without a write; the held swap then landed, If-Match the
    unchanged version, and named a2. A later run that restored a checkpoint listing
    batch 0 committed a2: ``CorruptCheckpointError``, its staging gone. An abort that
    finds the record aborted now rewrites it (a fence), so the late swap fails."""
    txns = SinkTransactions(storage, "t/")
    txns.record(Transaction(0, "a1", "staged", {}, BatchOffsets(('{"end": 2}',))))
    assert isinstance(txns.abort(0), Transaction)
    key = txns.txn_key(0)
    read = storage.get_versioned(key)  # the supersede by a2 reads the aborted record
    late = Transaction(0, "a2", "staged", {}, BatchOffsets(('{"end": 2}',))).to_json()
    again = SinkTransactions(storage, "t/")  # the restarted life's recovery
    aborted = again.abort(0)
    assert isinstance(aborted, Transaction) and aborted.attempt == "a1"
    with pytest.raises(PreconditionFailedError):
        storage.put_bytes(key, late, if_match=read.etag)  # the held swap lands now
    assert Transaction.from_json(storage.get_bytes(key)).state == "aborted"
    assert isinstance(again.abort(0), Transaction)  # a second sweep fences again
