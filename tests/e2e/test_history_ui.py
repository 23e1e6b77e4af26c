"""E2E: the checkpoint-history UI in the real Airflow api-server, seen by real Chromium.

The api-server (``airflow api-server``, SQLite, a temporary ``AIRFLOW_HOME`` from the
``airflow_env`` fixture) loads the plugin through its ``airflow.plugins`` entry point and
mounts its FastAPI app itself. Auth is the real ``SimpleAuthManager`` in its no-login
mode (``simple_auth_manager_all_admins``): its middleware puts a JWT on every request
and the plugin's dependency validates it like any other API route.

Checkpoints and history are written to a ``file://`` storage the way the runtime and
supervisor write them (``tests/fixtures/checkpoint_history.py``). Headless Debian
Chromium loads the pages (``--dump-dom`` after the page has loaded) and the rendered DOM
is checked: the checkpoint rows and their values, the restart/failure events, that
markup in failure messages stayed text, the nav entry in Airflow's own React UI, and the
operator extra link the api-server computes for a ``CheckpointedSparkSubmitOperator``
task instance (followed through its redirect to the job's page), and the trends of a
running job (health badges, Flink's checkpoint summary, SVG charts with restarts marked).
Screenshots are kept in ``tests/e2e/artifacts/`` (gitignored) for a human to look at.

Skipped, with the reason, when no Chromium is found (``make test`` installs it with
``apt-get`` when missing; ``$CHROMIUM`` points at another binary).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from airflow_ckpt.runtime.job import checkpointed_job as job_module
from airflow_ckpt.runtime.storage import CheckpointStorage, open_storage
from airflow_ckpt.testing import crashpoints as cp
from tests.fixtures.airflow_env import VENV_BIN, AirflowEnv
from tests.fixtures.checkpoint_history import (
    DAG_ID,
    EVIL_CAUSE,
    EVIL_MESSAGE,
    JOB,
    RUN_ID,
    TASK_ID,
    TREND_DAG,
    TREND_JOB,
    Story,
    parse_page,
    write_lease,
    write_story,
    write_trend_story,
)
from tests.fixtures.net import free_port, running_api_server
from tests.unit.test_stop_with_savepoint import live, request

#: a job the real runtime stopped with a savepoint (issue 18 item 3)
STOPPED_JOB = cp.JOB

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

ARTIFACTS = Path(__file__).resolve().parent / "artifacts"  # gitignored: screenshots
CHROMIUM_TIMEOUT_S = 90
CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
)
DAG_FILE = f'''
from airflow.sdk import DAG
from airflow_ckpt.operators.checkpointed_spark_submit import CheckpointedSparkSubmitOperator

with DAG("{DAG_ID}", schedule=None, params={{"job": "{JOB}"}}):
    CheckpointedSparkSubmitOperator(
        task_id="{TASK_ID}", application="job.py",
        job_name="{{{{ params.job }}}}",  # templated: the link has to find the job
        checkpoint_storage="file:///unused",
    )
'''


def find_chromium() -> str | None:
    candidates = [os.environ.get("CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium"),
                  shutil.which("chromium-browser"), shutil.which("google-chrome")]
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


@dataclass(frozen=True)
class Browser:
    binary: str
    profile: Path

    def run(self, url: str, *extra: str) -> subprocess.CompletedProcess[str]:
        cmd = [self.binary, *CHROMIUM_FLAGS, f"--user-data-dir={self.profile}", *extra, url]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=CHROMIUM_TIMEOUT_S,
                              check=False)
        assert proc.returncode == 0, f"chromium failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
        return proc

    def dom(self, url: str, *extra: str) -> str:
        """The DOM after the page loaded (and ran its scripts), serialised."""
        return self.run(url, "--dump-dom", *extra).stdout

    def screenshot(self, url: str, path: Path, size: str = "1400,1000") -> Path:
        self.run(url, f"--screenshot={path}", f"--window-size={size}", "--hide-scrollbars",
                 "--virtual-time-budget=15000")
        return path


@dataclass(frozen=True)
class ApiServer:
    url: str
    story: Story
    storage_uri: str
    log: Path

    def get_json(self, path: str, data: dict[str, Any] | None = None) -> Any:
        body = None if data is None else json.dumps(data).encode()
        request = urllib.request.Request(
            self.url + path, data=body, method="GET" if data is None else "POST",
            headers={"Content-Type": "application/json", "Accept": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            return json.load(response)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Browser:
    binary = find_chromium()
    if binary is None:
        pytest.skip("no Chromium found (/usr/bin/chromium, chromium on PATH or $CHROMIUM): "
                    "install it with `apt-get install -y chromium` (make test does this)")
    return Browser(binary, tmp_path_factory.mktemp("chromium-profile"))


@pytest.fixture(scope="module")
def api_server(
    airflow_env: AirflowEnv, browser: Browser, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ApiServer]:
    root = tmp_path_factory.mktemp("history_ui")
    storage = open_storage(f"file://{root / 'checkpoints'}")
    story = write_story(storage)
    # a running job, for the trends and badges; a 60 s interval: stale only after 3 min
    write_trend_story(storage, time.time(), interval_s=60.0)
    stop_with_savepoint(storage, root / "stopped-workdir")
    dags = root / "dags"
    dags.mkdir()
    (dags / "history_ui_dag.py").write_text(DAG_FILE)
    port = free_port()
    env = {
        **airflow_env.env,
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
        "AIRFLOW__AIRFLOW_CKPT__STORAGE_URI": storage.uri,
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
    }
    log = root / "api-server.log"
    try:
        with running_api_server(VENV_BIN / "airflow", env, port, log) as url:
            yield ApiServer(url, story, storage.uri, log)
    finally:
        storage.close()


def test_job_page_renders_the_checkpoint_history(api_server: ApiServer, browser: Browser) -> None:
    url = f"{api_server.url}/airflow-ckpt/view/{JOB}"
    dom = browser.dom(url)
    tables, texts = parse_page(dom)
    rows = {r.attrs["data-id"]: r.cells for r in tables["checkpoints"]}
    assert list(rows) == ["7", "6", "5", "4", "3", "2", "1"], dom[-3000:]
    manifests = api_server.story.manifests
    assert rows["6"] == {
        "id": "6", "status": "COMPLETED retained", "kind": "checkpoint", "trigger": "periodic",
        "batch": str(manifests[6].batch_id), "time": rows["6"]["time"],
        "state": "9.0 KiB", "uploaded": "3.0 KiB",
        "e2e": f"{manifests[6].timings.end_to_end_duration_ms} ms", "acked": "5/5",
        "detail": f"{api_server.storage_uri}/{JOB}/chk-6",
    }
    assert rows["7"]["id"] == "7 before-upgrade"
    assert rows["7"]["kind"] == "savepoint"
    assert rows["3"]["status"] == "COMPLETED discarded"
    assert rows["1"]["uploaded"] == "512 B"
    assert rows["4"]["status"] == "FAILED"
    assert rows["4"]["detail"] == EVIL_MESSAGE  # rendered as text ...
    assert "<script" not in dom and "<img" not in dom  # ... never as elements
    assert texts["job-status"] == "FINISHED"
    assert (texts["count-completed"], texts["count-failed"], texts["count-restored"]) == (
        "6", "1", "1")
    assert (texts["count-driver-starts"], texts["count-in-process-restarts"]) == ("2", "0")
    assert (texts["count-retained"], texts["retained"]) == ("2", "chk-5, chk-6")
    assert "checkpoint 3" in texts["latest-restored"]
    # the newest failure of any kind: the driver crash after checkpoint 4 failed
    assert texts["latest-failed-what"] == "driver crash"
    assert texts["latest-failed-message"] == EVIL_CAUSE

    events = [r.cells for r in tables["events"]]
    assert [e["event"] for e in events][:6] == [
        "job finished", "restored", "job started", "job submitted", "restart", "failure"]
    assert EVIL_CAUSE in events[5]["summary"]
    assert "<b>" not in dom

    ARTIFACTS.mkdir(exist_ok=True)  # kept: it shows the driver crash under "Latest failure"
    shot = browser.screenshot(url, ARTIFACTS / "history.png")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert shot.stat().st_size > 20_000, "the screenshot looks blank"
    print(f"screenshot: {shot}")


def _heartbeat(api_server: ApiServer) -> None:
    """The running job's driver is alive: its lease heartbeat is fresh."""
    storage = open_storage(api_server.storage_uri)
    write_lease(storage, TREND_JOB, heartbeat_ts=time.time())
    storage.close()


def stop_with_savepoint(storage: CheckpointStorage, workdir: Path) -> None:
    """A driver life of the real runtime (simulated query) that a stop-with-savepoint
    ends while a batch runs, with a periodic checkpoint and a manual savepoint waiting
    for that batch: what used to record a checkpoint failure."""

    def requested() -> None:
        request(storage, stop=False, savepoint_id="manual")
        request(storage, stop=True, savepoint_id="stop")

    poll = job_module.CONTROL_POLL_S
    job_module.CONTROL_POLL_S = 0.0  # look at the control requests at every step
    try:
        life = live(storage, workdir, cp.Script(batches=6), periodic=True, halt_at=3,
                    on_halt=requested)
    finally:
        job_module.CONTROL_POLL_S = poll
    assert life.outcome == "stopped"


def test_a_job_stopped_with_a_savepoint_shows_no_failure(
    api_server: ApiServer, browser: Browser
) -> None:
    """Issue 18 item 3: the page of a job stopped with a savepoint shows it stopped, its
    savepoints, and no failure; the screenshot is kept with the others."""
    url = f"{api_server.url}/airflow-ckpt/view/{STOPPED_JOB}"
    tables, texts = parse_page(browser.dom(url))
    assert texts["job-status"] == "STOPPED"
    assert texts["count-failed"] == "0"
    assert "none" in texts["latest-failed"]
    kinds = [r.cells["kind"] for r in tables["checkpoints"]]
    assert kinds.count("savepoint") == 2, kinds
    assert all(r.cells["status"].startswith("COMPLETED") for r in tables["checkpoints"])
    ARTIFACTS.mkdir(exist_ok=True)
    shot = browser.screenshot(url, ARTIFACTS / "history-stopped.png")
    assert shot.stat().st_size > 20_000, "the screenshot looks blank"
    print(f"screenshot: {shot}")


def test_jobs_index_and_json(api_server: ApiServer, browser: Browser) -> None:
    _heartbeat(api_server)
    tables, _ = parse_page(browser.dom(f"{api_server.url}/airflow-ckpt/"))
    rows = {r.cells["job"]: r.cells for r in tables["jobs"]}
    assert [job for job in rows if job != STOPPED_JOB] == [TREND_JOB, JOB]
    assert rows[STOPPED_JOB]["health"] == "stopped"
    row = rows[JOB]
    assert (row["id"], row["retained"], row["health"], row["dag"]) == ("6", "2", "finished",
                                                                     DAG_ID)
    assert rows[TREND_JOB]["health"] == "running"
    assert rows[TREND_JOB]["age"].endswith(" ago")
    assert rows[TREND_JOB]["dag"] == TREND_DAG

    stats = api_server.get_json(f"/airflow-ckpt/jobs/{JOB}/checkpoints")
    assert stats["counts"]["completed"] == 6
    assert stats["latest"]["completed"]["id"] == 6
    assert stats["latest"]["failed"]["failure_message"] == EVIL_MESSAGE


def test_airflow_ui_shows_the_nav_entry_as_an_iframe(
    api_server: ApiServer, browser: Browser
) -> None:
    plugins = api_server.get_json("/api/v2/plugins")["plugins"]
    (ours,) = [p for p in plugins if p["name"] == "airflow_ckpt"]
    assert ours["external_views"][0]["href"] == "airflow-ckpt/"
    # Airflow's React UI renders the external view as an iframe on /plugin/<url_route>
    dom = browser.dom(f"{api_server.url}/plugin/checkpoints", "--virtual-time-budget=20000")
    assert 'src="airflow-ckpt/"' in dom and 'title="Checkpoints"' in dom, dom[-3000:]


def test_operator_extra_link_leads_to_the_jobs_history(
    api_server: ApiServer, browser: Browser
) -> None:
    api_server.get_json(f"/api/v2/dags/{DAG_ID}/dagRuns",
                        {"dag_run_id": RUN_ID, "logical_date": None})
    links = api_server.get_json(
        f"/api/v2/dags/{DAG_ID}/dagRuns/{RUN_ID}/taskInstances/{TASK_ID}/links")
    link = links["extra_links"]["Checkpoint history"]
    assert link.startswith(f"{api_server.url}/airflow-ckpt/task?"), link
    _, texts = parse_page(browser.dom(link))  # the browser follows the redirect
    assert texts["job-name"] == JOB


def test_running_job_shows_trends_and_health(api_server: ApiServer, browser: Browser) -> None:
    url = f"{api_server.url}/airflow-ckpt/view/{TREND_JOB}"
    _heartbeat(api_server)
    dom = browser.dom(url)
    tables, texts = parse_page(dom)
    assert texts["job-health"] == "running"
    assert texts["last-completed-age"].endswith(" ago")
    summary = {r.attrs["data-field"]: r.cells for r in tables["summary"]}
    assert set(summary) == {"end_to_end_duration", "checkpointed_size", "state_size"}
    stats = api_server.get_json(f"/airflow-ckpt/jobs/{TREND_JOB}/checkpoints")["summary"]
    assert summary["end_to_end_duration"]["p99"] == f"{stats['end_to_end_duration']['p99']} ms"
    assert summary["state_size"]["max"].endswith("MiB")
    # inline SVG survived the browser's parsing under the page's CSP (no script, no style)
    assert dom.count("<svg") == 2 and dom.count("<polyline") == 3, dom[-3000:]
    assert dom.count('class="marker m-restart"') == 2
    assert "<b>x</b>" not in dom  # the failure cause stays text in every tooltip
    ARTIFACTS.mkdir(exist_ok=True)
    shot = browser.screenshot(url, ARTIFACTS / "history-trends.png", size="1400,1300")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert shot.stat().st_size > 40_000, "the screenshot looks blank"
    browser.screenshot(f"{api_server.url}/airflow-ckpt/", ARTIFACTS / "history-index.png",
                       size="1400,400")
    print(f"screenshots: {ARTIFACTS}")
