"""Exactly once across a restore older than the sink's output (issue 19 item 2 / D), per
case: ``restore=latest`` falling back past a damaged checkpoint, an explicit older
checkpoint, a savepoint, and a new job name over the same output. The real
``CheckpointedJob`` (restore, coordinator, store, sinks) runs a simulated micro-batch
query that plans batches from its source as Spark does: each new batch starts where the
previous one in the offsets log ended and takes up to ``per_batch`` of the numbers
available, and the last offsets-log entry without a commit is re-run as it is.

In every case the outcome is one of the two documented ones: each number committed
exactly once with the right running sum (the replays read what the committed batches
read, and are skipped), or ``SinkReplayMismatchError`` with the committed output intact
(a replay read other offsets). Never a loss, never a duplicate. Under AT_LEAST_ONCE a
replay that read other offsets is published as extra output instead: every number at
least once, the repeats reported."""

from __future__ import annotations

import itertools
import json
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from airflow_ckpt.errors import ObjectAlreadyExistsError, SinkReplayMismatchError
from airflow_ckpt.runtime.checkpoint.catalog import CheckpointCatalog
from airflow_ckpt.runtime.control.channel import ControlChannel
from airflow_ckpt.runtime.history import events as ev
from airflow_ckpt.runtime.history.journal import JobHistory
from airflow_ckpt.runtime.job import CheckpointedJob
from airflow_ckpt.runtime.sinks import JsonLinesSink, ParquetSink, TwoPhaseCommitSink
from airflow_ckpt.runtime.sinks.offsets import check_replay
from airflow_ckpt.runtime.sinks.transactions import SinkTransactions, Transaction
from airflow_ckpt.runtime.storage import CheckpointStorage, open_storage
from airflow_ckpt.testing.damage import damage_one_file
from airflow_ckpt.testing.published import published_rows
from airflow_ckpt.testing.simquery import SimulatedQuery, SimulatedSpark, run_to_end, write_file

JOB = "replay"
CONFIG = {
    "execution.checkpointing.interval": "1 ms",
    "execution.checkpointing.min-pause": "0 ms",
    "execution.checkpointing.num-retained": 20,
    "execution.checkpointing.incremental": True,
}


@dataclass
class Source:
    """The input: numbers ``1..available``; a batch takes up to ``per_batch`` of them."""

    available: int
    per_batch: int


class _Query(SimulatedQuery):
    """Plans as Spark's MicroBatchExecution plans: re-run the newest offsets-log entry if
    it has no commit, else a new batch from the previous entry's end offset; state
    version ``b + 1`` holds the running sum."""

    def __init__(self, workdir: Path, fn: Callable[[Any, int], None], source: Source,
                 on_batch: Callable[[int], None]) -> None:
        super().__init__(workdir, fn, on_batch)
        self.source = source
        self.total = 0
        self.clock = itertools.count(1_700_000_000_000)
        write_file(workdir / "metadata", json.dumps({"id": "replay-query"}))
        write_file(workdir / "state" / "0" / "_metadata" / "metadata",
                   'v1\n{"stateStoreInfo":[{"storeName":"default","numPartitions":1}]}')

    def _logged(self, name: str) -> list[int]:
        return sorted(int(p.name) for p in (self.workdir / name).glob("*") if p.name.isdigit())

    def _end(self, batch: int) -> int:
        if batch < 0:
            return 0
        lines = (self.workdir / "offsets" / str(batch)).read_text().splitlines()
        return int(json.loads(lines[2])["end"])

    def _span(self) -> tuple[int, int, int] | None:
        """(batch, start, end) of the batch to run next, or None if there is none."""
        offsets, commits = self._logged("offsets"), self._logged("commits")
        if offsets and offsets[-1] not in commits:  # re-run as logged
            b = offsets[-1]
            return b, self._end(b - 1), self._end(b)
        b = offsets[-1] + 1 if offsets else 0
        start = self._end(b - 1)
        end = min(start + self.source.per_batch, self.source.available)
        return (b, start, end) if end > start else None

    def _plan(self) -> int | None:
        span = self._span()
        return span[0] if span is not None else None

    def _input(self, b: int) -> list[dict[str, Any]]:
        span = self._span()
        assert span is not None and span[0] == b
        _, start, end = span
        meta = {"batchWatermarkMs": 0, "batchTimestampMs": next(self.clock), "conf": {
            "spark.sql.shuffle.partitions": "1"}}
        if not (self.workdir / "offsets" / str(b)).exists():
            write_file(self.workdir / "offsets" / str(b),
                       f"v1\n{json.dumps(meta)}\n{json.dumps({'end': end})}")
        state = self.workdir / "state" / "0" / "0"
        self.total = json.loads((state / f"{b}.delta").read_text())["sum"] if b else 0
        rows = []
        for n in range(start + 1, end + 1):
            self.total += n
            rows.append({"n": n, "batch": b, "running": self.total})
        return rows

    def _finish(self, b: int) -> None:
        write_file(self.workdir / "state" / "0" / "0" / f"{b + 1}.delta",
                   json.dumps({"sum": self.total}))
        write_file(self.workdir / "commits" / str(b), "v1\n{}")


class SourceSpark(SimulatedSpark):
    """The simulated session whose query reads ``source``."""

    def __init__(self, source: Source, on_batch: Callable[[int], None]) -> None:
        super().__init__(on_batch)
        self.source = source

    def query(self, workdir: Path, fn: Callable[[Any, int], None]) -> _Query:
        return _Query(workdir, fn, self.source, self.on_batch)


class OwnSink(TwoPhaseCommitSink):
    """A user's sink on the documented contract: its records through SinkTransactions
    (the offsets go into each ``Transaction``), its published rows as one JSON object per
    batch under ``own/``."""

    def __init__(self, storage: CheckpointStorage) -> None:
        self.storage = storage
        self.transactions = SinkTransactions(storage, "own/", name="OwnSink")
        self.staged: dict[str, list[dict[str, Any]]] = {}

    def fence(self, gate: Callable[[], None],
              confirm: Callable[[], None] = lambda: None) -> None:
        self.transactions = SinkTransactions(self.storage, "own/", confirm, "OwnSink")

    def pre_commit(self, batch_id: int, rows: Sequence[dict[str, Any]]) -> None:
        attempt = f"a{len(self.staged)}-{batch_id}"
        self.storage.put_bytes(f"own/_staged/{attempt}.json", json.dumps(list(rows)).encode())
        try:
            self.transactions.record(Transaction(batch_id, attempt, "staged",
                                                 offsets=self.batch_offsets(batch_id)))
        except (ObjectAlreadyExistsError, SinkReplayMismatchError) as exc:
            # committed already: skipped (same offsets) or refused (other offsets)
            self.storage.delete_many([f"own/_staged/{attempt}.json"])
            if isinstance(exc, SinkReplayMismatchError):
                raise

    def commit(self, batch_id: int) -> None:
        decision = self.transactions.decide(batch_id, lambda t: {"attempt": t.attempt})
        if decision is not None:
            self.storage.copy(f"own/_staged/{decision['attempt']}.json",
                              f"own/part-{batch_id:012d}.json")
            self.transactions.finish(batch_id)

    def abort(self, batch_id: int) -> None:
        self.transactions.abort(batch_id)

    def pending(self) -> list[int]:
        return self.transactions.staged()

    def committed_batches(self) -> list[int]:
        return self.transactions.committed_batches()

    def committed_rows(self) -> list[dict[str, Any]]:
        return [r for i in self.storage.list("own/part-")
                for r in json.loads(self.storage.get_bytes(i.key))]


class RowsParquetSink(ParquetSink):
    """``ParquetSink`` staging the simulated query's rows on the driver
    (``pre_commit``): its decisions, records and publishing as they are, no Spark."""

    stage = TwoPhaseCommitSink.stage


def make_sink(kind: str, storage: CheckpointStorage) -> TwoPhaseCommitSink:
    if kind == "parquet":
        return RowsParquetSink(storage.uri.rstrip("/") + "/table")
    return JsonLinesSink(storage, "_out") if kind == "jsonl" else OwnSink(storage)


def run_life(storage: CheckpointStorage, workdir: Path, source: Source, kind: str, *,
             job: str = JOB, restore: str = "latest",
             on_batch: Callable[[int], None] = lambda b: None,
             mode: str = "EXACTLY_ONCE") -> str:
    spark = SourceSpark(source, on_batch)
    driver = CheckpointedJob(
        spark,  # type: ignore[arg-type]
        job=job, storage=storage,
        checkpoint_config={**CONFIG, "execution.checkpointing.mode": mode},
        restart_strategy={"type": "fixed-delay", "fixed-delay.attempts": 3,
                          "fixed-delay.delay": "0 s"},
        restore=restore, workdir=workdir, threaded=False,
    )
    return run_to_end(driver, spark, make_sink(kind, storage))


def expect_exactly_once(sink: TwoPhaseCommitSink, available: int) -> None:
    rows = published_rows(sink)
    assert [r["n"] for r in rows] == list(range(1, available + 1))  # each number once
    assert all(r["running"] == r["n"] * (r["n"] + 1) // 2 for r in rows)  # state right


@pytest.fixture
def storage(tmp_path: Path) -> Iterator[CheckpointStorage]:
    store = open_storage((tmp_path / "store").as_uri())
    yield store
    store.close()


def first_life(storage: CheckpointStorage, tmp_path: Path, kind: str,
               on_batch: Callable[[int], None] = lambda b: None,
               mode: str = "EXACTLY_ONCE") -> TwoPhaseCommitSink:
    """Batches 0..5 of three numbers each, each committed (by a checkpoint, or at once
    under AT_LEAST_ONCE)."""
    assert run_life(storage, tmp_path / "w1", Source(18, 3), kind, on_batch=on_batch,
                    mode=mode) == "finished"
    sink = make_sink(kind, storage)
    assert sink.committed_batches() == list(range(6))
    return sink


def older_checkpoint(storage: CheckpointStorage, batch: int) -> str:
    return next(f"chk-{m.checkpoint_id}" for m in CheckpointCatalog(
        storage, JOB).completed_checkpoints() if m.batch_id == batch)


def damage_checkpoints_after(storage: CheckpointStorage, batch: int) -> None:
    """Every checkpoint newer than ``batch``'s gets a file damaged that the checkpoint of
    ``batch`` does not reference, so ``restore=latest`` falls back to that one."""
    checkpoints = CheckpointCatalog(storage, JOB).completed_checkpoints()
    (kept,) = [m for m in checkpoints if m.batch_id == batch]
    keep = {f.key for f in kept.files}
    for newer in [m for m in checkpoints if m.batch_id > batch]:
        damage_one_file(storage, newer, spare=keep)


def restore_target(case: str, storage: CheckpointStorage) -> tuple[str, str]:
    """(job name, restore target) of the second life for ``case``."""
    if case == "fallback":
        damage_checkpoints_after(storage, 1)
        return JOB, "latest"
    if case == "older checkpoint":
        return JOB, older_checkpoint(storage, 1)
    if case == "savepoint":
        (event,) = JobHistory(storage, JOB).events([ev.SAVEPOINT_COMPLETED])
        return JOB, str(event.data["path"])
    assert case == "new job name"
    return "renamed", "latest"  # a fresh start of another job over the same output


CASES = ["fallback", "older checkpoint", "savepoint", "new job name"]


def savepoint_at_batch_2(storage: CheckpointStorage) -> Callable[[int], None]:
    def on_batch(b: int) -> None:
        if b == 2:
            ControlChannel(storage, JOB).request_savepoint(savepoint_id="sp2", stop=False,
                                                          timeout_s=3600)
    return on_batch


@pytest.mark.parametrize(("mode", "kind"), [
    ("EXACTLY_ONCE", "jsonl"), ("EXACTLY_ONCE", "own"),
    ("AT_LEAST_ONCE", "jsonl"), ("AT_LEAST_ONCE", "parquet")])
@pytest.mark.parametrize("case", CASES)
def test_replays_that_read_what_was_committed_are_skipped_exactly_once(
        storage: CheckpointStorage, tmp_path: Path, case: str, kind: str,
        mode: str) -> None:
    first_life(storage, tmp_path, kind, savepoint_at_batch_2(storage), mode)
    job, target = restore_target(case, storage)
    # More input arrived; batches still take three numbers: the replays of the committed
    # batches read the same offsets, the batches after them are new.
    assert run_life(storage, tmp_path / "w2", Source(30, 3), kind, job=job,
                    restore=target, mode=mode) == "finished"
    expect_exactly_once(make_sink(kind, storage), 30)
    (ahead,) = JobHistory(storage, job).events([ev.SINK_AHEAD])
    assert ahead.data["last_batch"] == 5 and ahead.data["batches"] > 1
    assert ahead.data["first_batch"] == ahead.data["restored_batch"] + 1


@pytest.mark.parametrize("kind", ["jsonl", "own"])
@pytest.mark.parametrize("case", CASES)
def test_a_replay_that_reads_other_offsets_is_refused_before_anything_is_lost(
        storage: CheckpointStorage, tmp_path: Path, case: str, kind: str) -> None:
    """The issue's case: the replayed batch takes everything available now (batch ``b``
    was three numbers, its replay is many more)."""
    first_life(storage, tmp_path, kind, savepoint_at_batch_2(storage))
    job, target = restore_target(case, storage)
    with pytest.raises(SinkReplayMismatchError) as raised:
        run_life(storage, tmp_path / "w2", Source(30, 100), kind, job=job, restore=target)
    refusal = raised.value
    assert 0 <= refusal.batch_id <= 5 and '{"end": 30}' in refusal.replay
    # names the checkpoint or savepoint restored (none for a new job's fresh start)
    assert (refusal.restored is None) == (case == "new job name")
    # nothing lost, nothing repeated, nothing of the replay published
    expect_exactly_once(make_sink(kind, storage), 18)
    assert make_sink(kind, storage).pending() == []
    (failed,) = JobHistory(storage, job).events([ev.JOB_FAILED])
    assert failed.data["error"] == "SinkReplayMismatchError"  # final: not resubmitted
    assert not JobHistory(storage, job).events([ev.RESTART])  # refused at once


@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
@pytest.mark.parametrize("case", CASES)
def test_at_least_once_a_replay_that_reads_other_offsets_is_published_as_extra_output(
        storage: CheckpointStorage, tmp_path: Path, case: str, kind: str) -> None:
    """AT_LEAST_ONCE (duplicates allowed): the first replayed batch takes every number
    now available and is published as extra output, not refused: the run finishes,
    every number reaches the output (the replay's rows with the running sum the
    restored state gives), the repeats are reported in the history. Failed on main:
    SinkReplayMismatchError."""
    mode = "AT_LEAST_ONCE"
    first = published_rows(first_life(storage, tmp_path, kind,
                                      savepoint_at_batch_2(storage), mode))
    job, target = restore_target(case, storage)
    assert run_life(storage, tmp_path / "w2", Source(40, 100), kind, job=job,
                    restore=target, mode=mode) == "finished"
    (published,) = JobHistory(storage, job).events([ev.SINK_REPLAY_PUBLISHED])
    b = published.data["batch"]
    assert f'"end": {3 * b + 3}' in published.data["committed_offsets"]
    assert '"end": 40' in published.data["replay_offsets"]
    assert (published.data["restored"] is None) == (case == "new job name")
    # what the second life added: batch b over every number after batch b - 1's end
    added = Counter(json.dumps(r, sort_keys=True) for r in published_rows(make_sink(
        kind, storage)))
    added.subtract(json.dumps(r, sort_keys=True) for r in first)
    assert sorted(added.elements()) == sorted(json.dumps(
        {"batch": b, "n": n, "running": n * (n + 1) // 2}, sort_keys=True)
        for n in range(3 * b + 1, 41))
    assert make_sink(kind, storage).pending() == []
    assert not JobHistory(storage, job).events([ev.JOB_FAILED])


def test_check_replay_rules() -> None:
    from airflow_ckpt.runtime.sinks.offsets import BatchOffsets

    same = BatchOffsets(('{"end": 3}',))
    assert check_replay("s", 1, same.to_dict(), same) is True
    assert check_replay("s", 1, same.to_dict(), None) is False  # no runtime: unverified
    with pytest.raises(SinkReplayMismatchError, match="not recorded"):
        check_replay("s", 1, None, same)
