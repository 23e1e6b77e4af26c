"""What the checkpoint sensor and triggers wait for, and the one place that checks it.

``CheckpointSensor`` (poke mode), ``CheckpointTrigger`` (deferred sensor and savepoint
operator), ``CheckpointEventTrigger`` (AssetWatcher) and the non-deferrable savepoint
operator all call the functions below; none has its own polling logic. Nothing here
imports Airflow, so it is tested directly against a storage.

A :class:`CheckpointCondition` combines (AND) these filters:

* ``kind``: checkpoints, savepoints or either;
* a *baseline* (``after_checkpoint_id`` / ``known_savepoints``): only snapshots
  completed after it was taken (:func:`take_baseline`) count — "any new one";
* ``min_checkpoint_id``: checkpoint (or savepoint) id >= N;
* ``request_id``: the savepoint that answers that control request (the job's answer,
  ``control/<id>.result.json``, decides: completed -> match, failed -> failure);
* ``max_checkpoint_age_s``: a health check, like the Flink Kubernetes operator's
  checkpoint-progress check: the wait fails when the newest completed checkpoint is
  older than this (or, if the job has none, when the wait itself is older than this).
  Ages compare the manifest's ``completed_ts`` (the driver's clock) with this host's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Literal

from airflow_ckpt.errors import (
    AirflowCkptError,
    ConfigError,
    EndpointUnreachableError,
    RestoreError,
)
from airflow_ckpt.health import checkpoint_progress
from airflow_ckpt.runtime.checkpoint.catalog import CheckpointCatalog
from airflow_ckpt.runtime.checkpoint.metadata import Manifest
from airflow_ckpt.runtime.control.channel import ControlChannel

log = logging.getLogger(__name__)

#: which snapshots a matcher accepts: a checkpoint.metadata ``Kind``, or "any"
KindFilter = Literal["checkpoint", "savepoint", "any"]
KINDS: tuple[str, ...] = ("checkpoint", "savepoint", "any")
Status = Literal["matched", "waiting", "failed", "timeout"]
STATUSES: tuple[str, ...] = ("matched", "waiting", "failed", "timeout")

#: ``after_checkpoint_id`` of a baseline taken when the job had no completed checkpoint.
NO_CHECKPOINT = -1


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class CheckpointCondition:
    """What to wait for in the storage of one job (all set filters must hold).

    :param job: the job name
    :param kind: ``"checkpoint"``, ``"savepoint"`` or ``"any"``
    :param after_checkpoint_id: only checkpoints with a larger id (the baseline)
    :param known_savepoints: only savepoints whose id is not in this set (the baseline)
    :param min_checkpoint_id: only snapshots whose checkpoint id is >= this
    :param request_id: only the savepoint answering this control request
    :param max_checkpoint_age_s: fail when no checkpoint completed within this window
    :param healthy_interval_s: wait for "healthy" too: match only while the job's newest
        completed checkpoint is no older than ``healthy_multiple`` x this interval
        (:func:`airflow_ckpt.health.checkpoint_progress` says ``ok``)
    :param healthy_multiple: the multiple of the health rule
    """

    job: str
    kind: KindFilter = "any"
    after_checkpoint_id: int | None = None
    known_savepoints: tuple[str, ...] | None = None
    min_checkpoint_id: int | None = None
    request_id: str | None = None
    max_checkpoint_age_s: float | None = None
    healthy_interval_s: float | None = None
    healthy_multiple: float = 3.0

    def __post_init__(self) -> None:
        problems: dict[str, str] = {}
        if not isinstance(self.job, str) or not self.job:
            problems["job"] = f"must be a job name, got {self.job!r}"
        if self.kind not in KINDS:
            problems["kind"] = f"{self.kind!r} is not one of {', '.join(KINDS)}"
        for name, lowest in (("after_checkpoint_id", NO_CHECKPOINT), ("min_checkpoint_id", 0)):
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or value < lowest):
                problems[name] = f"must be an integer >= {lowest}, got {value!r}"
        if self.known_savepoints is not None and (
            not isinstance(self.known_savepoints, tuple)
            or not all(isinstance(s, str) for s in self.known_savepoints)
        ):
            problems["known_savepoints"] = "must be a tuple of savepoint ids"
        if self.request_id is not None:
            if not isinstance(self.request_id, str) or not self.request_id.strip():
                problems["request_id"] = f"must be a control request id, got {self.request_id!r}"
            if self.kind == "checkpoint":
                problems["kind"] = "a request_id is answered by a savepoint; use 'savepoint'"
        age = self.max_checkpoint_age_s
        if age is not None and (isinstance(age, bool) or not isinstance(age, int | float)
                                or age <= 0):
            problems["max_checkpoint_age_s"] = f"must be a positive number of seconds, got {age!r}"
        interval = self.healthy_interval_s
        if interval is not None and (isinstance(interval, bool)
                                     or not isinstance(interval, int | float) or interval <= 0):
            problems["healthy_interval_s"] = (
                f"must be a positive number of seconds, got {interval!r}")
        if isinstance(self.healthy_multiple, bool) or not isinstance(
                self.healthy_multiple, int | float) or self.healthy_multiple <= 0:
            problems["healthy_multiple"] = (
                f"must be a positive number, got {self.healthy_multiple!r}")
        if problems:
            raise ConfigError("checkpoint condition", problems)

    @property
    def wants_checkpoints(self) -> bool:
        return self.kind in ("checkpoint", "any") and self.request_id is None

    @property
    def wants_savepoints(self) -> bool:
        return self.kind in ("savepoint", "any")

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form (trigger kwargs, state store values)."""
        out = asdict(self)
        if self.known_savepoints is not None:
            out["known_savepoints"] = list(self.known_savepoints)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CheckpointCondition:
        """Inverse of :meth:`to_dict`; unknown keys are a ``ConfigError``."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ConfigError("checkpoint condition", {k: "unknown key" for k in unknown})
        values = dict(data)
        if isinstance(values.get("known_savepoints"), list):
            values["known_savepoints"] = tuple(values["known_savepoints"])
        if "job" not in values:
            raise ConfigError("checkpoint condition", {"job": "missing"})
        return cls(**values)


@dataclass(frozen=True, slots=True)
class MatchResult:
    """The outcome of one check.

    ``summary`` (matched only) is :func:`summarize` of the matching manifest;
    ``message`` says why it failed / timed out / what is awaited; ``checked_ts`` is when
    the check ran (epoch seconds), so callers can measure detection latency.
    """

    status: Status
    summary: dict[str, Any] | None = None
    message: str = ""
    checked_ts: float = 0.0

    def to_payload(self) -> dict[str, Any]:
        """JSON-serialisable form (a trigger event's payload)."""
        return asdict(self)

    @classmethod
    def from_payload(cls, payload: Mapping[str, Any]) -> MatchResult:
        status = payload.get("status")
        if status not in STATUSES:
            raise ValueError(f"not a checkpoint trigger event: {dict(payload)!r}")
        return cls(
            status=status,
            summary=payload.get("summary"),
            message=str(payload.get("message") or ""),
            checked_ts=float(payload.get("checked_ts") or 0.0),
        )


# --------------------------------------------------------------------------- reading


def summarize(catalog: CheckpointCatalog, manifest: Manifest) -> dict[str, Any]:
    """The XCom / event summary of a completed checkpoint or savepoint."""
    layout = catalog.layout
    directory = (layout.savepoint_dir(manifest.savepoint_id) if manifest.savepoint_id
                 else layout.checkpoint_dir(manifest.checkpoint_id))
    return {
        "path": catalog.storage.uri.rstrip("/") + "/" + directory.rstrip("/"),
        "job": manifest.job,
        "kind": manifest.kind,
        "id": manifest.checkpoint_id,
        "savepoint_id": manifest.savepoint_id,
        "batch_id": manifest.batch_id,
        "trigger": manifest.trigger,
        "completed_ts": manifest.timings.completed_ts,
        "state_size": manifest.state_size,
        "checkpointed_size": manifest.checkpointed_size,
        "end_to_end_duration": manifest.timings.end_to_end_duration_ms,
    }


def take_baseline(catalog: CheckpointCatalog, condition: CheckpointCondition
                  ) -> CheckpointCondition:
    """``condition`` with its baseline set to what is stored now.

    Everything completed now is "old"; only snapshots completed later match. A
    checkpoint in flight now (directory without ``_metadata``) counts as new once it
    completes.
    """
    after = known = None
    if condition.wants_checkpoints:
        counted = catalog.checkpoint_ids()
        after = counted[-1] if counted else NO_CHECKPOINT
    if condition.wants_savepoints:
        known = tuple(catalog.savepoint_ids())
    return replace(condition, after_checkpoint_id=after, known_savepoints=known)


def new_snapshots(catalog: CheckpointCatalog, condition: CheckpointCondition) -> list[Manifest]:
    """Completed snapshots matching ``condition``'s kind, baseline and minimum id.

    Ordered oldest first (by completion time, then id). ``request_id`` is not applied
    here (see :func:`find_match`). Checkpoints count by the catalog's one rule
    (:meth:`~airflow_ckpt.runtime.checkpoint.catalog.CheckpointCatalog.counted`: the
    lease, the retention floor) and cost one listing, the lease record and one GET per
    match (the newest marker is read once, also when it is no match: its floor).
    Savepoints cost one listing, one HEAD per new directory and one GET per match.
    """
    found: list[Manifest] = []
    lowest = max(
        -1 if condition.after_checkpoint_id is None else condition.after_checkpoint_id + 1,
        -1 if condition.min_checkpoint_id is None else condition.min_checkpoint_id,
    )
    if condition.wants_checkpoints:
        counted = catalog.counted()
        found.extend(counted.read.get(n) or catalog.checkpoint(n)
                     for n in counted.ids if n >= lowest)
    if condition.wants_savepoints and condition.request_id is None:
        known = set(condition.known_savepoints or ())
        fresh = [sp for sp in catalog.savepoint_dirs() if sp not in known]
        for sp in catalog.completed_savepoints_among(fresh):
            manifest = catalog.savepoint(sp)
            if condition.min_checkpoint_id is None or (
                manifest.checkpoint_id >= condition.min_checkpoint_id
            ):
                found.append(manifest)
    return sorted(found, key=lambda m: (m.timings.completed_ts, m.checkpoint_id))


def advance(condition: CheckpointCondition, seen: Iterable[Manifest]) -> CheckpointCondition:
    """``condition`` with its baseline moved past the ``seen`` snapshots."""
    after, known = condition.after_checkpoint_id, condition.known_savepoints
    for m in seen:
        if m.savepoint_id is not None:
            known = tuple(sorted({*(known or ()), m.savepoint_id}))
        else:
            after = max(NO_CHECKPOINT if after is None else after, m.checkpoint_id)
    return replace(condition, after_checkpoint_id=after, known_savepoints=known)


def _request_result(catalog: CheckpointCatalog, condition: CheckpointCondition,
                    now: float) -> MatchResult | None:
    """The outcome of ``condition.request_id`` once the job answered, else None."""
    assert condition.request_id is not None
    job, request_id = condition.job, condition.request_id
    result = ControlChannel(catalog.storage, job).result(request_id)
    if result is None:
        if not catalog.storage.exists(catalog.layout.control_request(request_id)):
            return MatchResult("failed", message=(
                f"job {job!r} has no savepoint request {request_id!r} in {catalog.storage.uri} "
                "(wrong job, storage or request id?)"), checked_ts=now)
        return None
    if result.status != "completed":
        return MatchResult("failed", message=(
            f"savepoint request {request_id} of job {job!r} failed: "
            f"{result.failure_message or 'the job gave no reason'}"), checked_ts=now)
    where = result.savepoint_path or (
        f"savepoints/sp-{result.savepoint_id}" if result.savepoint_id else "")
    try:
        manifest = catalog.read(catalog.resolve(where))
    except RestoreError as exc:
        return MatchResult("failed", message=(
            f"job {job!r} reported savepoint {where!r} for request {request_id}, but it "
            f"cannot be read: {exc}"), checked_ts=now)
    return MatchResult("matched", summary=summarize(catalog, manifest), checked_ts=now)


def _stale(catalog: CheckpointCatalog, max_age_s: float, now: float,
           wait_started_ts: float) -> str | None:
    """Why the job is unhealthy (no checkpoint within ``max_age_s``), or None."""
    latest = catalog.latest_checkpoint()
    if latest is None:
        if now - wait_started_ts > max_age_s:
            return (f"job {catalog.layout.job!r} completed no checkpoint within "
                    f"{max_age_s:g} s (it has none at all)")
        return None
    age = now - latest.timings.completed_ts
    if age > max_age_s:
        return (f"job {catalog.layout.job!r} completed no checkpoint within {max_age_s:g} s: "
                f"the newest, chk-{latest.checkpoint_id}, completed {age:.0f} s ago")
    return None


def _healthy(catalog: CheckpointCatalog, condition: CheckpointCondition, now: float) -> bool:
    """True without a health condition, else when the checkpoint-progress rule says ok."""
    if condition.healthy_interval_s is None:
        return True
    latest = catalog.latest_checkpoint()
    completed_ts = None if latest is None else latest.timings.completed_ts
    return checkpoint_progress(completed_ts, condition.healthy_interval_s, now,
                               condition.healthy_multiple) == "ok"


def find_match(
    catalog: CheckpointCatalog,
    condition: CheckpointCondition,
    *,
    now: float,
    wait_started_ts: float,
    deadline_ts: float | None = None,
) -> MatchResult:
    """Check ``condition`` once.

    Matched beats every failure: when several snapshots match, the newest is returned.
    Otherwise a failed request, then a stale job (``max_checkpoint_age_s``), then an
    elapsed ``deadline_ts`` end the wait; else the result is ``waiting``.

    Errors reading the storage propagate (see :func:`poll_once` for the policy).
    """
    if condition.request_id is not None:
        outcome = _request_result(catalog, condition, now)
        if outcome is not None:
            return outcome
    else:
        matches = new_snapshots(catalog, condition)
        if matches and _healthy(catalog, condition, now):
            return MatchResult("matched", summary=summarize(catalog, matches[-1]),
                               checked_ts=now)
    if condition.max_checkpoint_age_s is not None:
        why = _stale(catalog, condition.max_checkpoint_age_s, now, wait_started_ts)
        if why:
            return MatchResult("failed", message=why, checked_ts=now)
    if deadline_ts is not None and now >= deadline_ts:
        return MatchResult("timeout", message=(
            f"no match for {describe(condition)} within {deadline_ts - wait_started_ts:.0f} s"
        ), checked_ts=now)
    return MatchResult("waiting", message=f"waiting for {describe(condition)}", checked_ts=now)


def poll_once(
    catalog: CheckpointCatalog,
    condition: CheckpointCondition,
    *,
    wait_started_ts: float,
    deadline_ts: float | None = None,
    clock: Callable[[], float] = time.time,
) -> MatchResult:
    """:func:`find_match` now, with the error policy every waiter shares.

    An unreachable endpoint (after the storage's own retries) is transient: the result
    is ``waiting`` (or ``timeout`` past the deadline) and the next poll tries again. Any
    other airflow-ckpt error (corrupt manifest, bucket missing, access denied, bad URI)
    is permanent: the result is ``failed`` with the error's message.
    """
    now = clock()
    try:
        return find_match(catalog, condition, now=now, wait_started_ts=wait_started_ts,
                          deadline_ts=deadline_ts)
    except EndpointUnreachableError as exc:
        log.warning("checkpoint storage unreachable, will retry: %s", exc)
        if deadline_ts is not None and now >= deadline_ts:
            return MatchResult("timeout", message=f"storage unreachable until the deadline: "
                                                  f"{exc}", checked_ts=now)
        return MatchResult("waiting", message=f"storage unreachable: {exc}", checked_ts=now)
    except AirflowCkptError as exc:
        return MatchResult("failed", message=f"{type(exc).__name__}: {exc}", checked_ts=now)


def wait_for_match(
    catalog: CheckpointCatalog,
    condition: CheckpointCondition,
    *,
    poll_interval: float,
    wait_started_ts: float,
    deadline_ts: float | None = None,
    until_ts: float | None = None,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> MatchResult:
    """Poll (blocking) until the result is no longer ``waiting``.

    With ``until_ts`` the wait is a brief one: once a check made at or after
    ``until_ts`` is still ``waiting``, that ``waiting`` result is returned (the caller
    then waits elsewhere, e.g. defers to the triggerer). A check is always made at
    ``until_ts`` itself, so an answer present by then is never missed.
    """
    while True:
        result = poll_once(catalog, condition, wait_started_ts=wait_started_ts,
                           deadline_ts=deadline_ts, clock=clock)
        if result.status != "waiting":
            return result
        if until_ts is not None and result.checked_ts >= until_ts:
            return result
        pause = poll_interval
        for end in (deadline_ts, until_ts):
            if end is not None:
                pause = max(0.0, min(pause, end - clock()))
        sleep(pause)


def describe(condition: CheckpointCondition) -> str:
    """A human description of ``condition`` for logs and messages."""
    if condition.request_id is not None:
        return f"the savepoint answering request {condition.request_id} of job {condition.job!r}"
    what = {"checkpoint": "a completed checkpoint", "savepoint": "a completed savepoint",
            "any": "a completed checkpoint or savepoint"}[condition.kind]
    parts = [f"{what} of job {condition.job!r}"]
    if condition.after_checkpoint_id is not None or condition.known_savepoints is not None:
        parts.append("newer than the baseline")
    if condition.min_checkpoint_id is not None:
        parts.append(f"with id >= {condition.min_checkpoint_id}")
    if condition.healthy_interval_s is not None:
        parts.append(f"while healthy (newest checkpoint within {condition.healthy_multiple:g} x "
                     f"{condition.healthy_interval_s:g} s)")
    return " ".join(parts)
