"""Stop-with-savepoint and the answers to savepoint requests, over a whole driver life.

The real ``CheckpointedJob`` (coordinator, store, lease, sinks, control channel) runs
over file:// storage against the crash-point module's simulated query, not threaded:
one order of events, so each case below happens every time.

* Issue 18 item 3: a stop-with-savepoint records no failure: a checkpoint (or a manual
  savepoint) whose barrier batch the stop interrupted takes its snapshot at the last
  committed batch instead of failing.
* Issue 20 item 8: the stop is answered "completed" only once the query has stopped and
  the final checkpoint, the savepoint and the commits are durable; a final checkpoint
  that fails once is retried and the job still stops; one that keeps failing answers
  "failed" and the job keeps running.
* Issue 20 item 9: a manual savepoint that completes during the final drain of a
  finishing query is answered.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from airflow_ckpt.errors import OutcomeUnknownError
from airflow_ckpt.runtime.checkpoint.catalog import CheckpointCatalog
from airflow_ckpt.runtime.checkpoint.snapshot import latest_batch
from airflow_ckpt.runtime.control.channel import ControlChannel, ControlRequest, ControlResult
from airflow_ckpt.runtime.history import events as ev
from airflow_ckpt.runtime.history.journal import JobHistory
from airflow_ckpt.runtime.job import CheckpointedJob
from airflow_ckpt.runtime.job import checkpointed_job as job_module
from airflow_ckpt.runtime.sinks import JsonLinesSink
from airflow_ckpt.runtime.storage import open_storage
from airflow_ckpt.runtime.storage.base import CheckpointStorage
from airflow_ckpt.runtime.storage.layout import JobLayout
from airflow_ckpt.testing import crashpoints as cp
from airflow_ckpt.testing.faults import (
    FailingPuts,
    checkpoint_marker,
    control_answer,
    savepoint_marker,
)
from airflow_ckpt.testing.simquery import write_file

JOB = cp.JOB
#: a periodic checkpoint is never due: only the initial and final checkpoints are taken
NO_PERIODIC = {**cp.CONFIG, "execution.checkpointing.interval": "1 h"}
#: the history events that the job page shows as failures
FAILURES = [ev.CHECKPOINT_FAILED, ev.SAVEPOINT_FAILED, ev.FAILURE, ev.RESTART, ev.JOB_FAILED]


class _HaltingQuery(cp._Query):
    """The simulated query, except that batch ``halt_at`` is still running (its offsets
    written, its commit not) for the driver's next two looks: in between, a periodic
    checkpoint is triggered with its barrier at the batch's end; ``on_halt`` runs
    before the second look."""

    halt_at: int | None = None
    on_halt: Callable[[], None] = staticmethod(lambda: None)
    _looks = 0

    def awaitTermination(self, timeout: float | None = None) -> bool:
        b = self._next()
        if self.isActive and b == self.halt_at and self._looks < 2:
            self._looks += 1
            if self._looks == 1:
                write_file(self.workdir / "offsets" / str(b), 'v1\n{}\n' + json.dumps({"b": b}))
            else:
                self.on_halt()
            return False
        return super().awaitTermination(timeout)


@dataclass
class Life:
    outcome: str
    job: CheckpointedJob
    log: list[str]  # the storage mutations that succeeded, in order

    def index(self, what: str) -> int:
        """Position of the last mutation containing ``what``."""
        found = [i for i, m in enumerate(self.log) if what in m]
        assert found, f"no mutation contains {what!r}"
        return found[-1]


def live(storage: CheckpointStorage, workdir: Path, script: cp.Script, *,
         periodic: bool, fault: Callable[[CheckpointStorage], CheckpointStorage]
         = lambda s: s, on_batch: Callable[[int], None] = lambda _b: None,
         halt_at: int | None = None, on_halt: Callable[[], None] = lambda: None) -> Life:
    """One driver life until it finishes or stops. ``periodic``: a periodic checkpoint
    is due at every step after a new batch; otherwise never (only the final one)."""
    logged = cp.CrashingStorage(storage)  # never crashes: records the mutations
    spark = cp.SimulatedSpark(script, on_batch)
    job = CheckpointedJob(
        spark,  # type: ignore[arg-type]
        job=JOB, storage=fault(logged), restart_strategy=cp.RESTART,
        checkpoint_config=cp.CONFIG if periodic else NO_PERIODIC,
        workdir=workdir, run_id="life", threaded=False,
    )
    job.lease.heartbeat_s = 3600.0  # no heartbeat thread writes during a life
    job.lease.ttl_s = 7200.0
    # periodic: every look at the clock is an hour later; otherwise time stands still
    job.clock = itertools.count(step=3600.0).__next__ if periodic else lambda: 0.0
    sink = JsonLinesSink(job.storage, cp.SINK_PREFIX)

    def build() -> Any:
        writer = spark.writer(job.exactly_once(sink))

        def start() -> _HaltingQuery:
            query = _HaltingQuery(Path(writer.location), writer.fn, script, on_batch)
            query.halt_at, query.on_halt = halt_at, on_halt
            return query

        writer.start = start  # type: ignore[method-assign]
        return writer

    result = job.run(build)
    return Life(result.outcome, job, logged.log)


@pytest.fixture(autouse=True)
def poll_every_step(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(job_module, "CONTROL_POLL_S", 0.0)


@pytest.fixture
def storage(tmp_path: Path) -> CheckpointStorage:
    return open_storage((tmp_path / "store").as_uri())


def request(storage: CheckpointStorage, *, stop: bool, savepoint_id: str) -> ControlRequest:
    return ControlChannel(storage, JOB).request_savepoint(
        stop=stop, savepoint_id=savepoint_id, timeout_s=3600)


def answer(storage: CheckpointStorage, req: ControlRequest) -> ControlResult:
    result = ControlChannel(storage, JOB).result(req.request_id)
    assert result is not None, f"request {req.request_id} was never answered"
    return result


def committed_numbers(storage: CheckpointStorage) -> list[int]:
    return sorted(r["n"] for r in JsonLinesSink(storage, cp.SINK_PREFIX).committed_rows())


def on_batch_once(at: int, action: Callable[[], None]) -> Callable[[int], None]:
    done: list[int] = []

    def hook(b: int) -> None:
        if b == at and not done:
            done.append(b)
            action()

    return hook


def test_a_stop_that_interrupts_a_batch_records_no_failure(
    storage: CheckpointStorage, tmp_path: Path
) -> None:
    """Issue 18 item 3. The stop arrives while batch 3 runs; a periodic checkpoint and a
    manual savepoint wait for batch 3's end, which never comes. Before, both
    failed ("the query ended before batch 3, its barrier, committed"): a
    ``checkpoint_failed`` the job page showed as the latest failure, and a
    ``savepoint_failed`` nobody answered. Now both are taken at batch 2, where the
    query stopped, and nothing in the history is a failure."""
    requests: list[ControlRequest] = []

    def requested() -> None:
        requests.append(request(storage, stop=False, savepoint_id="manual"))
        requests.append(request(storage, stop=True, savepoint_id="stop"))

    life = live(storage, tmp_path / "w", cp.Script(batches=6), periodic=True,
                halt_at=3, on_halt=requested)

    assert life.outcome == "stopped"
    history = life.job.history
    assert history.events(FAILURES) == []
    periodic = [e for e in history.events([ev.CHECKPOINT_COMPLETED])
                if e.data["trigger"] == "periodic"]
    assert periodic[-1].data["batch_id"] == 2  # the one triggered for batch 3
    manual, stop = (answer(storage, r) for r in requests)
    assert (manual.status, manual.batch_id) == ("completed", 2), manual
    assert (stop.status, stop.batch_id) == ("completed", 2), stop
    assert latest_batch(life.job.workdir, "commits") == 2  # batch 3 never committed
    assert max(JsonLinesSink(storage, cp.SINK_PREFIX).committed_batches()) == 2
    latest = CheckpointCatalog(storage, JOB).latest_checkpoint()
    assert latest is not None and latest.batch_id == 2


def test_a_final_checkpoint_that_fails_once_is_retried_and_the_job_stops(
    storage: CheckpointStorage, tmp_path: Path
) -> None:
    """Issue 20 item 8. The final checkpoint's ``_metadata`` put fails once. Before, the
    stop savepoint was taken and answered "completed" first, then the failed final
    checkpoint raised and the job restarted in-process and ran on past the savepoint
    (no ``job_stopped``). Now the final checkpoint comes first and is retried; the
    answer is written after every step of the stop is durable, and the job stops."""
    stop: list[ControlRequest] = []
    faults: list[FailingPuts] = []

    def fault(s: CheckpointStorage) -> CheckpointStorage:
        faults.append(FailingPuts(s, checkpoint_marker("final"), times=1))
        return faults[0]

    life = live(storage, tmp_path / "w", cp.Script(batches=6), periodic=False,
                fault=fault, on_batch=on_batch_once(3, lambda: stop.append(
                    request(storage, stop=True, savepoint_id="stop"))))

    assert len(faults[0].failed) == 1  # the fault did happen
    assert life.outcome == "stopped"
    result = answer(storage, stop[0])
    assert result.status == "completed", result
    stopped_at = latest_batch(life.job.workdir, "commits")
    assert result.batch_id == stopped_at == 3
    assert CheckpointCatalog(storage, JOB).savepoint("stop").batch_id == 3
    latest = CheckpointCatalog(storage, JOB).latest_checkpoint()
    assert latest is not None and latest.batch_id == 3
    assert committed_numbers(storage) == list(range(1, 4 * cp.PER_BATCH + 1))
    assert life.job.history.events([ev.RESTART]) == []
    stopped = life.job.history.last(ev.JOB_STOPPED)
    assert stopped is not None and stopped.data["savepoint"] == result.savepoint_path
    # the answer follows every step of the stop; nothing is committed after it
    answered = life.index(".result.json")
    assert answered > life.index("/chk-")  # the final checkpoint's marker
    assert answered > life.index("savepoints/sp-stop/_metadata")
    assert answered > life.index("part-")  # the stopped batch's output
    assert not [m for m in life.log[answered:] if "part-" in m or "/chk-" in m]


def test_a_final_checkpoint_that_keeps_failing_answers_failed_and_the_job_runs_on(
    storage: CheckpointStorage, tmp_path: Path
) -> None:
    """Issue 20 item 8, when the failure persists: the stop is answered "failed" saying
    that the job keeps running, no savepoint is reported for it, and the job runs on
    (here to the end of its input) with every number committed exactly once. Before,
    the request was answered "completed" and the job ran on anyway."""
    stop: list[ControlRequest] = []
    life = live(storage, tmp_path / "w", cp.Script(batches=6), periodic=False,
                fault=lambda s: FailingPuts(s, checkpoint_marker("final", batch_id=3),
                                            times=None),
                on_batch=on_batch_once(3, lambda: stop.append(
                    request(storage, stop=True, savepoint_id="stop"))))

    result = answer(storage, stop[0])
    assert result.status == "failed", result
    assert "keeps running" in (result.failure_message or ""), result
    assert result.savepoint_path is None
    assert life.outcome == "finished"
    assert CheckpointCatalog(storage, JOB).savepoints() == []
    assert life.job.history.last(ev.JOB_STOPPED) is None
    assert committed_numbers(storage) == list(range(1, 6 * cp.PER_BATCH + 1))


def stop_at_3(storage: CheckpointStorage, stop: list[ControlRequest]) -> Callable[[int], None]:
    return on_batch_once(3, lambda: stop.append(request(storage, stop=True,
                                                        savepoint_id="stop")))


def test_a_stop_whose_answer_fails_once_is_answered_and_stops(
    storage: CheckpointStorage, tmp_path: Path
) -> None:
    stop: list[ControlRequest] = []
    faults: list[FailingPuts] = []

    def fault(s: CheckpointStorage) -> CheckpointStorage:
        faults.append(FailingPuts(s, control_answer, times=1))
        return faults[0]

    life = live(storage, tmp_path / "w", cp.Script(batches=6), periodic=False,
                fault=fault, on_batch=stop_at_3(storage, stop))

    assert len(faults[0].failed) == 1
    assert life.outcome == "stopped"
    result = answer(storage, stop[0])
    assert (result.status, result.batch_id) == ("completed", 3), result
    assert life.job.history.events([ev.RESTART]) == []  # retried, not restarted


def test_a_stop_whose_answer_has_an_unknown_outcome_still_stops(
    storage: CheckpointStorage, tmp_path: Path
) -> None:
    """The answer "completed" may have landed (every attempt's reply was lost): the job
    stops, since running on could contradict it."""
    stop: list[ControlRequest] = []
    life = live(storage, tmp_path / "w", cp.Script(batches=6), periodic=False,
                fault=lambda s: FailingPuts(s, control_answer, times=None,
                                            error=OutcomeUnknownError),
                on_batch=stop_at_3(storage, stop))

    assert life.outcome == "stopped"
    assert life.job.history.last(ev.JOB_STOPPED) is not None
    assert max(JsonLinesSink(storage, cp.SINK_PREFIX).committed_batches()) == 3


def test_a_stop_whose_savepoint_fails_is_refused_and_the_job_runs_on(
    storage: CheckpointStorage, tmp_path: Path
) -> None:
    """The savepoint's marker put fails: the request is answered "failed" saying that
    the job keeps running, and it does, taking periodic checkpoints again."""
    stop: list[ControlRequest] = []
    life = live(storage, tmp_path / "w", cp.Script(batches=6), periodic=True,
                fault=lambda s: FailingPuts(s, savepoint_marker, times=1),
                on_batch=stop_at_3(storage, stop))

    result = answer(storage, stop[0])
    assert result.status == "failed" and "keeps running" in (result.failure_message or "")
    assert life.outcome == "finished"
    assert life.job.history.last(ev.JOB_STOPPED) is None
    periodic = [e.data["batch_id"] for e in life.job.history.events([ev.CHECKPOINT_COMPLETED])
                if e.data["trigger"] == "periodic"]
    assert max(periodic) > 3, periodic  # periodic checkpoints resumed after the refusal
    assert committed_numbers(storage) == list(range(1, 6 * cp.PER_BATCH + 1))


def test_an_earlier_drivers_savepoint_at_another_batch_does_not_answer_a_stop(
    storage: CheckpointStorage, tmp_path: Path
) -> None:
    """The driver that took the stop's savepoint (at batch 3) died before its answer
    landed; the driver that continues the job committed batches 4 and 5 before it saw
    the request. That savepoint cannot be the stop's (an upgrade from it would repeat
    batches 4 and 5): the request is answered "failed" and the job keeps running."""
    stop: list[ControlRequest] = []
    first = live(storage, tmp_path / "w1", cp.Script(batches=6), periodic=False,
                 on_batch=stop_at_3(storage, stop))
    assert first.outcome == "stopped"
    layout = JobLayout(JOB)
    key = layout.control_request(stop[0].request_id)
    body = storage.get_bytes(key)
    # as if the answer never landed and the successor saw the request only in batch 5
    storage.delete_many([key, layout.control_result(stop[0].request_id)])
    second = live(storage, tmp_path / "w2", cp.Script(batches=8), periodic=False,
                  on_batch=on_batch_once(5, lambda: storage.put_bytes(key, body)))

    result = answer(storage, stop[0])
    assert result.status == "failed", result
    assert "run on to batch 5" in (result.failure_message or ""), result
    assert second.outcome == "finished"
    assert CheckpointCatalog(storage, JOB).savepoint("stop").batch_id == 3


def test_a_savepoint_completed_in_the_final_drain_is_answered(
    storage: CheckpointStorage, tmp_path: Path
) -> None:
    """Issue 20 item 9. The savepoint is triggered, the query then finishes, and the
    savepoint completes while the final checkpoint drains the coordinator. Before, it
    got no ``control/<id>.result.json`` (its requester waited out its timeout and
    failed); now it is answered before ``job_finished``."""
    manual = request(storage, stop=False, savepoint_id="late")
    life = live(storage, tmp_path / "w", cp.Script(batches=1), periodic=False)

    assert life.outcome == "finished"
    result = answer(storage, manual)
    assert result.status == "completed", result
    assert result.savepoint_path is not None and result.savepoint_path.endswith("sp-late")
    assert CheckpointCatalog(storage, JOB).savepoint("late").batch_id == result.batch_id
    finished = life.job.history.last(ev.JOB_FINISHED)
    assert finished is not None
    assert life.index(".result.json") < life.index(finished.key)


def test_the_job_page_shows_no_failure_after_a_stop_with_savepoint(
    storage: CheckpointStorage, tmp_path: Path
) -> None:
    """Issue 18 item 3 on the page: after the stop of the first case (a periodic
    checkpoint and a manual savepoint interrupted by it), the job page's "Latest
    failure" is empty, the failed count 0, and the job STOPPED."""
    import warnings

    from airflow_ckpt.plugins.app import create_app
    from airflow_ckpt.plugins.settings import PluginSettings
    from tests.fixtures.checkpoint_history import parse_page

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from fastapi.testclient import TestClient

    def requested() -> None:
        request(storage, stop=False, savepoint_id="manual")
        request(storage, stop=True, savepoint_id="stop")

    life = live(storage, tmp_path / "w", cp.Script(batches=6), periodic=True,
                halt_at=3, on_halt=requested)
    assert life.outcome == "stopped"
    with TestClient(create_app(PluginSettings(storage.uri), authenticate=False)) as client:
        body = client.get(f"/jobs/{JOB}/checkpoints").json()
        _, texts = parse_page(client.get(f"/view/{JOB}").text)
    assert body["counts"]["failed"] == 0 and body["latest"]["failed"] is None, body
    assert texts["job-status"] == "STOPPED"
    assert texts["count-failed"] == "0"


@pytest.mark.parametrize("batches", [1, 4], ids=["in-the-final-drain", "while-running"])
def test_an_abandoned_savepoint_is_not_answered_and_the_job_stops(
    storage: CheckpointStorage, tmp_path: Path, batches: int
) -> None:
    """Issue 24 item 2. A manual savepoint's ``_metadata`` put meets
    ``OutcomeUnknownError``: the marker may land, now or later, so the savepoint is
    abandoned (neither failed nor completed: a new lease epoch decides). With one batch
    the query has finished and the savepoint settles in the final drain: before, the
    drain answered the request "failed" (a later landing marker would contradict it) and
    the job took a new final checkpoint and returned "finished"; while the query runs,
    the loop answered it "failed" before it raised. Now nothing answers the request, no
    final checkpoint is taken, and the driver stops with the marker's error."""
    manual = request(storage, stop=False, savepoint_id="late")
    faults: list[FailingPuts] = []

    def fault(s: CheckpointStorage) -> CheckpointStorage:
        faults.append(FailingPuts(s, savepoint_marker, times=1, error=OutcomeUnknownError))
        return faults[0]

    with pytest.raises(OutcomeUnknownError, match="sp-late/_metadata"):
        live(storage, tmp_path / "w", cp.Script(batches=batches), periodic=False,
             fault=fault)

    assert len(faults[0].failed) == 1  # the fault did happen
    assert ControlChannel(storage, JOB).result(manual.request_id) is None  # no answer
    history = JobHistory(storage, JOB)
    assert history.last(ev.JOB_FINISHED) is None
    assert history.events([ev.SAVEPOINT_FAILED]) == []
    finals = [e for e in history.events([ev.CHECKPOINT_COMPLETED])
              if e.data["trigger"] == "final"]
    assert finals == []  # no final checkpoint after the abandoned savepoint
