"""How the query of an attempt ends: drained (every triggered checkpoint and savepoint
settled), its final checkpoint taken, stopped with a savepoint, or cancelled; and the
:class:`JobResult` that ``CheckpointedJob.run`` returns."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from airflow_ckpt.errors import CheckpointError, OutcomeUnknownError
from airflow_ckpt.runtime.checkpoint.coordinator import CheckpointCoordinator
from airflow_ckpt.runtime.checkpoint.metadata import Manifest
from airflow_ckpt.runtime.checkpoint.pending import PendingCheckpoint
from airflow_ckpt.runtime.checkpoint.snapshot import latest_batch
from airflow_ckpt.runtime.control.channel import ControlRequest
from airflow_ckpt.runtime.history import events as ev
from airflow_ckpt.runtime.history.journal import JobHistory
from airflow_ckpt.runtime.job.requests import SavepointRequests
from airflow_ckpt.runtime.workdir import Workdir

if TYPE_CHECKING:
    from pyspark.sql.streaming import StreamingQuery

log = logging.getLogger("airflow_ckpt.job")

#: how often the final checkpoint of an ended query is taken before the step fails: an
#: attempt that fails (a storage error) is followed by another, with a new id
FINAL_CHECKPOINT_ATTEMPTS = 3


@dataclass(frozen=True, slots=True)
class JobResult:
    """How ``run`` ended: ``finished`` (source exhausted) or ``stopped`` (stop request)."""

    outcome: str
    last_checkpoint: Manifest | None
    savepoint_path: str | None = None


class QueryEnding:
    """Ends the query of an attempt; ``requests`` answers the savepoint requests among
    what the drain settles, and a stop's. ``retention`` is the checkpoint config's."""

    def __init__(self, *, requests: SavepointRequests, history: JobHistory, run_id: str,
                 workdir: Workdir, retention: str) -> None:
        self.requests = requests
        self.history = history
        self.run_id = run_id
        self.workdir = workdir
        self.retention = retention
        #: this job's checkpoint the attempt restored (set as each attempt starts)
        self.restored_id: int | None = None

    def stop_with_savepoint(
        self, query: StreamingQuery, coordinator: CheckpointCoordinator, request: ControlRequest,
        requests: dict[str, PendingCheckpoint],
    ) -> JobResult | None:
        """Stop the query; take a final checkpoint, then the savepoint, at the batch it
        stopped at; answer the request; record ``job_stopped``.

        ``query.stop()`` returns once the query's thread has ended: no batch commits
        after the stopped one. The final checkpoint commits that batch's transactions
        and is what ``restore=latest`` resumes from; the savepoint is at the same batch,
        so resuming from either neither loses nor repeats output. "completed" is
        answered only when all of that is durable, and nothing runs after it.

        Returns None when the stop is refused and the query must run on (the caller
        starts it again on the same working directory; it continues after the stopped
        batch, which the final checkpoint, if taken, covers): a step failed (answered
        "failed", saying that the job keeps running), or the requester expired the
        request first. A fatal coordinator error (another driver, a lost lease, a marker
        of unknown outcome, too many failed checkpoints) and a query that failed before
        it stopped are raised without an answer: the request stays pending for the
        query or driver that continues the job.
        """
        query.stop()
        error = query.exception()
        if error is not None:
            raise error
        self.drain(coordinator, requests)
        try:
            final = self.final_checkpoint(coordinator)
        except CheckpointError as exc:
            if coordinator.fatal is not None:
                raise
            self.requests.refuse_stop(coordinator, request, str(exc))
            return None
        pending = coordinator.trigger("stop", savepoint_id=request.savepoint_id or
                                      request.request_id, request_id=request.request_id,
                                      in_history=request.savepoint_id is None)
        coordinator.wait(pending)
        savepoint = pending.manifest
        if savepoint is None:
            if coordinator.fatal is not None:
                raise coordinator.fatal
            self.requests.refuse_stop(coordinator, request,
                                                f"the savepoint failed: {pending.failure}")
            return None
        if savepoint.batch_id != final.batch_id:
            # An earlier driver took this savepoint for this request and died before it
            # stopped; this driver's query ran on past it.
            self.requests.refuse_stop(
                coordinator, request,
                f"savepoint {savepoint.savepoint_id!r} answering this request was taken at "
                f"batch {savepoint.batch_id} by a driver that died before it stopped, and "
                f"the job has run on to batch {final.batch_id}")
            return None
        try:
            answered = self.requests.answer_request(request.request_id, pending)
        except OutcomeUnknownError:
            # The answer "completed" may have landed: running on could contradict it.
            log.exception("the answer to stop-with-savepoint %s may not have been written; "
                          "the job stops all the same", request.request_id)
            answered = True
        if not answered:
            log.warning("stop-with-savepoint %s was expired by its requester; the job runs "
                        "on", request.request_id)
            coordinator.resume()
            return None
        try:
            self.history.append(ev.JOB_STOPPED, run_id=self.run_id, savepoint=pending.path)
        except Exception:  # stopped and answered: the job must not run on
            log.exception("could not record job_stopped; the job has stopped all the same")
        return JobResult("stopped", final, pending.path)

    def drain(self, coordinator: CheckpointCoordinator,
               requests: dict[str, PendingCheckpoint]) -> None:
        """The query has ended: settle every checkpoint and savepoint triggered so far
        (see ``CheckpointCoordinator.drain``) and answer the savepoint requests among
        them."""
        coordinator.drain()
        self.requests.answer_finished(requests)
        if coordinator.fatal is not None:
            # e.g. a savepoint abandoned in the drain (its marker's outcome unknown): the
            # driver stops, without a final checkpoint; a new lease epoch decides
            raise coordinator.fatal

    def final_checkpoint(self, coordinator: CheckpointCoordinator) -> Manifest:
        """A checkpoint of the ended (drained) query at its last committed batch; the
        newest retained one if it covers that batch already.

        An attempt that fails is followed by another, up to
        :data:`FINAL_CHECKPOINT_ATTEMPTS`; then ``CheckpointError`` names the last
        failure. A fatal coordinator error (another driver, a lost lease, a marker of
        unknown outcome) is raised at once: no attempt can help.
        """
        failure = None
        for _ in range(FINAL_CHECKPOINT_ATTEMPTS):
            retained = coordinator.store.retained
            # The newest retained checkpoint covers the end only if it is this run's own
            # or the one it restored from (a newer, damaged one it fell back past does not).
            own = [m for m in retained if m.checkpoint_id >= coordinator.first_id
                   or m.checkpoint_id == self.restored_id]
            if own and own[-1].batch_id == latest_batch(self.workdir, "commits"):
                return own[-1]
            pending = coordinator.trigger("final")
            coordinator.wait(pending)
            if pending.manifest is not None:
                return pending.manifest
            if coordinator.fatal is not None:
                raise coordinator.fatal
            failure = f"chk-{pending.checkpoint_id}: {pending.failure}"
            log.warning("the final checkpoint failed (%s); taking it again", failure)
        raise CheckpointError(
            f"the final checkpoint failed {FINAL_CHECKPOINT_ATTEMPTS} times; last: {failure}")

    def cancelled(self, query: StreamingQuery, coordinator: CheckpointCoordinator) -> JobResult:
        self.stop_quietly(query)
        if self.retention == "DELETE_ON_CANCELLATION":
            coordinator.shutdown()
            coordinator.store.discard_all()
        self.history.append(ev.JOB_STOPPED, run_id=self.run_id, cancelled=True)
        return JobResult("cancelled", None)

    @staticmethod
    def stop_quietly(query: StreamingQuery) -> None:
        try:
            query.stop()
        except Exception:  # the query may already be dead
            log.debug("query.stop() failed", exc_info=True)
