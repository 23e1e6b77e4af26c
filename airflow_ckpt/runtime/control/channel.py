"""Requests to a running job (savepoint, stop-with-savepoint) and the job's answers.

A request is ``<job>/control/<request-id>.json``; the job answers with
``<job>/control/<request-id>.result.json`` (create-only, so a request is answered
exactly once). A request without a result is pending. Requests carry an expiry so a
request written while no job runs is answered "expired" instead of being acted on
days later.

**What an idle job pays to be asked.** Listing ``control/`` every second would cost
86,400 LIST requests a day per running job. Instead the requester, once its request is
durable, rings a doorbell: it creates ``<job>/lease/doorbell-<request-id>``, beside the
lease records. The driver's lease heartbeat lists ``lease/`` every few seconds anyway
(to confirm its epoch), so the driver hears the ring in a listing it makes regardless
(:class:`Doorbell`), at no request of its own, and lists ``control/`` then. It also
lists ``control/`` on a slow period whatever it heard: that listing, not the doorbell,
is what guarantees a request is found (a ring that failed, or a heartbeat that stopped
listing, only makes the answer slower). Correctness never rests on the doorbell or on
timing; the doorbell is a hint.

Who writes what: the requester writes its request and creates its doorbell; the
driver writes the answer (create-only) and, once a request has an answer, deletes its
doorbell; a requester that gives up writes the "expired" answer instead (create-only:
exactly one answer wins). Nobody decides anything from a doorbell but "list now".

**Answered requests are deleted** (issue 26), by the driver only (the lease holder,
through its gate): once a request has an answer and expired more than
:data:`ANSWER_RETENTION_S` ago (its timeout, measured on the storage's clock from when
the storage stored it, as :meth:`ControlRequest.expired`), the request goes first, then
its answer. The requester never deletes: it waits for the answer at most its timeout,
then answers "expired" itself (create-only), so by the deletion it has stopped waiting
and writing; deleting earlier (by the answer's age alone) let a requester whose reads
failed expire a request whose answer was gone, recording a second answer (the
simulation's ``job-control`` found it at once). The order keeps "a request without an
answer is pending" true for a crash in between: an answer without its request is
nobody's business (deleted on a later look); a request whose answer went first would
be acted on again. One GET per request reads its timeout, once, when its answer is
older than the retention; a look deletes at most :data:`FORGET_PER_LOOK` (a backlog
drains over several looks). So ``control/`` holds the requests of about one timeout
plus one retention, whatever the job's age: one LIST page per look.

**Requests from another version.** A request is written by the Airflow side's
provider, read by the driver's: during a rolling upgrade the two differ. A request
carries ``format`` only from format 2 on (format 1 omits it, so every driver that
predates the field still reads today's requests). A driver that cannot read a request
— not JSON, a newer ``format``, a field it does not know (its meaning could change
what is asked), a field missing — answers it "failed" with the reason, create-only like
any answer: the request is answered once, the requester learns why, and the driver
goes on (it never fails an attempt for what another process wrote). A result with a
field the reader does not know is read without it: a result's extra fields only inform.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass, fields
from typing import Literal

from airflow_ckpt.errors import (
    MetadataError,
    ObjectAlreadyExistsError,
    ObjectNotFoundError,
    StorageError,
)
from airflow_ckpt.runtime.storage.base import CheckpointStorage, ObjectInfo
from airflow_ckpt.runtime.storage.layout import JobLayout
from airflow_ckpt.runtime.storage.observed import ObservedStorage

log = logging.getLogger("airflow_ckpt.control")

RequestType = Literal["savepoint"]
ResultStatus = Literal["completed", "failed"]
_RESULT_SUFFIX = ".result.json"
#: how long an answered request (and its answer) stays after the request expired (the
#: storage's clock) before the driver deletes it: a reader's slack past its timeout
ANSWER_RETENTION_S = 3600.0
#: answered requests one look deletes at most (a backlog, e.g. a year of them after an
#: upgrade, drains over several looks: a look's cost stays bounded)
FORGET_PER_LOOK = 200
#: the request format this version writes and reads (1: no ``format`` field written)
REQUEST_FORMAT = 1


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
    #: the format of the request's body (:data:`REQUEST_FORMAT`; written from 2 on)
    format: int = REQUEST_FORMAT

    def to_json(self) -> bytes:
        """The stored body: the storage's ``stored_ts`` is never written, nor format 1."""
        body = asdict(self)
        body.pop("stored_ts")
        if self.format == 1:
            body.pop("format")
        return json.dumps(body).encode()

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


@dataclass(frozen=True, slots=True)
class UnreadableRequest:
    """A request this version cannot act on, and why (answered "failed" by the driver)."""

    request_id: str
    reason: str


_REQUEST_FIELDS = frozenset(f.name for f in fields(ControlRequest)) - {"stored_ts"}
_RESULT_FIELDS = frozenset(f.name for f in fields(ControlResult))


def parse_request(raw: bytes, key: str, request_id: str,
                  stored_ts: float) -> ControlRequest | UnreadableRequest:
    """The request stored at ``key``, or why this version cannot read it. Never raises
    for what the body holds: a request is another process's (maybe another version's)
    writing."""
    try:
        body = _load(raw, key)
    except MetadataError as exc:
        return UnreadableRequest(request_id, str(exc))
    body.pop("stored_ts", None)  # the storage's word, never the request's
    version = body.get("format", 1)
    if not isinstance(version, int) or version > REQUEST_FORMAT:
        return UnreadableRequest(request_id, (
            f"{key}: request format {version!r} is newer than this job's airflow-ckpt reads "
            f"(format {REQUEST_FORMAT}): upgrade the provider on the Spark driver too"))
    unknown = sorted(set(body) - _REQUEST_FIELDS)
    if unknown:
        return UnreadableRequest(request_id, (
            f"{key}: fields {unknown} are unknown to this job's airflow-ckpt (written by "
            "another version?): the job does not act on a request it cannot fully read"))
    try:
        request = ControlRequest(**body, stored_ts=stored_ts)
    except TypeError as exc:
        return UnreadableRequest(request_id, f"{key}: not a control request ({exc})")
    problems = [name for name, ok in (
        ("request_id", request.request_id == request_id),
        ("type", request.type == "savepoint"),
        ("created_ts", isinstance(request.created_ts, (int, float))),
        ("expires_ts", isinstance(request.expires_ts, (int, float))),
        ("stop", isinstance(request.stop, bool)),
        ("savepoint_id", request.savepoint_id is None or isinstance(request.savepoint_id, str)),
    ) if not ok]
    if problems:
        return UnreadableRequest(request_id, f"{key}: invalid {', '.join(problems)}")
    return request


def _load(raw: bytes, key: str) -> dict:
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise MetadataError(f"{key}: not valid JSON ({exc})") from exc
    if not isinstance(body, dict):
        raise MetadataError(f"{key}: not a JSON object")
    return body


class Doorbell:
    """The doorbells rung for one job, as the newest listing of ``lease/`` showed them.

    :meth:`listen` gives the driver's lease a view of its storage through which every
    listing of ``lease/`` (the heartbeat's) updates :attr:`rung`. Thread-safe: the
    heartbeat thread replaces the set, the driver's loop reads it.
    """

    def __init__(self, job: str) -> None:
        self.layout = JobLayout(job)
        #: request ids whose doorbell the newest listing of ``lease/`` showed
        self.rung: frozenset[str] = frozenset()

    def listen(self, storage: CheckpointStorage) -> CheckpointStorage:
        """``storage`` as a view whose listings of ``lease/`` are heard (reads and writes
        otherwise unchanged)."""
        return ObservedStorage(storage, self._hear)

    def _hear(self, prefix: str, objects: list[ObjectInfo]) -> None:
        bells = self.layout.doorbell_prefix
        if bells.startswith(prefix):  # a listing that covers every doorbell
            self.rung = frozenset(
                info.key[len(bells):] for info in objects if info.key.startswith(bells))


class ControlChannel:
    """Writes and reads the control requests of one job.

    :param doorbell: the driver's :class:`Doorbell` (the driver's channel only): lets
        :meth:`due` say "list now" as soon as a ring was heard
    :param clock: the requester's wall clock (a request's ``created_ts``, its id)
    :param ids: fresh random ids (a request's id)
    """

    def __init__(self, storage: CheckpointStorage, job: str, *,
                 doorbell: Doorbell | None = None,
                 clock: Callable[[], float] = time.time,
                 ids: Callable[[], uuid.UUID] = uuid.uuid4) -> None:
        self.storage = storage
        self.clock = clock
        self.ids = ids
        self.layout = JobLayout(job)
        self.doorbell = doorbell
        #: when (the caller's clock) the newest listing of ``control/`` began
        self._listed_at: float | None = None
        #: the doorbells heard before that listing began: their requests are in it
        self._heard_before_listing: frozenset[str] = frozenset()
        #: requests read so far that are still pending (a request never changes: it is
        #: read once, not at every look while its savepoint is taken)
        self._read: dict[str, ControlRequest] = {}
        #: pending requests this version cannot read (answered "failed" by :meth:`look`)
        self._unreadable: dict[str, UnreadableRequest] = {}
        #: how long :meth:`look` keeps an answered request after it expired
        self.answer_retention_s = ANSWER_RETENTION_S
        #: answered request key -> when it expired (the storage's clock), read once
        self._expiry: dict[str, float] = {}

    def request_savepoint(
        self,
        *,
        stop: bool = False,
        timeout_s: float = 600.0,
        savepoint_id: str | None = None,
        requested_by: str = "",
    ) -> ControlRequest:
        """Write a savepoint request. Durable (visible to the job) when this returns."""
        now = self.clock()
        request_id = f"{int(now * 1000):013d}-{self.ids().hex[:8]}"
        request = ControlRequest(
            request_id=request_id,
            type="savepoint",
            created_ts=now,
            expires_ts=now + timeout_s,
            stop=stop,
            savepoint_id=savepoint_id,
            requested_by=requested_by,
        )
        self.storage.put_bytes(self.layout.control_request(request_id), request.to_json(),
                               create_only=True)
        try:  # only now: a ring must never lead the driver to a request not yet stored
            self.storage.put_bytes(self.layout.doorbell(request_id), b"", create_only=True)
        except StorageError as exc:  # the request stands; the job finds it a bit later
            log.warning("request %s is stored but its doorbell could not be rung (%s); the "
                        "job finds it at its next periodic look", request_id, exc)
        return request

    def due(self, now: float, every_s: float) -> bool:
        """Whether the driver should list its requests at ``now`` (its own clock): it
        never did, ``every_s`` passed since its last listing began, or a doorbell was
        heard that had not been heard when that listing began. No request is made."""
        if self._listed_at is None or now >= self._listed_at + every_s:
            return True
        return self.doorbell is not None and bool(self.doorbell.rung - self._heard_before_listing)

    def next_due(self, every_s: float) -> float:
        """When (the caller's clock) the next periodic listing is due."""
        return float("-inf") if self._listed_at is None else self._listed_at + every_s

    def pending(self) -> list[ControlRequest]:
        """Requests without a result, oldest first: one LIST of ``control/`` and a GET
        per pending request not read by this channel before."""
        return self._unanswered(self._keys())

    def look(self, now: float, storage_now: float | None = None,
             busy: Collection[str] = ()) -> list[ControlRequest]:
        """The driver's :meth:`pending`: also remembers that a listing began at ``now``
        (the caller's clock, for :meth:`due`), deletes the doorbells heard for requests
        that have an answer (best effort: a doorbell is only a hint), with
        ``storage_now`` (the storage's clock) deletes the requests answered more than
        :data:`ANSWER_RETENTION_S` ago and their answers (see the module doc) but those
        whose ids are in ``busy`` (the driver still acts on them and will answer: were
        the requester's "expired" answer deleted, the driver's create-only answer would
        land as a second one), and answers "failed" each request it cannot read (see
        the module doc; a failed answer is tried again at the next look)."""
        heard = self.doorbell.rung if self.doorbell is not None else frozenset()
        keys = self._keys()
        self._listed_at, self._heard_before_listing = now, heard
        self._hang_up(heard, keys)
        if storage_now is not None:
            self._forget_answered(keys, storage_now, busy)
        requests = self._unanswered(keys)
        for unreadable in self._unreadable.values():
            self._refuse(unreadable)
        return requests

    def _refuse(self, unreadable: UnreadableRequest) -> None:
        log.error("control request %s cannot be read and is answered failed: %s",
                  unreadable.request_id, unreadable.reason)
        try:
            self.answer(ControlResult(unreadable.request_id, "failed", time.time(),
                                      failure_message=unreadable.reason))
        except ObjectAlreadyExistsError:
            pass  # answered already (its requester expired it): answered once
        except StorageError as exc:
            log.warning("could not answer request %s (%s); will retry", unreadable.request_id,
                        exc)

    def _keys(self) -> dict[str, float]:
        """Every key under ``control/`` and when the storage stored it (its clock)."""
        return {i.key: i.last_modified for i in self.storage.list(self.layout.control_prefix)}

    def _unanswered(self, keys: dict[str, float]) -> list[ControlRequest]:
        pending = sorted(
            key for key in keys
            if key.endswith(".json") and not key.endswith(_RESULT_SUFFIX)
            and key[: -len(".json")] + _RESULT_SUFFIX not in keys)
        read = {key: self._read.get(key) or self._unreadable.get(key)
                or self._read_request(key, keys[key])
                for key in pending}
        self._read = {k: r for k, r in read.items() if isinstance(r, ControlRequest)}
        self._unreadable = {k: r for k, r in read.items() if isinstance(r, UnreadableRequest)}
        return list(self._read.values())

    def _request_id(self, key: str) -> str:
        """The id of the request stored at ``key`` (``control/<id>.json``)."""
        return key[len(self.layout.control_prefix):-len(".json")]

    def _read_request(self, key: str, stored_ts: float) -> ControlRequest | UnreadableRequest:
        request_id = self._request_id(key)
        return parse_request(self.storage.get_bytes(key), key, request_id, stored_ts)

    def _hang_up(self, heard: frozenset[str], keys: dict[str, float]) -> None:
        answered = [self.layout.doorbell(r) for r in sorted(heard)
                    if self.layout.control_result(r) in keys]
        try:
            self.storage.delete_many(answered)
        except StorageError as exc:
            log.warning("could not delete answered doorbells %s (%s); will retry", answered, exc)

    def _forget_answered(self, keys: dict[str, float], storage_now: float,
                         busy: Collection[str]) -> None:
        """Delete the answered requests that expired more than
        :attr:`answer_retention_s` ago, then their answers, and answers whose request is
        gone (best effort: tried again at the next look). ``keys`` loses them."""
        cutoff = storage_now - self.answer_retention_s
        old: list[str] = []
        requests: list[str] = []
        try:
            for result, stored in list(keys.items()):
                if len(old) == FORGET_PER_LOOK:
                    break
                if not result.endswith(_RESULT_SUFFIX) or stored >= cutoff:
                    continue  # an answer younger than the retention: its request is too
                request = result[: -len(_RESULT_SUFFIX)] + ".json"
                if self._request_id(request) in busy:
                    continue  # acted on: its answer is still to come (or failed to land)
                if request not in keys:
                    old.append(result)
                elif self._expired_at(request, keys[request]) < cutoff:
                    old.append(result)
                    requests.append(request)
            self.storage.delete_many(requests)
            self.storage.delete_many(old)  # only after their requests: see the module doc
        except StorageError as exc:
            log.warning("could not delete %d answered control requests (%s); will retry",
                        len(old), exc)
            return
        for key in [*requests, *old]:
            keys.pop(key, None)
            self._expiry.pop(key, None)

    def _expired_at(self, key: str, stored_ts: float) -> float:
        """When the request at ``key`` expired or expires (the storage's clock); an
        unreadable one counts as expired when stored (it was answered "failed")."""
        if key not in self._expiry:
            parsed = self._read_request(key, stored_ts)
            self._expiry[key] = (stored_ts + parsed.expires_ts - parsed.created_ts
                                 if isinstance(parsed, ControlRequest) else stored_ts)
        return self._expiry[key]

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
        body = _load(raw, key)
        try:
            return ControlResult(**{k: v for k, v in body.items() if k in _RESULT_FIELDS})
        except TypeError as exc:
            raise MetadataError(f"{key}: not a control result ({exc})") from exc
