"""airflow_ckpt.metrics against a recording Airflow ``Stats`` backend (fast, file storage).

The real StatsD listener and OTel reader tests are tests/integration/test_metrics.py;
these cover the other emitters (the blocking supervisor's watch, sensors, the asset
watcher trigger), the names and the switches.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.configuration import conf
from airflow.sdk.observability import stats
from airflow.sdk.observability.metrics import stats_utils

from airflow_ckpt.metrics import (
    COUNTERS,
    GAUGES,
    EventMetrics,
    count_restart,
    metrics_enabled,
    watching,
)
from airflow_ckpt.runtime.checkpoint.catalog import CheckpointCatalog
from airflow_ckpt.runtime.history.events import (
    CHECKPOINT_COMPLETED,
    CHECKPOINT_FAILED,
    RESTART,
    SAVEPOINT_FAILED,
)
from airflow_ckpt.runtime.history.journal import JobHistory
from airflow_ckpt.runtime.storage import CheckpointStorage
from airflow_ckpt.sensors.checkpoint import match_outcome
from airflow_ckpt.triggers.checkpoint import CheckpointEventTrigger
from airflow_ckpt.triggers.matching import MatchResult, summarize
from tests.fixtures.snapshots import write_snapshot

JOB = "orders"
Sent = tuple[str, str, Any, dict[str, Any] | None]


class Recorder:
    """An Airflow stats backend that keeps what it is sent: (kind, name, value, tags)."""

    def __init__(self) -> None:
        self.sent: list[Sent] = []

    def incr(self, stat: str, count: int = 1, rate: float = 1, *,
             tags: dict[str, Any] | None = None) -> None:
        self.sent.append(("c", stat, count, tags))

    def gauge(self, stat: str, value: float, rate: float = 1, delta: bool = False, *,
              tags: dict[str, Any] | None = None) -> None:
        self.sent.append(("g", stat, value, tags))

    def counts(self) -> dict[str, int]:
        """Counter totals by tagged name (the per-job names must say the same)."""
        tagged: Counter[str] = Counter()
        per_job: Counter[str] = Counter()
        for kind, name, value, tags in self.sent:
            if kind == "c":
                (tagged if tags else per_job)[
                    name.replace(f"airflow_ckpt.{JOB}.", "airflow_ckpt.")] += value
        assert per_job == tagged
        return dict(tagged)

    def gauges(self) -> dict[str, Any]:
        """The last value of each tagged gauge."""
        return {name: value for kind, name, value, tags in self.sent if kind == "g" and tags}


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    recorder = Recorder()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AIRFLOW__METRICS__STATSD_ON", "True")
        stats.initialize(factory=lambda: recorder,
                         export_legacy_names=conf.getboolean("metrics", "legacy_names_on"))
        yield recorder
    stats.initialize(factory=stats_utils.get_stats_factory(),
                     export_legacy_names=conf.getboolean("metrics", "legacy_names_on"))


def checkpoint(history: JobHistory, n: int) -> None:
    history.append(CHECKPOINT_COMPLETED, id=n, end_to_end_duration=10 * n,
                   checkpointed_size=n, state_size=100 * n, latest_ack_timestamp=1000 * n)


def test_blocking_watch_counts_each_event_written_during_the_block_once(
    recorder: Recorder, file_storage: CheckpointStorage,
) -> None:
    """The final look after the block (the driver exited) catches everything: the hour
    between looks decides nothing."""
    history = JobHistory(file_storage, JOB)
    checkpoint(history, 1)  # before the submission: a gauge, never counted
    with watching(history, interval_s=3600):
        checkpoint(history, 2)
        history.append(CHECKPOINT_FAILED, id=3)
        history.append(SAVEPOINT_FAILED, id=4)
        history.append(RESTART, level="query", restart=True)
        history.append(RESTART, level="query", restart=False)  # declined: no restart
    count_restart(JOB)  # the supervisor's own decision, after the block
    with watching(history, interval_s=3600):
        pass  # the next submission's watch: nothing of the above counted again
    assert recorder.counts() == {
        "airflow_ckpt.numberOfCompletedCheckpoints": 1,
        "airflow_ckpt.numberOfFailedCheckpoints": 2,
        "airflow_ckpt.numberOfFailedSavepoints": 1,
        "airflow_ckpt.totalNumberOfCheckpoints": 3,
        "airflow_ckpt.numRestarts": 2,
    }
    assert recorder.gauges() == {
        "airflow_ckpt.lastCheckpointDuration": 20, "airflow_ckpt.lastCheckpointSize": 2,
        "airflow_ckpt.lastCheckpointFullSize": 200, "airflow_ckpt.lastCompletedCheckpointId": 2,
        "airflow_ckpt.lastCheckpointCompletedTimestamp": 2000,
    }
    assert all(tags == {"job_name": JOB} for _, _, _, tags in recorder.sent if tags)


def test_metrics_off_means_no_watch_no_reads(file_storage: CheckpointStorage,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("STATSD_ON", "STATSD_DATADOG_ENABLED", "OTEL_ON"):
        monkeypatch.setenv(f"AIRFLOW__METRICS__{key}", "False")
    assert not metrics_enabled()
    history = JobHistory(file_storage, JOB)
    lists = 0  # by anyone but this thread, whose appends list to number their events
    real_list = file_storage.list

    def counting_list(prefix: str) -> Any:
        nonlocal lists
        lists += threading.current_thread() is not threading.main_thread()
        return real_list(prefix)

    monkeypatch.setattr(file_storage, "list", counting_list)
    assert EventMetrics.start(history) is None
    with watching(history, interval_s=0.001):
        checkpoint(history, 1)
    assert lists == 0


def test_without_legacy_names_only_the_tagged_name(
    recorder: Recorder, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AIRFLOW__METRICS__LEGACY_NAMES_ON", "False")
    count_restart("a.b")
    assert recorder.sent == [("c", "airflow_ckpt.numRestarts", 1, {"job_name": "a.b"})]
    monkeypatch.setenv("AIRFLOW__METRICS__LEGACY_NAMES_ON", "True")
    count_restart("a.b")
    assert recorder.sent[1:] == [("c", "airflow_ckpt.numRestarts", 1, {"job_name": "a.b"}),
                                 ("c", "airflow_ckpt.a__b.numRestarts", 1, None)]


def test_a_failing_backend_never_fails_the_caller(recorder: Recorder,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: Any, **kwargs: Any) -> None:
        raise OSError("no route to the StatsD host")

    monkeypatch.setattr(recorder, "incr", broken)
    count_restart(JOB)  # logged, not raised


def test_a_sensor_match_and_an_asset_watcher_event_set_the_gauges(
    recorder: Recorder, file_storage: CheckpointStorage,
) -> None:
    catalog = CheckpointCatalog(file_storage, JOB)
    m1 = write_snapshot(file_storage, JOB, 1, completed_ts=1_700_000_001.0)
    match_outcome(MatchResult("matched", summary=summarize(catalog, m1)))
    assert recorder.gauges() == {
        "airflow_ckpt.lastCheckpointDuration": m1.timings.end_to_end_duration_ms,
        "airflow_ckpt.lastCheckpointSize": m1.checkpointed_size,
        "airflow_ckpt.lastCheckpointFullSize": m1.state_size,
        "airflow_ckpt.lastCompletedCheckpointId": 1,
        "airflow_ckpt.lastCheckpointCompletedTimestamp": 1_700_000_001_000,
    }
    assert recorder.counts() == {}  # manifests are not events: nothing counted

    class StateStore:  # the asset state store holds the watermark: chk-1 is old
        async def aget(self, key: str) -> Any:
            return {"after_checkpoint_id": 1, "known_savepoints": []}

        async def aset(self, key: str, value: Any) -> None:
            pass

    write_snapshot(file_storage, JOB, 2, completed_ts=1_700_000_002.0)
    trigger = CheckpointEventTrigger(storage_uri=file_storage.uri, job=JOB, conn_id=None)
    trigger.asset_state_store = StateStore()  # type: ignore[assignment]

    async def first() -> dict[str, Any]:
        gen = trigger.run()
        event = await asyncio.wait_for(anext(gen), 10)
        await gen.aclose()  # type: ignore[attr-defined]
        return event.payload

    assert asyncio.run(first())["id"] == 2
    assert recorder.gauges()["airflow_ckpt.lastCompletedCheckpointId"] == 2
    assert recorder.gauges()["airflow_ckpt.lastCheckpointCompletedTimestamp"] == 1_700_000_002_000


def test_the_docs_table_and_the_dashboard_name_what_is_emitted() -> None:
    docs = Path(__file__).resolve().parents[2] / "docs"
    table = re.findall(r"^\| `(\w+)` \| (gauge|counter) \|", (docs / "metrics.md").read_text(),
                       re.MULTILINE)
    assert sorted(table) == sorted([*((g, "gauge") for g in GAUGES),
                                    *((c, "counter") for c in COUNTERS)])
    dashboard = json.loads((docs / "grafana-checkpoints.json").read_text())
    used = {name for panel in dashboard["panels"] for target in panel["targets"]
            for name in re.findall(r"airflow_ckpt_(\w+)", target["expr"])}
    assert used and used <= {*GAUGES, *COUNTERS}
