"""ParquetSink: the two-phase-commit protocol on ``file://`` and on the moto S3 server,
with real local Spark executors writing the files. One SparkSession for the module.

Plain readers (``spark.read.parquet``, pyarrow, pandas) must see every committed row
exactly once and never a staged, pending or aborted file.
"""

from __future__ import annotations

import io
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from airflow_ckpt.runtime.sinks import ParquetSink, TwoPhaseCommitSink
from airflow_ckpt.testing import S3Endpoint

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(params=["file", "s3"])
def sink(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ParquetSink]:
    if request.param == "file":
        yield ParquetSink((tmp_path / "table").as_uri())
        return
    endpoint: S3Endpoint = request.getfixturevalue("s3_endpoint")
    bucket = request.getfixturevalue("s3_bucket")
    # S3 options given to the sink travel to the executors (the Python workers inherit
    # the JVM's environment, fixed before this test could set AWS_* variables)
    yield ParquetSink(f"s3://{bucket}/t-{uuid.uuid4().hex[:8]}", max_attempts=2,
                      endpoint_url=endpoint.url, region_name=endpoint.region_name,
                      aws_access_key_id=endpoint.access_key_id,
                      aws_secret_access_key=endpoint.secret_access_key)


def plain_rows(sink: ParquetSink) -> list[tuple[int, int]]:
    """What pyarrow reads from the table directory without knowing about the sink:
    every object whose path has no ``_``/``.`` segment (pyarrow's own rule)."""
    rows: list[tuple[int, int]] = []
    for info in sink.storage.list(""):
        if any(seg.startswith(("_", ".")) for seg in info.key.split("/")):
            continue
        table = pq.read_table(io.BytesIO(sink.storage.get_bytes(info.key)))
        rows.extend(zip(table.column("k").to_pylist(), table.column("v").to_pylist(),
                        strict=True))
    return sorted(rows)


def batch_df(spark: Any, batch_id: int, n: int = 1000) -> Any:
    return spark.range(n).selectExpr("id AS k", f"id * 10 + {batch_id} AS v").repartition(4)


def expected(batches: list[int], n: int = 1000) -> list[tuple[int, int]]:
    return sorted((k, k * 10 + b) for b in batches for k in range(n))


def test_stage_commit_abort_replay(spark: Any, sink: ParquetSink) -> None:
    assert isinstance(sink, TwoPhaseCommitSink)
    assert sink.last_stage is None
    sink.stage(batch_df(spark, 0), 0)
    staged = sink.last_stage
    assert staged is not None and (staged.batch_id, staged.files, staged.rows) == (0, 4, 1000)
    assert staged.bytes > 0 and staged.write_s > 0 and staged.record_s > 0
    assert sink.pending() == [0]
    assert plain_rows(sink) == []  # staged: invisible
    sink.commit(0)
    assert sink.pending() == []
    assert plain_rows(sink) == expected([0])

    sink.stage(batch_df(spark, 1), 1)
    sink.abort(1)  # aborted: gone
    assert sink.pending() == [] and plain_rows(sink) == expected([0])

    # A replayed batch after a stale attempt: only the newest attempt is committed.
    sink.stage(batch_df(spark, 2), 2)
    sink.stage(batch_df(spark, 2), 2)
    sink.commit(2)
    sink.commit(2)  # idempotent
    assert plain_rows(sink) == expected([0, 2])

    # A batch replayed after its commit, the sink driven without the runtime (no source
    # offsets to compare, test_sink_replay.py has the runtime's rule): skipped, never a
    # second copy; abort rolls forward.
    sink.stage(batch_df(spark, 0), 0)
    sink.commit(0)
    sink.stage(batch_df(spark, 2), 2)
    sink.abort(2)
    assert sink.pending() == []
    assert plain_rows(sink) == expected([0, 2])
    assert sink.committed_batches() == [0, 2]


def test_crash_points_recover_exactly_once(spark: Any, sink: ParquetSink,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Each crash point of a commit, then ``recover`` in a fresh process' sink: every
    row once, nothing staged left."""
    # crash during staging: files staged, no _txn record yet
    sink.stage(batch_df(spark, 0), 0)
    sink.storage.delete_many(["_txn/000000000000.json"])
    # crash after the commit decision, before any file was published
    sink.stage(batch_df(spark, 1), 1)

    def crash(*_: Any) -> None:
        raise KeyboardInterrupt("killed")

    monkeypatch.setattr(sink, "_publish", crash)
    with pytest.raises(KeyboardInterrupt):
        sink.commit(1)
    monkeypatch.undo()
    # crash between pre-commit and commit
    sink.stage(batch_df(spark, 2), 2)
    assert plain_rows(sink) == []

    fresh = ParquetSink(sink.uri, **sink._options)
    # pending: the recorded transactions; batch 0's staging has no record (an orphan
    # that recover aborts)
    assert fresh.pending() == [1, 2]
    assert fresh.storage.list_dirs("_staging/") == ["000000000000", "000000000001",
                                                    "000000000002"]
    # batch 1 is not in the restored checkpoint's list, but its decision exists:
    # abort rolls it forward (a replay of batch 1 would then be dropped)
    fresh.recover(commit=[2])
    assert fresh.pending() == []
    assert plain_rows(fresh) == expected([1, 2])
    assert not fresh.storage.list("_staging/")


def test_crash_mid_commit_rolls_forward(spark: Any, sink: ParquetSink) -> None:
    sink.stage(batch_df(spark, 5), 5)
    sink.commit(5)
    published = sink.committed_files()
    assert len(published) >= 2
    # as if the commit crashed after the first copy: the staging and _txn are back,
    # one published file is missing
    sink.storage.delete_many(published[1:])
    sink.stage(batch_df(spark, 5), 5)  # the replay of a decided batch
    sink.storage.delete_many(published[:1])
    with pytest.raises(Exception, match="neither its staged file"):
        sink.commit(5)


def test_spark_and_pandas_read_the_committed_table(spark: Any, tmp_path: Path) -> None:
    import pandas as pd

    sink = ParquetSink((tmp_path / "t").as_uri())
    for b in range(3):
        sink.stage(batch_df(spark, b), b)
        if b < 2:
            sink.commit(b)  # batch 2 stays pending
    sink.stage(batch_df(spark, 3), 3)
    sink.abort(3)
    path = str(tmp_path / "t")
    got = sorted((r.k, r.v) for r in spark.read.parquet(path).collect())
    assert got == expected([0, 1])
    frame = pd.read_parquet(path)
    assert sorted(zip(frame["k"], frame["v"], strict=True)) == expected([0, 1])


def test_driver_side_pre_commit(sink: ParquetSink) -> None:
    sink.pre_commit(7, [{"k": 1, "v": 2}, {"k": 3, "v": 4}])
    sink.pre_commit(8, [])
    assert plain_rows(sink) == []
    sink.recover(commit=[7, 8])
    assert plain_rows(sink) == [(1, 2), (3, 4)]


def test_a_fenced_sink_publishes_nothing_once_the_lease_is_lost(sink: ParquetSink) -> None:
    """A job registers the sink with its lease gate: a deposed driver can neither decide
    nor publish a commit (on ``file://`` the publishing rename is gated too)."""
    from airflow_ckpt.errors import LeaseExpiredError

    lost = [False]

    def gate() -> None:
        if lost[0]:
            raise LeaseExpiredError("this driver stopped writing")

    sink.fence(gate)
    sink.pre_commit(1, [{"k": 1, "v": 2}])
    lost[0] = True
    with pytest.raises(LeaseExpiredError):
        sink.commit(1)
    assert plain_rows(sink) == []
    lost[0] = False  # a new holder of the lease recovers and publishes it, once
    sink.recover(commit=[1])
    assert plain_rows(sink) == [(1, 2)]
