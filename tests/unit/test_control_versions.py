"""Control requests written by another version of airflow-ckpt (a rolling upgrade: the
Airflow side's provider newer or older than the driver's).

Before, one request with a field the driver did not know raised ``MetadataError`` in the
driver's control poll: every attempt failed at its first look, the restart strategy ran
out, and the request was never answered. Now the driver answers it "failed" with the
reason (create-only, once) and runs on; a request the driver can read is acted on.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_ckpt.runtime.control.channel import (
    REQUEST_FORMAT,
    ControlChannel,
    ControlRequest,
    ControlResult,
    UnreadableRequest,
    parse_request,
)
from airflow_ckpt.runtime.job import checkpointed_job as job_module
from airflow_ckpt.runtime.storage import open_storage
from airflow_ckpt.runtime.storage.base import CheckpointStorage
from airflow_ckpt.runtime.storage.layout import JobLayout
from airflow_ckpt.testing import crashpoints as cp
from tests.unit.test_stop_with_savepoint import live

JOB = cp.JOB


@pytest.fixture
def storage(tmp_path: Path) -> CheckpointStorage:
    return open_storage((tmp_path / "store").as_uri())


def _write(storage: CheckpointStorage, request_id: str, body: dict | bytes) -> None:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    storage.put_bytes(JobLayout(JOB).control_request(request_id), raw, create_only=True)


def _body(request_id: str, **extra: object) -> dict:
    return {"request_id": request_id, "type": "savepoint", "created_ts": 1.0,
            "expires_ts": 1e12, "stop": False, "savepoint_id": f"sp-{request_id}",
            "requested_by": "test", **extra}


def test_format_1_is_written_without_the_format_field(storage: CheckpointStorage) -> None:
    """A driver that predates the ``format`` field reads today's requests."""
    request = ControlChannel(storage, JOB).request_savepoint(savepoint_id="x")
    raw = storage.get_bytes(JobLayout(JOB).control_request(request.request_id))
    assert "format" not in json.loads(raw) and REQUEST_FORMAT == 1
    parsed = parse_request(raw, "k", request.request_id, 5.0)
    assert isinstance(parsed, ControlRequest) and parsed.savepoint_id == "x"


@pytest.mark.parametrize(("body", "named"), [
    (_body("r1", drain=True), "['drain']"),
    (_body("r1", format=2), "format 2"),
    (b"{not json", "not valid JSON"),
    ({"request_id": "r1", "type": "savepoint"}, "not a control request"),
    (_body("r1", type="checkpoint"), "invalid type"),
    (_body("r2"), "invalid request_id"),
])
def test_an_unreadable_request_says_why(body: dict | bytes, named: str) -> None:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    parsed = parse_request(raw, "job/control/r1.json", "r1", 5.0)
    assert isinstance(parsed, UnreadableRequest) and named in parsed.reason, parsed


def test_the_driver_answers_an_unknown_field_failed_once_and_acts_on_the_others(
    storage: CheckpointStorage, monkeypatch: pytest.MonkeyPatch,
) -> None:
    channel = ControlChannel(storage, JOB)
    _write(storage, "0001-newer", _body("0001-newer", drain=True))
    good = channel.request_savepoint(savepoint_id="good", timeout_s=3600)

    [pending] = channel.look(0.0)
    assert pending.request_id == good.request_id
    refused = channel.result("0001-newer")
    assert refused is not None and refused.status == "failed"
    assert refused.failure_message is not None and "['drain']" in refused.failure_message
    writes: list[str] = []
    monkeypatch.setattr(storage, "put_bytes", lambda key, *a, **k: writes.append(key))
    assert [r.request_id for r in channel.look(1.0)] == [good.request_id]
    assert writes == []  # answered once: not answered again at the next look


def test_a_result_with_a_field_from_a_newer_driver_is_read(storage: CheckpointStorage) -> None:
    key = JobLayout(JOB).control_result("r1")
    body = {"request_id": "r1", "status": "completed", "completed_ts": 2.0,
            "savepoint_path": "file:///sp", "duration_ms": 12}
    storage.put_bytes(key, json.dumps(body).encode(), create_only=True)
    result = ControlChannel(storage, JOB).result("r1")
    assert result == ControlResult("r1", "completed", 2.0, savepoint_path="file:///sp")


def test_a_driver_runs_on_past_a_request_it_cannot_read(
    storage: CheckpointStorage, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The whole driver life: the unreadable request is answered "failed", the readable
    savepoint request after it completes, and the job finishes (before: the first look
    raised MetadataError and the attempt failed)."""
    monkeypatch.setattr(job_module, "CONTROL_POLL_S", 0.0)
    _write(storage, "0001-newer", _body("0001-newer", drain=True))
    good = ControlChannel(storage, JOB).request_savepoint(savepoint_id="good", timeout_s=3600)

    life = live(storage, tmp_path / "w", cp.Script(batches=4), periodic=True)

    assert life.outcome == "finished"
    channel = ControlChannel(storage, JOB)
    refused, answered = channel.result("0001-newer"), channel.result(good.request_id)
    assert refused is not None and refused.status == "failed"
    assert answered is not None and answered.status == "completed", answered
