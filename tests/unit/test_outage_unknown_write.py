"""A write whose answer was lost stays unknown through the outage budget
(runtime/storage/outage.py): its repetition refused by the lease's gate (the lease
lapsed during the outage: nothing sent), or the budget spent on a plain unreachable
error after the lost answer, never turns it into a definite failure. Otherwise a
completion marker whose first copy landed was recorded FAILED (shared files released,
a failure counted) while a successor's claim-then-adopt counted it."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

import pytest

from airflow_ckpt.errors import (
    ConcurrentDriverError,
    EndpointUnreachableError,
    LeaseExpiredError,
    ObjectAlreadyExistsError,
    OutageOutcomeUnknownError,
    OutcomeUnknownError,
    StorageOutageError,
)
from airflow_ckpt.runtime.checkpoint.catalog import CheckpointCatalog
from airflow_ckpt.runtime.checkpoint.failures import CheckpointFailureReason
from airflow_ckpt.runtime.checkpoint.marker import write_marker
from airflow_ckpt.runtime.checkpoint.pending import PendingState
from airflow_ckpt.runtime.storage import CheckpointStorage, open_storage
from airflow_ckpt.runtime.storage.delegating import DelegatingStorage
from airflow_ckpt.runtime.storage.fenced import FencedStorage
from airflow_ckpt.runtime.storage.outage import OutageBudget, OutageRidingStorage
from tests.unit.test_coordinator_races import JOB, TTL, L, adopt, lease_for, start_fenced
from tests.unit.test_lease import FakeClock
from tests.unit.test_outage_budget import FakeTime
from tests.unit.test_snapshot_capture import make_workdir


def answers(*outcomes: Exception | str) -> Callable[[], str]:
    """A request whose n-th attempt raises ``outcomes[n]`` (or returns it)."""
    it = iter(outcomes)

    def call() -> str:
        outcome = next(it)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    return call


# ---------------------------------------------------------------------- the budget alone


@pytest.mark.parametrize("refusal", [
    LeaseExpiredError("no successful lease heartbeat for 90 s"),
    ConcurrentDriverError("another driver claimed the job"),
])
def test_a_write_whose_answer_was_lost_and_whose_repetition_is_refused_stays_unknown(
        refusal: Exception) -> None:
    t = FakeTime()
    budget = OutageBudget(60.0, clock=t.clock, sleep=t.sleep)
    lost = OutcomeUnknownError("connection reset after sending")
    with pytest.raises(OutcomeUnknownError) as raised:
        budget.call("PUT chk-3/_metadata", answers(lost, refusal), write=True)
    message = str(raised.value)
    assert "answer was lost (connection reset after sending)" in message, message
    assert f"repetition was refused: {type(refusal).__name__}: {refusal}" in message
    assert raised.value.__cause__ is refusal
    assert not isinstance(raised.value, StorageOutageError)  # the budget was not spent


def test_a_read_or_a_write_with_no_lost_answer_is_refused_as_it_is() -> None:
    """A read's later answer is the truth; a write refused after plain unreachable
    errors sent nothing that could have landed."""
    t = FakeTime()
    budget = OutageBudget(60.0, clock=t.clock, sleep=t.sleep)
    refusal = LeaseExpiredError("lapsed")
    with pytest.raises(LeaseExpiredError):
        budget.call("GET a", answers(OutcomeUnknownError("lost"), refusal))
    with pytest.raises(LeaseExpiredError):
        budget.call("PUT a", answers(EndpointUnreachableError("503"), refusal), write=True)


def test_a_conflict_after_a_lost_answer_is_evidence_and_raised_as_it_is() -> None:
    """storage/base.py's three outcomes: a create-only repetition that meets other
    bytes is a real conflict (our bytes would have been found: success)."""
    t = FakeTime()
    budget = OutageBudget(60.0, clock=t.clock, sleep=t.sleep)
    conflict = ObjectAlreadyExistsError("chk-3/_metadata exists")
    with pytest.raises(ObjectAlreadyExistsError):
        budget.call("PUT chk-3/_metadata", answers(OutcomeUnknownError("lost"), conflict),
                    write=True)
    assert budget.call("PUT b", answers(OutcomeUnknownError("lost"), "etag"),
                       write=True) == "etag"


def test_a_spent_budget_after_a_lost_answer_stays_unknown() -> None:
    """The last attempt is a plain 503; an earlier one's answer was lost: its copy may
    have landed, so the write is not a definite failure either."""
    t = FakeTime()
    budget = OutageBudget(10.0, clock=t.clock, sleep=t.sleep)
    first = [OutcomeUnknownError("connection reset after sending")]
    then = (EndpointUnreachableError(f"503 attempt {n}") for n in itertools.count(2))
    with pytest.raises(OutageOutcomeUnknownError) as raised:
        budget.call("PUT chk-3/_metadata",
                    answers(*first, *itertools.islice(then, 100)), write=True)
    assert "an earlier attempt's answer was lost: connection reset" in str(raised.value)
    # a read's spent budget is judged by its last attempt, as before
    reads = (OutcomeUnknownError("lost"), *(EndpointUnreachableError("503"),) * 100)
    with pytest.raises(StorageOutageError) as read:
        OutageBudget(10.0, clock=t.clock, sleep=t.sleep).call("GET a", answers(*reads))
    assert not isinstance(read.value, OutcomeUnknownError)


# ---------------------------------------------------------------------- the marker


class LostAnswer(DelegatingStorage):
    """``inner`` whose first put of ``key`` lands but its answer is lost."""

    def __init__(self, inner: CheckpointStorage, key: str) -> None:
        super().__init__(inner)
        self.key = key
        self.lost = 1

    def put_bytes(self, key: str, data: bytes, *, create_only: bool = False,
                  if_match: str | None = None) -> str:
        etag = self.inner.put_bytes(key, data, create_only=create_only, if_match=if_match)
        if key == self.key and self.lost:
            self.lost -= 1
            raise OutcomeUnknownError(f"answer of PUT {key} lost")
        return etag


def test_a_marker_whose_answer_was_lost_and_whose_repetition_the_gate_refuses_is_unknown(
        tmp_path: Path) -> None:
    """Before: ``LEASE_LOST`` (nothing written, the checkpoint FAILED) while the marker
    was in place."""
    inner = open_storage(tmp_path.as_uri())
    key = L.checkpoint_metadata(3)
    gates = itertools.count()

    def gate() -> None:  # the lease lapses during the outage's first wait
        if next(gates) > 0:
            raise LeaseExpiredError("no successful lease heartbeat (storage unreachable?)")

    t = FakeTime()
    storage = OutageRidingStorage(FencedStorage(LostAnswer(inner, key), gate),
                                  OutageBudget(60.0, clock=t.clock, sleep=t.sleep))
    failure = write_marker(storage, key, b"{}", job=JOB,
                           confirm=lambda: pytest.fail("confirmed an unknown marker"))
    assert failure is not None
    assert failure.reason is CheckpointFailureReason.MARKER_OUTCOME_UNKNOWN, failure
    assert "repetition was refused: LeaseExpiredError" in failure.message
    assert inner.get_bytes(key) == b"{}"  # it did land


def test_the_coordinator_abandons_a_marker_refused_after_its_answer_was_lost(
        tmp_path: Path) -> None:
    """The real coordinator and lease: the marker PUT lands, its answer is lost, the
    outage outlasts the lease's validity and the repetition is refused by the gate.
    The checkpoint is abandoned (neither failed nor completed, its shared files kept),
    and indeed a successor's claim-then-adopt counts its marker."""
    storage = open_storage((tmp_path / "s").as_uri())
    workdir = make_workdir(tmp_path, batches=4, running=False)
    clock = FakeClock()
    lease = lease_for(storage, clock, "old")
    lease.acquire(adopt=lambda prev: adopt(storage, prev))
    # the storage is down for longer than the lease's validity after the lost answer
    budget = OutageBudget(600.0, clock=clock, sleep=lambda s: clock.sleep(s + TTL))
    view = OutageRidingStorage(FencedStorage(LostAnswer(storage, L.checkpoint_metadata(1)),
                                             lease.gate), budget)
    coordinator = start_fenced(storage, workdir, lease, view)
    try:
        p = coordinator.trigger("manual")
        assert p.done.wait(10)
        assert p.state is PendingState.ABANDONED, (p.state, p.failure)
        assert isinstance(coordinator.fatal, OutcomeUnknownError), coordinator.fatal
        assert coordinator.failures.consecutive == 0  # no failure counted
        assert storage.exists(L.checkpoint_metadata(1))
        successor = lease_for(storage, clock, "new")
        record = successor.acquire(adopt=lambda prev: adopt(storage, prev))
        assert record.adopted == (1,)  # the marker counts: FAILED would have been a lie
        assert CheckpointCatalog(storage, JOB).checkpoint_ids(lease=record) == [1]
        successor.release()
    finally:
        coordinator.shutdown()
