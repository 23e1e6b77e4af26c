"""The job's side of the control channel: savepoint requests triggered and answered.

A request found in the channel (:mod:`airflow_ckpt.runtime.control.channel`) is triggered
as a savepoint, or returned to the job when it asks for a stop; when its savepoint
completes or fails the request is answered, create-only. An abandoned savepoint is never
answered (see :meth:`SavepointRequests.answer_finished`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from airflow_ckpt.errors import ObjectAlreadyExistsError, StorageError
from airflow_ckpt.runtime.checkpoint.coordinator import CheckpointCoordinator
from airflow_ckpt.runtime.checkpoint.pending import PendingCheckpoint, PendingState
from airflow_ckpt.runtime.control.channel import ControlChannel, ControlRequest, ControlResult

log = logging.getLogger("airflow_ckpt.job")

#: how often a control answer is written before the error is raised (the answer is
#: create-only with the same bytes each time: a retry that finds it in place succeeded)
ANSWER_ATTEMPTS = 3


class SavepointRequests:
    """Triggers the savepoints requested over ``control`` and writes their answers.

    The requests in flight are the caller's (one dict per attempt of the query: a
    restarted query looks at the channel again, its requests died with the last one).
    """

    def __init__(self, control: ControlChannel,
                 clock: Callable[[], float] = time.time) -> None:
        """``clock``: this host's wall clock (answers' timestamps; with
        :attr:`storage_offset_s`, the storage's now)."""
        self.control = control
        self.clock = clock
        #: the storage's clock minus ours (set by the job when it starts): requests' ages
        #: are judged on the storage's clock, never by comparing the requester's with ours
        self.storage_offset_s = 0.0

    def poll(
        self, coordinator: CheckpointCoordinator, requests: dict[str, PendingCheckpoint],
        now: float,
    ) -> ControlRequest | None:
        """Trigger the savepoints newly requested; return a stop request, if any."""
        stop = None
        for request in self.control.look(now, storage_now=self.clock() + self.storage_offset_s,
                                         busy=requests.keys()):
            if request.request_id in requests:
                continue
            if request.expired(self.clock() + self.storage_offset_s):
                self.answer(ControlResult(
                    request.request_id, "failed", self.clock(),
                    failure_message="the request expired before the job picked it up",
                ))
                continue
            if request.stop:
                stop = stop or request
                continue
            # unnamed: the job names it, and its savepoint history keeps it a while
            requests[request.request_id] = coordinator.trigger(
                "manual", savepoint_id=request.savepoint_id or request.request_id,
                request_id=request.request_id, in_history=request.savepoint_id is None,
            )
        return stop

    def answer_finished(self, requests: dict[str, PendingCheckpoint]) -> None:
        """Answer the savepoint requests whose savepoint completed or failed. An
        abandoned one is not answered: its marker may count (it is the coordinator's
        fatal error; the driver stops and the request stays open for a successor)."""
        for request_id, pending in list(requests.items()):
            if pending.done.is_set():
                del requests[request_id]
                if pending.state is not PendingState.ABANDONED:
                    self.answer_request(request_id, pending)

    def answer_request(self, request_id: str, pending: PendingCheckpoint) -> bool:
        """Answer one finished request; True if it completed and the answer is ours."""
        manifest = pending.manifest
        if manifest is None:
            self.answer(ControlResult(
                request_id, "failed", self.clock(), savepoint_id=pending.savepoint_id,
                failure_message=pending.failure,
            ))
            return False
        return self.answer(ControlResult(
            request_id, "completed", self.clock(), savepoint_id=manifest.savepoint_id,
            savepoint_path=pending.path, checkpoint_id=manifest.checkpoint_id,
            batch_id=manifest.batch_id,
        ))

    def refuse_stop(self, coordinator: CheckpointCoordinator, request: ControlRequest,
                    reason: str) -> None:
        """Answer a stop request that cannot be honoured "failed", saying that the job
        keeps running, and let periodic checkpoints resume (the caller runs the query
        on)."""
        log.warning("stop-with-savepoint %s refused, the job keeps running: %s",
                    request.request_id, reason)
        self.answer(ControlResult(
            request.request_id, "failed", self.clock(),
            savepoint_id=request.savepoint_id or request.request_id,
            failure_message=f"{reason}; the stop was not done and the job keeps running",
        ))
        coordinator.resume()

    def answer(self, result: ControlResult) -> bool:
        """Answer a request; False if it was answered already (the requester gave up
        waiting and expired it), in which case a stop request is not honoured.

        A write that fails is tried again, up to :data:`ANSWER_ATTEMPTS`, with the same
        bytes (so one that landed although its answer was lost is found in place: the
        retry succeeds); then the last error is raised.
        """
        attempt = 1
        while True:
            try:
                self.control.answer(result)
                return True
            except ObjectAlreadyExistsError:
                log.warning("request %s was already answered (expired by its requester); "
                            "the savepoint is kept but not reported", result.request_id)
                return False
            except StorageError as exc:
                if attempt == ANSWER_ATTEMPTS:
                    raise
                attempt += 1
                log.warning("answering request %s failed (%s); trying again",
                            result.request_id, exc)
