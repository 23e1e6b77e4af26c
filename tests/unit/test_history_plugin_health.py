"""The history UI's health badges, DAG filtering, trends and its reads after compaction.

Same approach as ``test_history_plugin.py``: the real app over a ``file://`` storage that
holds what the runtime and the supervisor write.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_ckpt.plugins import jobstate
from airflow_ckpt.plugins.access import DagAccess, access_of
from airflow_ckpt.plugins.app import create_app
from airflow_ckpt.plugins.history import CheckpointHistoryLink
from airflow_ckpt.plugins.redact import driver_text
from airflow_ckpt.plugins.settings import PluginSettings
from airflow_ckpt.runtime.history import events as ev
from airflow_ckpt.runtime.history.journal import CompactionPolicy, JobHistory
from airflow_ckpt.runtime.storage import CheckpointStorage, open_storage
from tests.fixtures.checkpoint_history import (
    DAG_ID,
    JOB,
    TREND_DAG,
    TREND_JOB,
    parse_page,
    write_lease,
    write_story,
    write_trend_story,
)

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

@pytest.fixture
def storage(tmp_path: Path) -> Iterator[CheckpointStorage]:
    store = open_storage(f"file://{tmp_path / 'ckpt'}")
    write_story(store)  # odd-even, submitted by stream_dag, finished
    # clicks-per-minute, submitted by clicks_dag, running (a 60 s interval: a slow
    # machine does not make it stale during the test)
    write_trend_story(store, time.time(), interval_s=60.0)
    JobHistory(store, "manual-job").append(ev.JOB_STARTED, run_id="by-hand")  # no DAG
    yield store
    store.close()


def client_for(storage: CheckpointStorage, access: DagAccess | None = None) -> TestClient:
    app = create_app(PluginSettings(storage.uri), authenticate=False,
                     dag_access=(lambda: access) if access else None)
    return TestClient(app)


# ------------------------------------------------------------------------ health badges


def _index_health(storage: CheckpointStorage) -> dict[str, dict[str, Any]]:
    with client_for(storage) as c:
        return {j["id"]: j["health"] for j in c.get("/jobs").json()["jobs"]}


def test_index_shows_health_and_time_since_the_last_checkpoint(
    storage: CheckpointStorage,
) -> None:
    health = _index_health(storage)
    assert health[JOB]["status"] == "finished"
    assert health[TREND_JOB]["status"] == "running"
    assert 0 <= health[TREND_JOB]["last_completed_age_s"] < 180
    assert health["manual-job"]["status"] == "running"  # no checkpoint_config: no verdict
    with client_for(storage) as c:
        tables, _ = parse_page(c.get("/").text)
    rows = {r.attrs["id"]: r.cells for r in tables["jobs"]}
    assert rows[f"job-{TREND_JOB}"]["health"] == "running"
    assert rows[f"job-{TREND_JOB}"]["age"].endswith("s ago")
    assert rows[f"job-{TREND_JOB}"]["dag"] == TREND_DAG


def test_silent_lease_is_a_dead_driver(storage: CheckpointStorage) -> None:
    write_lease(storage, TREND_JOB, heartbeat_ts=time.time() - 300, epoch=2)
    health = _index_health(storage)[TREND_JOB]
    assert health["status"] == "dead"
    assert health["detail"].startswith("no heartbeat for ")
    write_lease(storage, TREND_JOB, heartbeat_ts=time.time(), released=True, epoch=3)
    assert _index_health(storage)[TREND_JOB]["detail"] == "driver released its lease"


def test_health_rules() -> None:
    def event(t: str, ts: float, **data: Any) -> ev.HistoryEvent:
        return ev.HistoryEvent(t, ts, f"j/history/{int(ts * 1000):013d}-a.json", data)

    started = event(ev.JOB_STARTED, 1000, checkpoint_config={
        "execution.checkpointing.interval": "10 s"})
    state = jobstate.state_of("j", [started])
    assert state.interval_s == 10.0
    fresh_lease = jobstate.LeaseView(1, 1035.0, False, 30.0)
    assert jobstate.job_health(state, 1020, fresh_lease, 1040).status == "running"
    stale = jobstate.job_health(state, 1020, fresh_lease, 1060)
    assert (stale.status, stale.label) == ("stale", "stale checkpoints")
    assert jobstate.job_health(state, 1020, fresh_lease, 1060, stale_multiple=5).status \
        == "running"
    failing = jobstate.state_of("j", [event(ev.FAILURE, 1030, level="query", cause="boom"),
                                      started])
    assert jobstate.job_health(failing, 1020, fresh_lease, 1040).detail == "query failure: boom"
    assert jobstate.job_health(failing, 1035, fresh_lease, 1040).status == "running"  # healed
    # a failure before the newest start belongs to an earlier driver
    older = jobstate.state_of("j", [started, event(ev.FAILURE, 900, cause="old")])
    assert older.last_failure is None
    assert jobstate.job_health(state, 1020, jobstate.LeaseView(1, 970.0, False, 30.0),
                               1040).status == "dead"
    finished = jobstate.state_of("j", [event(ev.JOB_FINISHED, 1100), started])
    assert jobstate.job_health(finished, 1020, None, 9999).status == "finished"
    failed = jobstate.state_of("j", [event(ev.JOB_FAILED, 1100, cause="gave up"), started])
    assert jobstate.job_health(failed, None, None, 9999).label == "failed"
    assert jobstate.job_health(jobstate.state_of("j", []), None, None, 1).status == "unknown"


def test_driver_text_is_the_single_rendering_point(
    storage: CheckpointStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Masking applied in redact.driver_text reaches every place driver text is shown."""
    from airflow_ckpt.plugins import redact

    monkeypatch.setattr(redact, "driver_text", lambda v: "" if v is None else "[masked]")
    for module in ("overview", "jobstate", "trends", "failures"):
        monkeypatch.setattr(f"airflow_ckpt.plugins.{module}.driver_text", redact.driver_text)
    with client_for(storage) as c:
        page = c.get(f"/view/{JOB}").text
        body = c.get(f"/jobs/{JOB}/checkpoints").json()
    assert "timed out" not in page and "killed" not in page and "OutOfMemoryError" not in page
    assert body["latest"]["failed"]["failure_message"] == "[masked]"
    assert driver_text(None) == "" and driver_text(3) == "3"


# ------------------------------------------------------------------------- DAG access


def test_jobs_of_unreadable_dags_are_hidden_everywhere(storage: CheckpointStorage) -> None:
    with client_for(storage, DagAccess(False, frozenset({DAG_ID}))) as c:
        assert [j["id"] for j in c.get("/jobs").json()["jobs"]] == [JOB]
        tables, _ = parse_page(c.get("/").text)
        assert [r.attrs["id"] for r in tables["jobs"]] == [f"job-{JOB}"]
        for path in (f"/view/{TREND_JOB}", f"/jobs/{TREND_JOB}/history",
                     f"/jobs/{TREND_JOB}/checkpoints", "/view/manual-job"):
            response = c.get(path)
            assert response.status_code == 404, path
            assert "nothing stored" in response.text  # as an unknown job: no leak
        assert c.get(f"/view/{JOB}").status_code == 200
        task = {"dag_id": TREND_DAG, "run_id": "scheduled__1", "task_id": "stream"}
        assert c.get("/task", params=task).status_code == 404
        assert c.get("/task", params={**task, "job": TREND_JOB}).status_code == 404
    with client_for(storage, DagAccess(True)) as c:  # may read every DAG: unowned jobs too
        assert {j["id"] for j in c.get("/jobs").json()["jobs"]} == {JOB, TREND_JOB,
                                                                    "manual-job"}
        response = c.get("/task", params={"dag_id": TREND_DAG, "run_id": "scheduled__1",
                                          "task_id": "stream"}, follow_redirects=False)
        assert response.headers["location"] == f"view/{TREND_JOB}"


class FakeAuthManager:
    def __init__(self, all_dags: bool, ids: set[str]) -> None:
        self.all_dags, self.ids = all_dags, ids
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def is_authorized_dag(self, **kwargs: Any) -> bool:
        self.calls.append(("is_authorized_dag", kwargs))
        return self.all_dags

    def get_authorized_dag_ids(self, **kwargs: Any) -> set[str]:
        self.calls.append(("get_authorized_dag_ids", kwargs))
        return self.ids


def test_access_asks_the_auth_manager_like_airflows_own_routes() -> None:
    admin = FakeAuthManager(True, set())
    assert access_of(admin, "u") == DagAccess(True)
    assert admin.calls == [("is_authorized_dag", {"method": "GET", "user": "u"})]
    viewer = FakeAuthManager(False, {"a", "b"})
    access = access_of(viewer, "v")
    assert access.may_read("a") and not access.may_read("c") and not access.may_read(None)
    assert viewer.calls[-1] == ("get_authorized_dag_ids", {"user": "v", "method": "GET"})


# ----------------------------------------------------------------------------- trends


def test_job_page_has_summary_and_svg_charts_with_restarts(storage: CheckpointStorage) -> None:
    with client_for(storage) as c:
        response = c.get(f"/view/{TREND_JOB}")
        stats = c.get(f"/jobs/{TREND_JOB}/checkpoints").json()
    html = response.text
    tables, texts = parse_page(html)
    assert texts["job-health"] == "running"
    assert texts["job-dag"] == TREND_DAG
    summary = {r.attrs["data-field"]: r.cells for r in tables["summary"]}
    e2e = stats["summary"]["end_to_end_duration"]
    assert e2e["min"] <= e2e["p50"] <= e2e["p99"] <= e2e["max"] and e2e["count"] == 88
    assert summary["end_to_end_duration"]["p99"] == f"{e2e['p99']} ms"
    for chart in ("chart-duration", "chart-size"):
        assert f'id="{chart}"' in html
    assert html.count("<polyline") == 3  # duration; state + checkpointed size
    # restart, restore and the two failed checkpoints on both charts' time axis
    assert html.count('class="marker m-restart"') == 2
    assert html.count('class="marker m-restored"') == 2
    assert html.count('class="marker m-checkpoint_failed"') == 4
    assert "<b>x</b>" not in html and "executor lost &lt;b&gt;x" in html  # escaped
    assert "style=" not in html and "<script" not in html  # the CSP allows neither


def test_percentiles_are_nearest_rank() -> None:
    from airflow_ckpt.plugins.trends import percentile

    assert percentile(list(range(1, 101)), 99) == 99
    assert percentile([5], 99) == 5
    assert percentile([], 50) is None


# ----------------------------------------------------------------- after compaction


def test_pages_are_the_same_after_compaction(storage: CheckpointStorage) -> None:
    with client_for(storage) as c:
        before = c.get(f"/jobs/{JOB}/checkpoints").json()
        events_before = c.get(f"/jobs/{JOB}/history").json()["events"]
        trend_before = c.get(f"/jobs/{TREND_JOB}/checkpoints").json()
    policy = CompactionPolicy(segment_events=7)
    for job in (JOB, TREND_JOB):
        assert JobHistory(storage, job).compact(policy).compacted
    with client_for(storage) as c:
        assert c.get(f"/jobs/{JOB}/checkpoints").json() == before
        assert c.get(f"/jobs/{JOB}/history").json()["events"] == events_before
        after = c.get(f"/jobs/{TREND_JOB}/checkpoints").json()
        assert after["summary"] == trend_before["summary"]
        assert after["history"] == trend_before["history"]
        assert {j["id"]: j["health"]["status"] for j in c.get("/jobs").json()["jobs"]}[
            TREND_JOB] == "running"
        newest = c.get(f"/jobs/{JOB}/history", params={"limit": 3}).json()
    assert [e["type"] for e in newest["events"]] == [
        "checkpoint_completed", "savepoint_completed", "job_finished"]
    assert newest["history_window"] == {"events_read": 3, "events_total": 15,
                                        "truncated": True}


# ------------------------------------------------------------------------- task link


def test_extra_link_carries_the_rendered_job_name(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_ckpt.plugins import history as plugin

    class Key:
        dag_id, task_id, run_id, map_index, try_number = "d", "t", "r", -1, 1

    class Op:
        job_name = "{{ params.job }}"

    monkeypatch.delenv("AIRFLOW__API__BASE_URL", raising=False)
    monkeypatch.setattr(plugin, "rendered_job_name", lambda key: "rendered-job")
    url = CheckpointHistoryLink().get_link(Op(), ti_key=Key())  # type: ignore[arg-type]
    assert url.endswith("&job=rendered-job")
    monkeypatch.undo()
    assert plugin.rendered_job_name(Key()) is None  # type: ignore[arg-type]  # no DB row
