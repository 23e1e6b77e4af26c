"""The airflow-ckpt CLI on a file:// storage: arguments, listings, describe, dispose."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest

from airflow_ckpt.cli import STORAGE_ENV, main
from airflow_ckpt.formatting import human_bytes
from airflow_ckpt.runtime.checkpoint.catalog import CheckpointCatalog
from airflow_ckpt.runtime.history.events import CHECKPOINT_COMPLETED, JOB_STARTED, RESTART
from airflow_ckpt.runtime.history.journal import JobHistory
from airflow_ckpt.runtime.storage.base import CheckpointStorage
from airflow_ckpt.testing import S3Endpoint
from tests.fixtures.snapshots import write_snapshot

JOB = "orders"


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    code = main(list(argv), out=out)
    return code, out.getvalue()


@pytest.fixture
def store(file_storage: CheckpointStorage) -> CheckpointStorage:
    for n in (1, 2, 3):
        write_snapshot(file_storage, JOB, n, contents={f"offsets/{n}": b"o" * n,
                                                       "state/0/0/1.delta": b"s" * 2048})
    write_snapshot(file_storage, JOB, 3, savepoint_id="pre-upgrade")
    history = JobHistory(file_storage, JOB)
    history.append(JOB_STARTED, query="orders-q")
    history.append(CHECKPOINT_COMPLETED, id=3)
    return file_storage


# ------------------------------------------------------------------ argument errors


@pytest.mark.parametrize("argv", [
    [],                                   # no command
    ["--storage", "file:///x", "bogus"],  # unknown command
    ["--storage", "file:///x", "checkpoints"],  # missing job
    ["--storage", "file:///x", "history", "j", "--limit", "x"],
    ["--storage", "file:///x", "history", "j", "--limit", "-1"],
    ["jobs"],                             # no storage at all
])
def test_argument_errors_exit_2(argv: list[str], monkeypatch: pytest.MonkeyPatch,
                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv(STORAGE_ENV, raising=False)
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert "usage: airflow-ckpt" in capsys.readouterr().err


def test_bad_storage_uri_is_an_error_not_a_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    code, _ = run("--storage", "s3://Bad_Bucket", "jobs")
    assert code == 1
    assert "invalid storage URI" in capsys.readouterr().err


def test_storage_from_environment(store: CheckpointStorage,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(STORAGE_ENV, store.uri)
    code, out = run("jobs")
    assert code == 0 and "orders" in out and "job_started" in out


# ------------------------------------------------------------------ listings


def test_jobs_json(store: CheckpointStorage) -> None:
    code, out = run("--storage", store.uri, "jobs", "--json")
    assert code == 0
    [job] = json.loads(out)
    assert job["job"] == JOB and job["latest_checkpoint"] == 3
    assert (job["checkpoints"], job["savepoints"], job["status"]) == (3, 1, "job_started")


def test_checkpoints_table(store: CheckpointStorage) -> None:
    code, out = run("--storage", store.uri, "checkpoints", JOB)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split()[:4] == ["id", "kind", "trigger", "batch"]
    assert [ln.split()[0] for ln in lines[2:]] == ["1", "2", "3"]
    assert "2.0 KiB" in lines[2] and "1500 ms" in lines[2]


def test_checkpoints_json_has_the_flink_stats(store: CheckpointStorage) -> None:
    code, out = run("--storage", store.uri, "checkpoints", JOB, "--json")
    stats = json.loads(out)
    assert code == 0 and [s["id"] for s in stats] == [1, 2, 3]
    assert {"status", "is_savepoint", "trigger_timestamp", "latest_ack_timestamp",
            "state_size", "checkpointed_size", "end_to_end_duration", "num_subtasks",
            "num_acknowledged_subtasks", "failure_message"} <= set(stats[0])
    assert stats[0]["state_size"] == 2049


def test_savepoints_and_empty_listings(store: CheckpointStorage) -> None:
    code, out = run("--storage", store.uri, "savepoints", JOB)
    assert code == 0 and "pre-upgrade" in out and "savepoint" in out
    code, out = run("--storage", store.uri, "savepoints", "nobody")
    assert code == 0 and "has no completed savepoints" in out
    assert f"nothing is stored for job 'nobody' in {store.uri})" in out  # no close name


def test_a_misspelled_job_gets_did_you_mean(store: CheckpointStorage) -> None:
    for command in ("checkpoints", "savepoints", "history"):
        code, out = run("--storage", store.uri, command, "order")
        assert code == 0 and out.endswith(
            f"(nothing is stored for job 'order' in {store.uri}; did you mean 'orders'?)\n"), out


def test_describe_forms(store: CheckpointStorage) -> None:
    code, out = run("--storage", store.uri, "describe", f"{store.uri}/orders/chk-2")
    assert code == 0
    assert "checkpoint (periodic)" in out and "batch id             4" in out
    code, out = run("--storage", store.uri, "describe", "--job", JOB, "sp-pre-upgrade",
                    "--json")
    doc = json.loads(out)
    assert doc["uri"].endswith("/orders/savepoints/sp-pre-upgrade")
    assert doc["manifest"]["kind"] == "savepoint" and doc["stats"]["is_savepoint"] is True


def test_describe_needs_a_job_for_short_paths(store: CheckpointStorage,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    code, _ = run("--storage", store.uri, "describe", "chk-2")
    assert code == 1
    assert "does not say which job" in capsys.readouterr().err


def test_describe_missing_checkpoint(store: CheckpointStorage,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    code, _ = run("--storage", store.uri, "describe", "orders/chk-99")
    assert code == 1 and "does not exist" in capsys.readouterr().err


def test_history(store: CheckpointStorage) -> None:
    code, out = run("--storage", store.uri, "history", JOB, "--type", CHECKPOINT_COMPLETED)
    assert code == 0 and "checkpoint_completed" in out and "job_started" not in out
    code, out = run("--storage", store.uri, "history", JOB, "--limit", "1", "--json")
    assert [e["type"] for e in json.loads(out)] == [CHECKPOINT_COMPLETED]


# ------------------------------------------------------------------ dispose


def test_dispose_refuses_checkpoints(store: CheckpointStorage,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    code, _ = run("--storage", store.uri, "dispose", "orders/chk-3", "--yes")
    assert code == 1
    assert "is a checkpoint, not a savepoint" in capsys.readouterr().err
    assert CheckpointCatalog(store, JOB).checkpoint_ids() == [1, 2, 3]


def test_dispose_needs_yes_without_a_terminal(store: CheckpointStorage,
                                              capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    code, _ = run("--storage", store.uri, "dispose", "orders/savepoints/sp-pre-upgrade")
    assert code == 1 and "without --yes" in capsys.readouterr().err
    assert CheckpointCatalog(store, JOB).savepoint_ids() == ["pre-upgrade"]


def test_dispose_prompt(store: CheckpointStorage, monkeypatch: pytest.MonkeyPatch) -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stdin", Tty("n\n"))
    code, out = run("--storage", store.uri, "dispose", "orders/sp-pre-upgrade")
    assert code == 1 and "not deleted" in out
    monkeypatch.setattr(sys, "stdin", Tty("y\n"))
    code, out = run("--storage", store.uri, "dispose", "orders/sp-pre-upgrade")
    assert code == 0 and out.startswith("disposed ")
    assert CheckpointCatalog(store, JOB).savepoint_ids() == []


def test_dispose_with_yes(store: CheckpointStorage) -> None:
    code, out = run("--storage", store.uri, "dispose", "--job", JOB, "pre-upgrade", "-y")
    assert code == 0 and "sp-pre-upgrade: 2 objects" in out
    assert CheckpointCatalog(store, JOB).savepoint_ids() == []


def test_state_refuses_checkpoints(store: CheckpointStorage,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    # refused before pyspark is imported
    code, _ = run("--storage", store.uri, "state", "orders/chk-3")
    assert code == 1 and "is a checkpoint" in capsys.readouterr().err


def test_console_script_runs(store: CheckpointStorage) -> None:
    proc = subprocess.run([sys.executable, "-m", "airflow_ckpt.cli", "--storage", store.uri,
                           "checkpoints", JOB], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "periodic" in proc.stdout
    assert "airflow" not in proc.stderr.lower()


def test_cli_does_not_import_airflow_or_pyspark() -> None:
    code = ("import sys, airflow_ckpt.cli; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('airflow','pyspark')))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert proc.stdout.strip() == "[]", proc.stdout + proc.stderr


def test_human_bytes() -> None:
    assert [human_bytes(n) for n in (0, 1023, 1536, 5 * 1024**3)] == [
        "0 B", "1023 B", "1.5 KiB", "5.0 GiB"]


def test_root_cause_picks_the_informative_line() -> None:
    from airflow_ckpt.driver_output import root_cause

    wrapped = RuntimeError("An error occurred while calling o43.collectToPython.\n"
                           ": org.apache.spark.SparkException: [CANNOT_LOAD_STATE_STORE] "
                           "An error occurred during loading state.\n\tat org.apache.x(Y.scala:1)")
    assert root_cause(wrapped).startswith("org.apache.spark.SparkException: [CANNOT_LOAD")
    worker = RuntimeError("org.apache.spark.SparkException: Job aborted: PythonException:\n"
                          "Traceback (most recent call last):\n  File \"x.py\", line 1\n"
                          "ZeroDivisionError: division by zero\n\tat org.apache.x(Y.scala:1)")
    assert root_cause(worker) == "ZeroDivisionError: division by zero"
    assert root_cause(ValueError("[STATE_STORE_X] bad")) == "[STATE_STORE_X] bad"
    assert root_cause(ValueError("plain")) == "ValueError: plain"
    assert root_cause(ValueError("x" * 900), 300) == "ValueError: " + "x" * 288


# ------------------------------------------------------------------ conventions (issue 11)


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from airflow_ckpt import __version__

    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"airflow-ckpt {__version__}"


def test_missing_file_root_is_a_clear_error(tmp_path: object,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    missing = f"{tmp_path}/nowhere"
    code, out = run("--storage", f"file://{missing}", "jobs")
    assert code == 1 and out == ""
    assert f"storage root file://{missing} does not exist" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [("-o", "json"), ("--output", "json"), ("--json",)])
def test_output_json_spellings(store: CheckpointStorage, argv: tuple[str, ...]) -> None:
    code, out = run("--storage", store.uri, "checkpoints", JOB, *argv)
    assert code == 0 and [s["id"] for s in json.loads(out)] == [1, 2, 3]


def test_output_yaml(store: CheckpointStorage) -> None:
    import yaml

    code, out = run("--storage", store.uri, "history", JOB, "-o", "yaml")
    assert code == 0
    assert [e["type"] for e in yaml.safe_load(out)] == [JOB_STARTED, CHECKPOINT_COMPLETED]
    code, out = run("--storage", store.uri, "jobs", "-o", "table")
    assert code == 0 and out.splitlines()[0].startswith("job")


def test_bad_output_format_exits_2(store: CheckpointStorage) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--storage", store.uri, "jobs", "-o", "xml"])
    assert exc.value.code == 2


@pytest.mark.moto_only("creates an IAM user and switches on moto's IAM checks")
def test_conn_id_takes_the_connections_credentials(
    s3_endpoint: S3Endpoint, s3_bucket: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Without credentials in the environment, access fails with a hint naming --conn-id;
    with --conn-id the Airflow connection's credentials and endpoint are used."""
    key_id, secret = s3_endpoint.create_iam_user(f"cli-{s3_bucket[-8:]}")
    with s3_endpoint.iam_auth():
        for name in ("AWS_SESSION_TOKEN", "AWS_PROFILE"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAWRONGWRONGWRONG1")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret-wrong-secret")
        monkeypatch.setenv("AIRFLOW_CONN_CKPT_CLI", json.dumps({
            "conn_type": "aws", "login": key_id, "password": secret,
            "extra": {"endpoint_url": s3_endpoint.url, "region_name": s3_endpoint.region_name}}))
        uri = f"s3://{s3_bucket}/cli"
        code, _ = run("--storage", uri, "--endpoint-url", s3_endpoint.url, "jobs")
        assert code == 1
        err = capsys.readouterr().err
        assert "--conn-id" in err
        code, out = run("--storage", uri, "--conn-id", "ckpt_cli", "jobs", "-o", "json")
        assert code == 0, capsys.readouterr().err
        assert json.loads(out) == []


def test_history_table_never_cuts_a_restart_decision(file_storage: CheckpointStorage) -> None:
    """A restart event's decision (restart, delay, attempt) and its whole cause are in the
    table however long the payload (options, strategy state, run id) is."""
    cause = "StreamingQueryException: " + "x" * 300 + " END-OF-CAUSE"
    JobHistory(file_storage, JOB).append(
        RESTART, level="driver", run_id="manual__2026-01-01T10:00:00.000000+00:00",
        strategy="exponential-delay",
        options={f"exponential-delay.option-{i}": "1 min" for i in range(8)},
        restart=True, delay_s=120.0, attempt=7, strategy_state={"backoff_ms": 120000,
                                                               "history": list(range(40))},
        cause=cause, failure_ts=1.0,
    )
    code, out = run("--storage", file_storage.uri, "history", JOB)
    assert code == 0
    lines = out.splitlines()
    row = next(i for i, line in enumerate(lines) if " restart " in line)
    first = lines[row]
    assert "restart=true" in first and "delay_s=120.0" in first and "attempt=7" in first
    text = "".join(line.strip() for line in lines[row:])
    assert "END-OF-CAUSE" in text and '"history": [0, 1, 2' in " ".join(lines[row:])
    assert max(len(line) for line in lines) <= 140
