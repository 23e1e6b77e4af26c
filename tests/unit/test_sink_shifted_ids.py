"""A replay under a shifted batch id (issue 29): Spark's offline state repartitioning
(``state_partitions``) appends a repartition batch that takes the restored batch ``b``'s
offsets as id ``b+1``, so every later batch reads under an id one higher than the batch
that first read it. The sink recognises such a replay by where it starts: it looks
down its commit decisions for the one with the same start, only after a discontinuity
(a decision at the batch id with another start, or none and the batches below not
ending where this one starts), so a steady run sends no extra request.

The sinks are driven directly over ``file://`` storage; the offsets come from a
Spark-shaped offsets log (``read_batch_offsets``), as the runtime hands them over. A
rescale is the log's repartition entry: ``offsets/<b+1>`` a copy of ``offsets/<b>``,
never staged into the sink."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_ckpt.errors import SinkReplayMismatchError
from airflow_ckpt.runtime.sinks import JsonLinesSink, ParquetSink
from airflow_ckpt.runtime.sinks.offsets import ReplayPolicy
from airflow_ckpt.runtime.sinks.staged import StagedSink
from airflow_ckpt.runtime.storage import CheckpointStorage, open_storage
from airflow_ckpt.runtime.storage.delegating import DelegatingStorage
from airflow_ckpt.testing.published import published_numbers
from tests.unit.test_sink_replay import OffsetsLog, rows

KINDS = ["parquet", "jsonl"]


class CountingStorage(DelegatingStorage):
    """Counts the requests a sink sends, by method (a fake: every call one request)."""

    def __init__(self, inner: CheckpointStorage) -> None:
        super().__init__(inner)
        self.calls: Counter[str] = Counter()

    def put_bytes(self, key: str, data: bytes, *, create_only: bool = False,
                  if_match: str | None = None) -> str:
        self.calls["put"] += 1
        return super().put_bytes(key, data, create_only=create_only, if_match=if_match)

    def get_bytes(self, key: str) -> bytes:
        self.calls["get"] += 1
        return super().get_bytes(key)

    def get_versioned(self, key: str) -> Any:
        self.calls["get"] += 1
        return super().get_versioned(key)

    def exists(self, key: str) -> bool:
        self.calls["head"] += 1
        return super().exists(key)

    def list(self, prefix: str = "") -> Any:
        self.calls["list"] += 1
        return super().list(prefix)

    def list_dirs(self, prefix: str = "") -> Any:
        self.calls["list"] += 1
        return super().list_dirs(prefix)

    def copy(self, src_key: str, dst_key: str) -> None:
        self.calls["copy"] += 1
        super().copy(src_key, dst_key)

    def delete_many(self, keys: Any) -> None:
        self.calls["delete"] += 1
        super().delete_many(keys)

    def upload_file(self, path: Path, key: str) -> None:
        self.calls["put"] += 1
        super().upload_file(path, key)


@pytest.fixture
def storage(tmp_path: Path) -> Iterator[CountingStorage]:
    store = CountingStorage(open_storage((tmp_path / "store").as_uri()))
    yield store
    store.close()


def sink_of(kind: str, storage: CheckpointStorage, log: OffsetsLog,
            replays: ReplayPolicy | None = None) -> StagedSink:
    """A new life of a sink of ``kind`` (a driver), registered as the runtime does."""
    sink: StagedSink
    if kind == "parquet":
        sink = ParquetSink(storage.uri.rstrip("/") + "/table")
        sink.storage = storage  # counted
        sink.fence(lambda: None)
    else:
        sink = JsonLinesSink(storage, "_out")
    sink.track_offsets(log.reader, replays)
    return sink


def run_batch(sink: StagedSink, log: OffsetsLog, batch_id: int, start: int, end: int,
              *, commit: bool = True) -> None:
    """Spark runs ``batch_id`` over ``[start, end)``: its offsets entry (the end), the
    sink stages it and (``commit``) a checkpoint covering it completes: the runtime
    commits the sink's pending transactions (a skipped replay has none)."""
    log.write(batch_id, json.dumps({"end": end}))
    sink.pre_commit(batch_id, rows(start, end))
    if commit:
        for pending in sink.tracked_pending():
            sink.commit(pending)


def first_run(kind: str, storage: CheckpointStorage, log: OffsetsLog,
              ends: list[int]) -> None:
    """Batches 0.. over ``[0, ends[0])``, ``[ends[0], ends[1])``... committed."""
    sink = sink_of(kind, storage, log)
    start = 0
    for batch_id, end in enumerate(ends):
        run_batch(sink, log, batch_id, start, end)
        start = end


def rescale(log: OffsetsLog, restored: int) -> None:
    """Spark's offline repartitioning after a restore of batch ``restored``: its
    repartition batch ``restored + 1`` takes the restored batch's offsets."""
    text = (log.root / "offsets" / str(restored)).read_text()
    (log.root / "offsets" / str(restored + 1)).write_text(text)


@pytest.mark.parametrize("ahead", [1, 2, 3])
@pytest.mark.parametrize("kind", KINDS)
def test_a_replay_under_a_shifted_id_is_skipped(
        storage: CountingStorage, tmp_path: Path, kind: str, ahead: int) -> None:
    """Batches 0..1+ahead committed; restore of batch 1 with a rescale: the replays of
    batches 2.. come as 3.. (``ahead`` 1: batch 3 has no decision, but batch 2 published
    its input; more: batch 3's decision is batch 3's, another start). Each is skipped,
    the new input after them published once: every number exactly once. On main: a
    refusal (a decision at the id, other offsets) or a duplicate (none)."""
    log = OffsetsLog(tmp_path / "work")
    ends = [10 * (b + 1) for b in range(2 + ahead)]
    first_run(kind, storage, log, ends)
    # the restored checkpoint's working directory: offsets up to batch 1, then the
    # repartition batch 2
    for b in range(2, 2 + ahead):
        (log.root / "offsets" / str(b)).unlink()
    rescale(log, 1)
    sink = sink_of(kind, storage, log)
    sink.recover([1])
    start = ends[1]
    for b in range(3, 3 + ahead + 2):  # the replays, then two batches of new input
        end = start + 10
        run_batch(sink, log, b, start, end)
        start = end
    assert published_numbers(sink) == list(range(start))  # every number once
    assert sink.pending() == []


@pytest.mark.parametrize("kind", KINDS)
def test_a_shifted_replay_from_the_same_start_to_another_end_is_refused(
        storage: CountingStorage, tmp_path: Path, kind: str) -> None:
    """EXACTLY_ONCE: batch 2 published [20, 30); after the rescale, batch 3 reads
    [20, 45) (other batch sizing): publishing it would repeat 20..29, skipping it lose
    30..44. Refused, naming the batch that published that start; nothing published."""
    log = OffsetsLog(tmp_path / "work")
    first_run(kind, storage, log, [10, 20, 30, 40])
    for b in (2, 3):
        (log.root / "offsets" / str(b)).unlink()
    rescale(log, 1)
    sink = sink_of(kind, storage, log)
    sink.recover([1])
    with pytest.raises(SinkReplayMismatchError) as raised:
        run_batch(sink, log, 3, 20, 45)
    assert raised.value.batch_id == 3
    assert "batch 2" in raised.value.committed and '{"end": 30}' in raised.value.committed
    assert '{"end": 45}' in raised.value.replay
    assert published_numbers(sink) == list(range(40))


@pytest.mark.parametrize("decided", [True, False], ids=["decision-at-id", "none-at-id"])
@pytest.mark.parametrize("kind", KINDS)
def test_at_least_once_a_shifted_replay_to_another_end_is_published_as_extra_output(
        storage: CountingStorage, tmp_path: Path, kind: str, decided: bool) -> None:
    """AT_LEAST_ONCE: the same replay [20, 45) is published (20..29 twice, nothing
    lost) after a report naming the batch that published its start: as an extra
    publication of batch 3 when batch 3 has a decision, as batch 3 itself when not."""
    log = OffsetsLog(tmp_path / "work")
    ends = [10, 20, 30, 40] if decided else [10, 20, 30]
    first_run(kind, storage, log, ends)
    for b in range(2, len(ends)):
        (log.root / "offsets" / str(b)).unlink()
    rescale(log, 1)
    reports: list[tuple[str, int, str, str]] = []
    sink = sink_of(kind, storage, log, ReplayPolicy(True, lambda *r: reports.append(r)))
    sink.recover([1])
    run_batch(sink, log, 3, 20, 45)
    ((_, batch, committed, replay),) = reports
    assert batch == 3 and "batch 2" in committed and '{"end": 45}' in replay
    assert published_numbers(sink) == sorted([*range(ends[-1]), *range(20, 45)])


@pytest.mark.parametrize("kind", KINDS)
def test_a_gap_with_no_matching_start_is_recorded_as_before(
        storage: CountingStorage, tmp_path: Path, kind: str) -> None:
    """Batch 2 has no decision and the decisions below it do not end where it starts
    (its source moved on: Spark's offsets say [35, 50)), and none starts there: no
    publication of this input exists, so it is published as on main."""
    log = OffsetsLog(tmp_path / "work")
    first_run(kind, storage, log, [10, 20])
    log.write(1, json.dumps({"end": 35}))  # the restored working directory's batch 1
    sink = sink_of(kind, storage, log)
    sink.recover([])
    run_batch(sink, log, 2, 35, 50)
    assert published_numbers(sink) == [*range(20), *range(35, 50)]


def steady_requests(kind: str, storage: CountingStorage, log: OffsetsLog) -> Counter[str]:
    """The requests of batches 3 and 4 of a steady run (counted after 3 warm-up
    batches), staged and committed one by one."""
    sink = sink_of(kind, storage, log)
    sink.recover([])
    for b in range(3):
        run_batch(sink, log, b, 10 * b, 10 * b + 10)
    before = Counter(storage.calls)
    for b in range(3, 5):
        run_batch(sink, log, b, 10 * b, 10 * b + 10)
    counted = Counter(storage.calls)
    counted.subtract(before)
    return +counted


#: the requests of two steady batches, staged and committed, as on main before the
#: shifted-id check: a batch's GET of its decision, its record, the outcome, the
#: decision, the publication and one delete (Parquet: its file uploaded, copied and
#: its attempt listed, as the counting view is no local directory)
STEADY = {"parquet": {"get": 4, "put": 8, "list": 2, "copy": 2, "delete": 2},
          "jsonl": {"get": 4, "put": 8, "copy": 2, "delete": 2}}


@pytest.mark.parametrize("kind", KINDS)
def test_a_steady_run_pays_no_extra_request(
        storage: CountingStorage, tmp_path: Path, kind: str) -> None:
    assert dict(steady_requests(kind, storage, OffsetsLog(tmp_path / "work"))) == STEADY[kind]


@pytest.mark.parametrize("pending", [True, False], ids=["recovered", "committed-before"])
@pytest.mark.parametrize("kind", KINDS)
def test_after_a_restore_the_first_batch_reads_at_most_the_decision_below_it(
        storage: CountingStorage, tmp_path: Path, kind: str, pending: bool) -> None:
    """Restore of batch 2: a new life knows no batch, so its first batch reads the
    decision below it (one GET per life), unless the recovery committed the restored
    batch (it read that decision then); the batches after it pay nothing extra."""
    log = OffsetsLog(tmp_path / "work")
    sink = sink_of(kind, storage, log)
    for b in range(3):
        run_batch(sink, log, b, 10 * b, 10 * b + 10, commit=b < 2 or not pending)
    sink = sink_of(kind, storage, log)
    sink.recover([2])
    before = Counter(storage.calls)
    run_batch(sink, log, 3, 30, 40, commit=False)
    counted = Counter(storage.calls)
    counted.subtract(before)
    # its decision (none), [the decision of batch 2], its staged data and its record
    assert dict(+counted) == {"get": 1 if pending else 2, "put": 2}
    before = Counter(storage.calls)
    run_batch(sink, log, 4, 40, 50, commit=False)
    counted = Counter(storage.calls)
    counted.subtract(before)
    assert dict(+counted) == {"get": 1, "put": 2}
    assert published_numbers(sink) == list(range(30))


@pytest.mark.parametrize("kind", KINDS)
def test_a_batch_after_a_gap_in_the_ids_looks_even_if_it_starts_where_the_known_one_ended(
        storage: CountingStorage, tmp_path: Path, kind: str) -> None:
    """The recovery committed the restored batch 1 (its record outlived the commit's
    clean-up: still pending), so the sink knows batch 1 and its end; after the rescale
    batch 3 starts there, but batch 2 (not 1) is the id below it, and batch 2's decision
    published this input: skipped, not published twice."""
    log = OffsetsLog(tmp_path / "work")
    sink = sink_of(kind, storage, log)
    run_batch(sink, log, 0, 0, 10)
    run_batch(sink, log, 1, 10, 20)
    key = sink.transactions.txn_key(1)
    decided = storage.get_bytes(sink.transactions.decision_key(1))  # committed
    run_batch(sink, log, 2, 20, 30)
    # batch 1's record back in place, as a commit whose clean-up failed leaves it
    staged = json.loads(decided)
    storage.put_bytes(key, json.dumps({
        "batch": 1, "attempt": staged["attempt"], "state": "staged", "payload": {
            "files": [{"name": f["staged"].rsplit("/", 1)[-1], "size": f["size"],
                       "rows": f["rows"]} for f in staged.get("files", [])]},
        "offsets": staged["offsets"]}, sort_keys=True).encode())
    (log.root / "offsets" / "2").unlink()
    rescale(log, 1)
    sink = sink_of(kind, storage, log)
    sink.recover([1])
    assert sink.transactions._last is not None and sink.transactions._last[0] == 1
    run_batch(sink, log, 3, 20, 30)
    run_batch(sink, log, 4, 30, 40)
    assert published_numbers(sink) == list(range(40))
