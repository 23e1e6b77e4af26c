"""The Airflow-side readers and the admin CLI against a real S3 endpoint (moto, HTTP).

Manifests are written by the tests (no Spark); everything else is the real code path:
boto3 over HTTP, the CLI's option/environment handling, the trigger's thread polling.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import threading
import time
from pathlib import Path

import pytest

from airflow_ckpt.cli import main as cli_main
from airflow_ckpt.runtime.checkpoint.catalog import CheckpointCatalog
from airflow_ckpt.runtime.restore.materialize import materialize
from airflow_ckpt.runtime.storage.base import CheckpointStorage
from airflow_ckpt.testing import S3Endpoint
from airflow_ckpt.triggers.checkpoint import CheckpointTrigger
from airflow_ckpt.triggers.matching import CheckpointCondition, take_baseline
from tests.fixtures.snapshots import write_snapshot

pytestmark = pytest.mark.integration

JOB = "orders"


@pytest.fixture
def aws_env(s3_endpoint: S3Endpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    """Credentials and region from the environment, as an admin's shell would have."""
    for name, value in s3_endpoint.env().items():
        if name != "AWS_ENDPOINT_URL":  # the CLI gets --endpoint-url explicitly
            monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)


def cli(endpoint: S3Endpoint, uri: str, *argv: str) -> tuple[int, str]:
    out = io.StringIO()
    code = cli_main(["--storage", uri, "--endpoint-url", endpoint.url, *argv], out=out)
    return code, out.getvalue()


def test_cli_lists_describes_and_disposes_on_s3(
    s3_endpoint: S3Endpoint, s3_storage: CheckpointStorage, aws_env: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    uri = s3_storage.uri
    for n in (4, 5):
        write_snapshot(s3_storage, JOB, n, contents={"offsets/1": b"x" * 10,
                                                     "state/0/0/2.delta": os.urandom(3000)})
    write_snapshot(s3_storage, JOB, 5, savepoint_id="keep")
    write_snapshot(s3_storage, JOB, 5, savepoint_id="drop")

    code, out = cli(s3_endpoint, uri, "checkpoints", JOB, "--json")
    assert code == 0 and [s["id"] for s in json.loads(out)] == [4, 5]
    code, out = cli(s3_endpoint, uri, "describe", f"{uri}/{JOB}/chk-5")
    assert code == 0 and "2.9 KiB" in out
    code, _ = cli(s3_endpoint, uri, "dispose", f"{uri}/{JOB}/chk-5", "--yes")
    assert code == 1 and "not a savepoint" in capsys.readouterr().err
    code, out = cli(s3_endpoint, uri, "dispose", f"{uri}/{JOB}/savepoints/sp-drop", "--yes")
    assert code == 0 and "sp-drop: 2 objects" in out

    catalog = CheckpointCatalog(s3_storage, JOB)
    assert catalog.savepoint_ids() == ["keep"] and catalog.checkpoint_ids() == [4, 5]
    assert s3_storage.list(f"{JOB}/savepoints/sp-drop/") == []


def test_cli_reports_a_missing_bucket(s3_endpoint: S3Endpoint, aws_env: None,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    code, _ = cli(s3_endpoint, "s3://no-such-bucket-here/x", "checkpoints", JOB)
    assert code == 1
    assert "no-such-bucket-here" in capsys.readouterr().err


def test_materialize_a_multipart_file_from_s3(s3_storage: CheckpointStorage,
                                              tmp_path: Path) -> None:
    big = os.urandom(6 * 1024 * 1024 + 17)  # above the tests' 5 MiB multipart threshold
    manifest = write_snapshot(s3_storage, JOB, 8, savepoint_id="big",
                              contents={"state/0/3/9.snapshot": big, "commits/8": b"v1\n{}"})
    out = materialize(s3_storage, manifest, f"{JOB}/", tmp_path / "wd")
    assert (out / "state/0/3/9.snapshot").read_bytes() == big


def test_trigger_polls_s3_from_a_thread(s3_endpoint: S3Endpoint, s3_storage: CheckpointStorage,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in s3_endpoint.env().items():  # conn_id=None: the AWS environment
        monkeypatch.setenv(name, value)
    write_snapshot(s3_storage, JOB, 1)
    condition = take_baseline(CheckpointCatalog(s3_storage, JOB), CheckpointCondition(job=JOB))
    trigger = CheckpointTrigger(storage_uri=s3_storage.uri, condition=condition.to_dict(),
                                conn_id=None, poll_interval=0.1)
    written: list[float] = []

    def complete() -> None:
        time.sleep(0.5)
        written.append(time.time())
        write_snapshot(s3_storage, JOB, 2, savepoint_id="late")

    thread = threading.Thread(target=complete)
    thread.start()
    event = asyncio.run(asyncio.wait_for(anext(trigger.run()), 30))
    thread.join()
    assert event.payload["status"] == "matched"
    assert event.payload["summary"]["savepoint_id"] == "late"
    latency = event.payload["checked_ts"] - written[0]
    print(f"\nCheckpointTrigger on S3 (poll 0.1 s): detected {latency * 1000:.0f} ms after the "
          "write began")
    # checked_ts is taken when the poll that saw the marker began, which may be just
    # before the write began (the listing ran after the write completed)
    assert latency < 5
