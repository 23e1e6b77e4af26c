"""Requests to a running job (savepoint, stop-with-savepoint) and the job's answers.

A request is ``<job>/control/<request-id>.json``; the job answers with
``<job>/control/<request-id>.result.json`` (create-only, so a request is answered
exactly once). A request without a result is pending. Requests carry an expiry so a
request written while no job runs is answered "expired" instead of being acted on
days later.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Literal

from airflow_ckpt.errors import MetadataError, ObjectNotFoundError
from airflow_ckpt.runtime.layout import JobLayout
from airflow_ckpt.runtime.storage.base import CheckpointStorage

RequestType = Literal["savepoint"]
ResultStatus = Literal["completed", "failed"]
_RESULT_SUFFIX = ".result.json"


@dataclass(frozen=True, slots=True)
class ControlRequest:
    """A savepoint request. ``stop`` makes it stop-with-savepoint."""

    request_id: str
    type: RequestType
    created_ts: float
    expires_ts: float
    stop: bool = False
    savepoint_id: str | None = None
    requested_by: str = ""
    #: when the storage stored the request (its clock; set by :meth:`ControlChannel.pending`)
    stored_ts: float | None = None

    def expired(self, storage_now: float) -> bool:
        """Whether the request outlived its timeout (``expires_ts - created_ts``, a
        duration on the requester's clock) by ``storage_now``, both ends measured on the
        storage's clock: the requester's and the job's clocks are never compared."""
        if self.stored_ts is None:
            return False
        return storage_now > self.stored_ts + (self.expires_ts - self.created_ts)


@dataclass(frozen=True, slots=True)
class ControlResult:
    """The job's answer: where the savepoint is, or why it failed."""

    request_id: str
    status: ResultStatus
    completed_ts: float
    savepoint_id: str | None = None
    savepoint_path: str | None = None
    checkpoint_id: int | None = None
    batch_id: int | None = None
    failure_message: str | None = None


def _load(raw: bytes, key: str) -> dict:
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise MetadataError(f"{key}: not valid JSON ({exc})") from exc
    if not isinstance(body, dict):
        raise MetadataError(f"{key}: not a JSON object")
    return body


class ControlChannel:
    """Writes and reads the control requests of one job."""

    def __init__(self, storage: CheckpointStorage, job: str) -> None:
        self.storage = storage
        self.layout = JobLayout(job)

    def request_savepoint(
        self,
        *,
        stop: bool = False,
        timeout_s: float = 600.0,
        savepoint_id: str | None = None,
        requested_by: str = "",
    ) -> ControlRequest:
        """Write a savepoint request. Durable (visible to the job) when this returns."""
        now = time.time()
        request_id = f"{int(now * 1000):013d}-{uuid.uuid4().hex[:8]}"
        request = ControlRequest(
            request_id=request_id,
            type="savepoint",
            created_ts=now,
            expires_ts=now + timeout_s,
            stop=stop,
            savepoint_id=savepoint_id,
            requested_by=requested_by,
        )
        self.storage.put_bytes(
            self.layout.control_request(request_id),
            json.dumps({k: v for k, v in asdict(request).items() if k != "stored_ts"}).encode(),
            create_only=True,
        )
        return request

    def pending(self) -> list[ControlRequest]:
        """Requests without a result, oldest first."""
        stored = {i.key: i.last_modified for i in self.storage.list(self.layout.control_prefix)}
        out = []
        for key in sorted(stored):
            if key.endswith(_RESULT_SUFFIX) or not key.endswith(".json"):
                continue
            if key[: -len(".json")] + _RESULT_SUFFIX in stored:
                continue
            body = _load(self.storage.get_bytes(key), key)
            body.pop("stored_ts", None)  # the storage's word, never the request's
            try:
                out.append(ControlRequest(**body, stored_ts=stored[key]))
            except TypeError as exc:
                raise MetadataError(f"{key}: not a control request ({exc})") from exc
        return out

    def answer(self, result: ControlResult) -> None:
        """Write the result (create-only: a request is answered once)."""
        self.storage.put_bytes(
            self.layout.control_result(result.request_id),
            json.dumps(asdict(result)).encode(),
            create_only=True,
        )

    def result(self, request_id: str) -> ControlResult | None:
        """The answer to ``request_id``, or None while it is pending."""
        key = self.layout.control_result(request_id)
        try:
            raw = self.storage.get_bytes(key)
        except ObjectNotFoundError:
            return None
        try:
            return ControlResult(**_load(raw, key))
        except TypeError as exc:
            raise MetadataError(f"{key}: not a control result ({exc})") from exc
