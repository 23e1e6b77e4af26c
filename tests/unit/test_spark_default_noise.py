"""Issue 18 item 5: with ``master`` given, no "Could not load connection string
spark_default, defaulting to yarn" per submission; without it the line stays (it is true)."""

from __future__ import annotations

from structlog.testing import capture_logs

from airflow_ckpt.operators import CheckpointedSparkSubmitOperator

MISSING = "Could not load connection string"


def _events(master: str | None) -> tuple[list[str], str]:
    op = CheckpointedSparkSubmitOperator(
        task_id="t", application="job.py", job_name="j", checkpoint_storage="file:///tmp/x",
        master=master)
    with capture_logs() as logs:
        hook = op._get_hook()
        hook.log.info("a line of the hook after it was built")
    return [str(entry.get("event")) for entry in logs], hook.master


def test_a_given_master_makes_the_missing_connection_line_go() -> None:
    events, master = _events("local[2]")
    assert master == "local[2]"
    assert not [e for e in events if e.startswith(MISSING)], events
    assert "a line of the hook after it was built" in events  # the hook still logs


def test_without_a_master_the_line_stays_true() -> None:
    events, master = _events(None)
    assert master == "yarn"
    assert any(e.startswith(MISSING) and "yarn" in e for e in events), events
