"""The checkpoint-history plugin: its FastAPI app against a real ``file://`` storage.

The storage holds what the runtime and the supervisor would write (see
``tests/fixtures/checkpoint_history.py``): real ``JobHistory`` events and real
``Manifest`` ``_metadata`` objects for the retained checkpoints.
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_ckpt.errors import EndpointUnreachableError
from airflow_ckpt.plugins import overview
from airflow_ckpt.plugins.app import create_app
from airflow_ckpt.plugins.history import URL_PREFIX, AirflowCkptPlugin, CheckpointHistoryLink
from airflow_ckpt.plugins.settings import PluginSettings, load_settings
from airflow_ckpt.runtime.history.journal import JobHistory
from airflow_ckpt.runtime.storage import CheckpointStorage, open_storage
from airflow_ckpt.runtime.storage.layout import JobLayout
from tests.fixtures.checkpoint_history import (
    DAG_ID,
    EVIL_CAUSE,
    EVIL_MESSAGE,
    JOB,
    RUN_ID,
    TASK_ID,
    Story,
    parse_page,
    write_story,
)

with warnings.catch_warnings():  # starlette suggests httpx2; TestClient works with httpx
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient


@pytest.fixture
def storage(tmp_path: Path) -> Iterator[CheckpointStorage]:
    store = open_storage(f"file://{tmp_path / 'ckpt'}")
    yield store
    store.close()


@pytest.fixture
def story(storage: CheckpointStorage) -> Story:
    return write_story(storage)


@pytest.fixture
def client(storage: CheckpointStorage, story: Story) -> Iterator[TestClient]:
    app = create_app(PluginSettings(storage.uri), authenticate=False)
    with TestClient(app) as test_client:
        yield test_client


# ------------------------------------------------------------------------------ JSON


def test_checkpoints_json_has_flink_rest_shape(
    client: TestClient, story: Story, storage: CheckpointStorage
) -> None:
    response = client.get(f"/jobs/{JOB}/checkpoints")
    assert response.status_code == 200
    body = response.json()
    assert set(body) >= {"counts", "summary", "latest", "history"}
    assert body["counts"] == {"restored": 1, "total": 7, "in_progress": 0, "completed": 6,
                              "failed": 1, "retained": 2, "driver_starts": 2,
                              "in_process_restarts": 0}

    history = body["history"]
    assert [(e["id"], e["status"], e["checkpoint_type"]) for e in history] == [
        (7, "COMPLETED", "SAVEPOINT"), (6, "COMPLETED", "CHECKPOINT"),
        (5, "COMPLETED", "CHECKPOINT"), (4, "FAILED", "CHECKPOINT"),
        (3, "COMPLETED", "CHECKPOINT"), (2, "COMPLETED", "CHECKPOINT"),
        (1, "COMPLETED", "CHECKPOINT"),
    ]
    by_id = {e["id"]: e for e in history}
    # every completed entry carries Manifest.history_entry() unchanged
    for n, manifest in story.manifests.items():
        for key, value in manifest.history_entry().items():
            assert by_id[n][key] == value, (n, key)
    # retained checkpoints are read from _metadata; discarded ones only from events
    assert [n for n, e in by_id.items() if e["status"] == "COMPLETED" and not e["discarded"]] \
        == [7, 6, 5]
    assert body["retained"] == [5, 6]
    assert by_id[6]["external_path"] == f"{storage.uri}/{JOB}/chk-6"
    assert by_id[4]["failure_message"] == EVIL_MESSAGE
    assert by_id[4]["state_size"] is None

    latest = body["latest"]
    assert latest["completed"]["id"] == 6
    assert latest["savepoint"]["savepoint_id"] == "before-upgrade"
    assert latest["savepoint"]["request_id"] == "req-1"
    assert latest["failed"]["id"] == 4
    assert latest["restored"]["id"] == 3
    assert latest["restored"]["external_path"].endswith(f"/{JOB}/chk-3")

    sizes = sorted(m.state_size for m in story.manifests.values())
    assert body["summary"]["state_size"] == {  # Flink's summary, nearest-rank percentiles
        "min": min(sizes), "max": max(sizes), "avg": round(sum(sizes) / len(sizes)),
        "p50": sizes[2], "p99": sizes[5], "count": 6}
    assert body["history_window"] == {"events_read": 15, "events_total": 15,
                                      "truncated": False}
    assert body["errors"] == []


def test_history_json_filters_by_type_and_limits_the_window(client: TestClient) -> None:
    everything = client.get(f"/jobs/{JOB}/history").json()
    assert len(everything["events"]) == 15
    assert everything["events"][0]["type"] == "job_submitted"
    assert everything["events"][-1]["type"] == "job_finished"
    assert all(e["key"].startswith(f"{JOB}/history/") for e in everything["events"])

    restarts = client.get(f"/jobs/{JOB}/history",
                          params={"type": ["failure", "restart"]}).json()
    assert [e["type"] for e in restarts["events"]] == ["failure", "restart"]
    assert restarts["events"][0]["cause"] == EVIL_CAUSE

    newest = client.get(f"/jobs/{JOB}/history", params={"limit": 3}).json()
    assert [e["type"] for e in newest["events"]] == [
        "checkpoint_completed", "savepoint_completed", "job_finished"]
    assert newest["history_window"] == {"events_read": 3, "events_total": 15,
                                        "truncated": True}
    assert client.get(f"/jobs/{JOB}/history", params={"limit": 0}).status_code == 422


def test_a_short_window_still_shows_every_retained_checkpoint(client: TestClient) -> None:
    body = client.get(f"/jobs/{JOB}/checkpoints", params={"limit": 2}).json()
    assert body["history_window"]["truncated"] is True
    assert sorted(e["id"] for e in body["history"]) == [5, 6, 7]  # from _metadata


def test_jobs_json(client: TestClient, storage: CheckpointStorage) -> None:
    JobHistory(storage, "idle-job").append("job_started", run_id="r9")
    storage.put_bytes("_output/odd-even/part-0", b"{}")  # a sink's output is not a job
    body = client.get("/jobs").json()
    assert body["storage"] == storage.uri
    jobs = {j["id"]: j for j in body["jobs"]}
    assert set(jobs) == {JOB, "idle-job"}
    assert jobs[JOB]["latest_completed"]["id"] == 6
    assert (jobs[JOB]["num_retained"], jobs[JOB]["num_savepoints"]) == (2, 1)
    assert jobs["idle-job"]["latest_completed"] is None


@pytest.mark.parametrize("path", ["/jobs/nope/checkpoints", "/jobs/nope/history",
                                  "/jobs/-bad-/checkpoints", "/jobs/_output/history"])
def test_unknown_job_is_404_json(client: TestClient, path: str) -> None:
    response = client.get(path)
    assert response.status_code == 404
    assert response.headers["content-type"].startswith("application/json")
    assert "job" in response.json()["detail"]


def test_unreadable_event_and_manifest_are_reported_not_skipped(
    client: TestClient, storage: CheckpointStorage
) -> None:
    layout = JobLayout(JOB)
    garbage = JobHistory(storage, JOB, compaction=None).listing().head + 1
    storage.put_bytes(layout.history_event(garbage), b"{not json")
    storage.put_bytes(layout.checkpoint_metadata(8), b'{"schema_version": 1}')
    body = client.get(f"/jobs/{JOB}/checkpoints").json()
    assert any(f"{garbage:016d}" in e and "unreadable" in e for e in body["errors"])
    assert any("chk-8/_metadata" in e for e in body["errors"])
    assert body["counts"]["completed"] == 6  # the rest is still shown
    tables, texts = parse_page(client.get(f"/view/{JOB}").text)
    assert "chk-8/_metadata" in texts["problems"]
    assert len(tables["checkpoints"]) == 7


def test_storage_failure_is_502(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    def down(*_: object, **__: object) -> list[dict[str, object]]:
        raise EndpointUnreachableError("cannot reach http://127.0.0.1:1")

    monkeypatch.setattr(overview, "jobs_overview", down)
    response = client.get("/jobs")
    assert response.status_code == 502
    assert "cannot reach" in response.json()["detail"]
    page = client.get("/")
    assert page.status_code == 502
    assert "cannot reach" in parse_page(page.text)[1]["error"]


# ------------------------------------------------------------------------------ HTML


def test_job_page_shows_the_checkpoints_table(client: TestClient, story: Story) -> None:
    response = client.get(f"/view/{JOB}")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    tables, texts = parse_page(response.text)
    rows = {r.attrs["data-id"]: r.cells for r in tables["checkpoints"]}
    assert list(rows) == ["7", "6", "5", "4", "3", "2", "1"]
    assert rows["6"] == rows["6"] | {
        "id": "6", "status": "COMPLETED retained", "kind": "checkpoint", "trigger": "periodic",
        "batch": "18", "state": "9.0 KiB", "uploaded": "3.0 KiB", "e2e": "1256 ms",
        "acked": "5/5",
    }
    assert rows["7"]["id"] == "7 before-upgrade"
    assert rows["7"]["kind"] == "savepoint"
    assert rows["1"]["status"] == "COMPLETED discarded"
    assert rows["1"]["trigger"] == "initial"
    assert rows["1"]["uploaded"] == "512 B"
    assert rows["4"]["status"] == "FAILED"
    assert rows["4"]["detail"] == EVIL_MESSAGE  # shown as text, exactly
    assert texts["job-status"] == "FINISHED"
    assert texts["count-completed"] == "6"
    assert (texts["retained"], texts["count-retained"]) == ("chk-5, chk-6", "2")
    assert (texts["count-driver-starts"], texts["count-restored"]) == ("2", "1")

    events = [r.cells for r in tables["events"]]
    assert [e["event"] for e in events] == [
        "job finished", "restored", "job started", "job submitted", "restart", "failure",
        "job started", "job submitted"]
    assert events[4]["summary"].startswith("fixed-delay: restart")
    assert EVIL_CAUSE in events[5]["summary"]
    assert "java.lang.OutOfMemoryError: <heap>" in events[5]["summary"]


def test_pages_escape_user_data(client: TestClient) -> None:
    html = client.get(f"/view/{JOB}").text
    assert "<script" not in html
    assert "<img" not in html
    assert "<b>killed" not in html
    assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt; &amp; &lt;img" in html
    assert "&lt;b&gt;killed&lt;/b&gt;" in html
    assert "&lt;heap&gt;" in html


def test_pages_send_a_restrictive_content_security_policy(client: TestClient) -> None:
    headers = client.get(f"/view/{JOB}").headers
    assert "default-src 'none'" in headers["content-security-policy"]
    assert "script-src" not in headers["content-security-policy"]
    assert headers["x-content-type-options"] == "nosniff"
    css = client.get("/static/history.css")
    assert css.status_code == 200
    assert css.headers["content-type"].startswith("text/css")


def test_index_page_links_every_job(client: TestClient) -> None:
    tables, _ = parse_page(client.get("/").text)
    (row,) = tables["jobs"]
    assert row.cells | {"job": JOB, "id": "6", "batch": "18", "state": "9.0 KiB",
                        "retained": "2", "savepoints": "1"} == row.cells
    html = client.get("/").text
    assert f'href="view/{JOB}"' in html
    assert 'href="static/history.css"' in html


def test_unknown_job_page_is_404_html(client: TestClient) -> None:
    response = client.get("/view/nope")
    assert response.status_code == 404
    assert response.headers["content-type"].startswith("text/html")
    assert "nope" in parse_page(response.text)[1]["error"]
    assert 'href="../static/history.css"' in response.text


def test_empty_storage(tmp_path: Path) -> None:
    app = create_app(PluginSettings(f"file://{tmp_path}"), authenticate=False)
    with TestClient(app) as c:
        assert c.get("/jobs").json()["jobs"] == []
        assert "no-jobs" in parse_page(c.get("/").text)[1]


def test_unconfigured_storage_is_503_with_instructions(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIRFLOW_CKPT_STORAGE", raising=False)
    monkeypatch.delenv("AIRFLOW__AIRFLOW_CKPT__STORAGE_URI", raising=False)
    with TestClient(create_app(authenticate=False)) as c:
        response = c.get("/jobs")
        assert response.status_code == 503
        assert "[airflow_ckpt] storage_uri" in response.json()["detail"]
        page = c.get("/")
        assert page.status_code == 503
        assert "AIRFLOW_CKPT_STORAGE" in parse_page(page.text)[1]["error"]


def test_settings_come_from_airflow_config_then_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("AIRFLOW__AIRFLOW_CKPT__STORAGE_URI", raising=False)
    monkeypatch.setenv("AIRFLOW_CKPT_STORAGE", "file:///from/env")
    assert load_settings() == PluginSettings("file:///from/env", "aws_default", 1000)
    monkeypatch.setenv("AIRFLOW__AIRFLOW_CKPT__STORAGE_URI", "s3://from-config/x")
    monkeypatch.setenv("AIRFLOW__AIRFLOW_CKPT__STORAGE_CONN_ID", "minio")
    monkeypatch.setenv("AIRFLOW__AIRFLOW_CKPT__HISTORY_LIMIT", "50")
    assert load_settings() == PluginSettings("s3://from-config/x", "minio", 50)

    # read per request: the app follows the configuration without a restart
    storage = open_storage(f"file://{tmp_path}")
    JobHistory(storage, "from-config").append("job_started", run_id="r1")
    monkeypatch.setenv("AIRFLOW__AIRFLOW_CKPT__STORAGE_URI", storage.uri)
    with TestClient(create_app(authenticate=False)) as c:
        assert [j["id"] for j in c.get("/jobs").json()["jobs"]] == ["from-config"]


# ----------------------------------------------------------------- task -> job redirect


def test_task_link_finds_the_job_from_job_submitted_events(client: TestClient) -> None:
    params = {"dag_id": DAG_ID, "run_id": RUN_ID, "task_id": TASK_ID}
    response = client.get("/task", params=params, follow_redirects=False)
    assert response.status_code == 303
    assert response.headers["location"] == f"view/{JOB}"
    # an unknown job hint falls back to the search
    response = client.get("/task", params={**params, "job": "renamed"}, follow_redirects=False)
    assert response.headers["location"] == f"view/{JOB}"
    assert client.get("/task", params=params).url.path.endswith(f"/view/{JOB}")


def test_task_link_with_a_job_hint_needs_no_search(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_search(*_: object) -> None:
        raise AssertionError("searched although the job was given")

    monkeypatch.setattr(overview, "find_job_for_task", no_search)
    response = client.get("/task", params={"dag_id": "d", "run_id": "r", "task_id": "t",
                                           "job": JOB}, follow_redirects=False)
    assert response.headers["location"] == f"view/{JOB}"


def test_task_that_submitted_nothing_is_404(client: TestClient) -> None:
    response = client.get("/task", params={"dag_id": DAG_ID, "run_id": "other",
                                           "task_id": TASK_ID})
    assert response.status_code == 404
    assert "has not submitted" in parse_page(response.text)[1]["error"]


# ----------------------------------------------------------------------- auth + plugin


def test_every_route_requires_an_authenticated_user(storage: CheckpointStorage) -> None:
    app = create_app(PluginSettings(storage.uri))  # authenticate=True, as mounted by Airflow
    with TestClient(app) as c:
        for path in ("/", f"/view/{JOB}", "/jobs", f"/jobs/{JOB}/checkpoints",
                     f"/jobs/{JOB}/history", "/task?dag_id=a&run_id=b&task_id=c"):
            assert c.get(path).status_code == 401, path


def test_plugin_is_registered_and_describes_its_ui() -> None:
    (entry,) = [e for e in importlib.metadata.entry_points(group="airflow.plugins")
                if e.name == "airflow_ckpt"]
    assert entry.load() is AirflowCkptPlugin
    plugin = AirflowCkptPlugin()
    (fastapi_app,) = plugin.fastapi_apps
    assert fastapi_app["url_prefix"] == URL_PREFIX == "/airflow-ckpt"
    assert type(fastapi_app["app"]).__name__ == "FastAPI"
    assert plugin.fastapi_apps is plugin.fastapi_apps  # built once
    (view,) = plugin.external_views
    assert view["href"] == "airflow-ckpt/"  # relative to the UI's <base href>
    assert view["destination"] == "nav"
    (link,) = plugin.operator_extra_links
    assert [op.__name__ for op in link.operators] == ["CheckpointedSparkSubmitOperator"]


def test_importing_the_plugin_is_cheap() -> None:
    code = (
        "import sys, airflow_ckpt.plugins.history\n"
        "heavy = ['fastapi', 'airflow_ckpt.plugins.app', 'airflow_ckpt.hooks.checkpoint_store',\n"
        "         'airflow_ckpt.operators.checkpointed_spark_submit', 'boto3']\n"
        "print([m for m in heavy if m in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stderr[-2000:]


class _Key:
    dag_id, task_id, map_index, try_number = "d", "t", -1, 1
    run_id = "manual__2026-01-01T00:00:00+00:00"


class _Op:
    def __init__(self, job_name: str) -> None:
        self.job_name = job_name


def test_extra_link(monkeypatch: pytest.MonkeyPatch) -> None:
    link = CheckpointHistoryLink()
    monkeypatch.delenv("AIRFLOW__API__BASE_URL", raising=False)
    url = link.get_link(_Op("my-job"), ti_key=_Key())  # type: ignore[arg-type]
    assert url == ("/airflow-ckpt/task?dag_id=d&run_id=manual__2026-01-01T00%3A00%3A00"
                   "%2B00%3A00&task_id=t&job=my-job")
    templated = link.get_link(_Op("{{ params.job }}"), ti_key=_Key())  # type: ignore[arg-type]
    assert "job=" not in templated
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "https://airflow.example.com/base")
    assert link.get_link(_Op("j"), ti_key=_Key()).startswith(  # type: ignore[arg-type]
        "https://airflow.example.com/base/airflow-ckpt/task?")


# ---------------------------------------------------- counts of real events (issue 18)


def test_an_orphaned_drivers_in_process_restores_are_labelled_as_such(
    storage: CheckpointStorage,
) -> None:
    """One driver start, then 13 in-process restarts, each restoring: the page says so
    (not "Restored 14"), and the one retained checkpoint is named as an id, apart from
    the counts (not "Retained 411" among them)."""
    from airflow_ckpt.runtime.history import events as ev
    from tests.fixtures.snapshots import write_snapshot

    job = "orphan"
    write_snapshot(storage, job, 411)
    history = JobHistory(storage, job)
    history.append(ev.JOB_SUBMITTED, run_id="r1", attempt=1, restore="latest")
    history.append(ev.JOB_STARTED, run_id="r1", attempt=1, restore="latest")
    history.append(ev.RESTORED, kind="checkpoint", checkpoint_id=400, batch_id=1, path="p")
    for attempt in range(1, 14):
        history.append(ev.FAILURE, level="query", run_id="r1", cause="boom", attempt=attempt)
        history.append(ev.RESTART, level="query", run_id="r1", strategy="fixed-delay",
                       restart=True, delay_s=1.0, attempt=attempt, cause="boom")
        history.append(ev.RESTORED, kind="checkpoint", checkpoint_id=400 + attempt,
                       batch_id=1, path="p")
    history.append(ev.FAILURE, level="query", run_id="r1", cause="boom", attempt=14)
    history.append(ev.RESTART, level="query", run_id="r1", strategy="fixed-delay",
                   restart=False, delay_s=0.0, attempt=14, cause="boom")
    app = create_app(PluginSettings(storage.uri), authenticate=False)
    with TestClient(app) as client:
        counts = client.get(f"/jobs/{job}/checkpoints").json()["counts"]
        _, texts = parse_page(client.get(f"/view/{job}").text)
    assert (counts["restored"], counts["driver_starts"], counts["in_process_restarts"],
            counts["retained"]) == (14, 1, 13, 1)
    assert (texts["count-driver-starts"], texts["count-in-process-restarts"],
            texts["count-restored"], texts["count-retained"]) == ("1", "13", "14", "1")
    assert texts["retained"] == "chk-411"
