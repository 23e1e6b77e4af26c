"""No secret value reaches the history, the logs written from it, or the UI's data.

The driver's error lines are the carrier: a failure cause quoting the session token
(``X-Amz-Security-Token=...`` of a presigned URL, an echoed ``AWS_SESSION_TOKEN=``) is
written to the history by the runtime (``RestartLog.record_failure``, ``job_failed``) and
by the operator; the plugin's pages and the CLI read it back from there.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_ckpt import cli
from airflow_ckpt.runtime import masking
from airflow_ckpt.runtime.history.journal import JobHistory
from airflow_ckpt.runtime.history.restart_log import RestartLog
from airflow_ckpt.runtime.masking import MASK, mask_secrets, mask_value, register_secrets
from airflow_ckpt.runtime.storage import open_storage

SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
TOKEN = "IQoJb3JpZ2luX2VjEXAMPLETOKEN+/=="
KEY_ID = "ASIAEXAMPLEKEYID0001"


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(masking, "_registered", set())
    for name in masking.SECRET_ENV_VARS:
        monkeypatch.delenv(name, raising=False)


def test_values_from_the_environment_are_masked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_SESSION_TOKEN", TOKEN)
    line = f"botocore failed: secret {SECRET} token {TOKEN}"
    assert mask_secrets(line) == f"botocore failed: secret {MASK} token {MASK}"


def test_registered_and_given_values_are_masked_short_ones_are_not() -> None:
    register_secrets([SECRET, "abc", None])
    assert mask_secrets(f"x {SECRET} abc") == f"x {MASK} abc"
    assert mask_secrets(f"y {TOKEN}", [TOKEN]) == f"y {MASK}"


@pytest.mark.parametrize("line", [
    f"GET https://b.s3.amazonaws.com/k?X-Amz-Security-Token={TOKEN}&X-Amz-Date=1",
    f"launcher: AWS_SESSION_TOKEN={TOKEN} spark-submit ...",
    f"{{'aws_session_token': '{TOKEN}'}}",
    f"aws_secret_access_key = {SECRET}",
])
def test_secret_assignments_are_masked_without_knowing_the_value(line: str) -> None:
    masked = mask_secrets(line)
    assert TOKEN not in masked and SECRET not in masked
    assert MASK in masked


def test_mask_value_walks_json() -> None:
    register_secrets([TOKEN])
    assert mask_value({"a": [f"t={TOKEN}", 3], "b": {"c": TOKEN}}) == {
        "a": [f"t={MASK}", 3], "b": {"c": MASK}}


def test_no_secret_reaches_history_cli_or_page_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A driver with credentials in its environment fails with an error line quoting
    them: the history (what the UI pages and their JSON render) and the CLI show none."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_SESSION_TOKEN", TOKEN)
    storage = open_storage((tmp_path / "store").as_uri())
    history = JobHistory(storage, "job-1")
    cause = (f"py4j.protocol.Py4JJavaError: An error occurred: ExpiredToken for "
             f"{KEY_ID} (token {TOKEN}); secret={SECRET}")
    log = RestartLog(history, {"type": "fixed-delay"}, run_id="r1")
    log.record_failure("driver", cause)
    history.append("job_failed", run_id="r1", cause=cause, details={"stderr": [cause]})

    raw = b"".join(storage.get_bytes(i.key) for i in storage.list("job-1/history/"))
    for secret in (KEY_ID, SECRET, TOKEN):
        assert secret.encode() not in raw
    assert b"ExpiredToken" in raw  # the line itself survives, only the values go

    events = history.events()
    assert {e.type for e in events} >= {"job_failed"}
    page_data = json.dumps([e.data for e in events])
    assert all(s not in page_data for s in (KEY_ID, SECRET, TOKEN))

    monkeypatch.delenv("AWS_SESSION_TOKEN")  # the CLI runs elsewhere, without them
    assert cli.main(["--storage", storage.uri, "history", "job-1"]) == 0
    out = capsys.readouterr().out
    assert TOKEN not in out and SECRET not in out and "ExpiredToken" in out
