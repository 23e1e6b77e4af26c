"""S3 storage and the CLI through a fault-injecting proxy (issue 20 items 1, 2, 6 and A).

Real botocore talks to :class:`FaultProxy` on 127.0.0.1, which forwards to the moto
server and injects one fault kind at a time where a test scripts it: 503 SlowDown, 500
before and after the request was applied, connection resets before and after, bodies
cut short, latency. What each test checks against the moto server directly (no proxy):
the stored bytes, so "done" means stored and "not done" means not stored.

The three-outcome rule: a storage request is done, not done, or unknown; an unknown
answer is settled by retries and by reading back, and never reported as a failure, a
success or another writer without evidence.
"""

from __future__ import annotations

import io
import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from airflow_ckpt.cli import main as cli_main
from airflow_ckpt.errors import (
    EndpointUnreachableError,
    ObjectAlreadyExistsError,
    ObjectNotFoundError,
    OutcomeUnknownError,
    PreconditionFailedError,
    StorageError,
)
from airflow_ckpt.runtime.history.events import CHECKPOINT_COMPLETED, JOB_STARTED
from airflow_ckpt.runtime.history.journal import JobHistory
from airflow_ckpt.runtime.storage.base import CheckpointStorage, etag_of
from airflow_ckpt.runtime.storage.s3_listing import PROBE_PREFIX
from airflow_ckpt.testing import S3Endpoint, local_s3_server
from airflow_ckpt.testing.faultproxy import Fault, FaultKind, FaultProxy, FaultSchedule
from tests.fixtures.snapshots import write_snapshot

K = FaultKind
#: every kind, latency kept short: each scripted fault hits the first matching request
ONE_SHOT = list(FaultKind)




def _through(proxy: FaultProxy, uri: str, **options: Any) -> CheckpointStorage:
    return S3Endpoint(url=proxy.url).storage(uri, **options)


@pytest.fixture
def faulty(proxy: FaultProxy, s3_uri: str) -> Iterator[CheckpointStorage]:
    """The root through the proxy (botocore's default 5 attempts), its conditional-write
    probe already done so that scripted faults meet the request under test."""
    storage = _through(proxy, s3_uri)
    storage.put_bytes("warm-up", b"w", create_only=True)
    yield storage
    storage.close()


def _fault(kind: FaultKind, method: str, target: str, **kw: Any) -> Fault:
    return Fault(kind, method, target, latency_s=0.2, cut_after=3, **kw)


# ------------------------------------------------------------------ each kind, each call

# (method of the faulted request, the call, what direct storage must hold afterwards)
Case = tuple[str, Callable[[CheckpointStorage, CheckpointStorage], None]]


def _put_plain(faulty: CheckpointStorage, direct: CheckpointStorage) -> None:
    direct.put_bytes("k", b"v1")
    assert faulty.put_bytes("k", b"v2") == etag_of(b"v2")
    assert direct.get_bytes("k") == b"v2"


def _put_create_only(faulty: CheckpointStorage, direct: CheckpointStorage) -> None:
    assert faulty.put_bytes("k", b"mine", create_only=True) == etag_of(b"mine")
    assert direct.get_bytes("k") == b"mine"


def _put_if_match(faulty: CheckpointStorage, direct: CheckpointStorage) -> None:
    old = direct.put_bytes("k", b"v1")
    assert faulty.put_bytes("k", b"v2", if_match=old) == etag_of(b"v2")
    assert direct.get_bytes("k") == b"v2"


def _get(faulty: CheckpointStorage, direct: CheckpointStorage) -> None:
    data = uuid.uuid4().bytes * 100
    direct.put_bytes("k", data)
    assert faulty.get_bytes("k") == data


def _stream(faulty: CheckpointStorage, direct: CheckpointStorage) -> None:
    data = bytes(range(256)) * 4096  # 1 MiB: the cut lands mid-body
    direct.put_bytes("k", data)
    with faulty.open_stream("k") as body:
        assert body.read() == data
    with faulty.open_stream("k", 1000, 5000) as body:
        assert body.read(5000) == data[1000:6000]


def _exists(faulty: CheckpointStorage, direct: CheckpointStorage) -> None:
    direct.put_bytes("k", b"x")
    assert faulty.exists("k")
    assert not faulty.exists("absent")


def _list(faulty: CheckpointStorage, direct: CheckpointStorage) -> None:
    for i in range(3):
        direct.put_bytes(f"d/{i}", b"x")
    assert [i.key for i in faulty.list("d/")] == ["d/0", "d/1", "d/2"]
    assert faulty.list_dirs("") == ["d"]


def _delete(faulty: CheckpointStorage, direct: CheckpointStorage) -> None:
    direct.put_bytes("d/1", b"x")
    direct.put_bytes("d/2", b"x")
    faulty.delete_many(["d/1", "d/2", "d/absent"])
    assert direct.list("d/") == []


CASES: dict[str, Case] = {
    "put": ("PUT", _put_plain),
    "put-create-only": ("PUT", _put_create_only),
    "put-if-match": ("PUT", _put_if_match),
    "get": ("GET", _get),
    "stream": ("GET", _stream),
    "exists": ("HEAD", _exists),
    "list": ("GET", _list),
    "delete": ("POST", _delete),
}


@pytest.mark.parametrize("kind", ONE_SHOT, ids=lambda k: k.value)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_each_call_survives_each_fault_kind(
    case: str, kind: FaultKind, proxy: FaultProxy, faulty: CheckpointStorage,
    direct: CheckpointStorage,
) -> None:
    """One fault of each kind on the call's request: the call returns the right answer
    and the storage holds exactly what it should. (On eea6d66 a cut GET body failed
    get_bytes and open_stream: botocore's retries end before the body is read.)"""
    method, call = CASES[case]
    proxy.script(_fault(kind, method, "/", count=1 if kind is K.LATENCY else 2))
    call(faulty, direct)
    assert proxy.pending_scripted() == []  # both faults met the call's requests


def test_a_cut_not_found_answer_is_read_again(
    proxy: FaultProxy, faulty: CheckpointStorage,
) -> None:
    """GetObject of an absent key whose 404 body is cut: botocore reads an error body
    outside its retries and raises urllib3's ProtocolError (found by ``make faults``:
    a sink's commit-decision read failed the commit step on d712e5f). It is read again:
    ObjectNotFoundError, the answer the caller branches on."""
    proxy.script(_fault(K.CUT_BODY, "GET", "/absent", count=2))
    with pytest.raises(ObjectNotFoundError):
        faulty.get_bytes("absent")
    assert proxy.pending_scripted() == []


# ------------------------------------------------------------------ three outcomes


def test_lost_create_answer_with_cut_read_back_is_done(
    proxy: FaultProxy, faulty: CheckpointStorage, direct: CheckpointStorage,
) -> None:
    """Item 1: the create-only PUT lands, its answer is lost, botocore's retry meets
    412 and the read-back GETs are cut short: the write is ours, so it is done."""
    proxy.script(_fault(K.RESET_AFTER, "PUT", "/_metadata"),
                 _fault(K.CUT_BODY, "GET", "/_metadata", count=2))
    assert faulty.put_bytes("chk-1/_metadata", b"ours", create_only=True) == etag_of(b"ours")
    assert direct.get_bytes("chk-1/_metadata") == b"ours"
    assert proxy.pending_scripted() == []


@pytest.mark.parametrize("lost", [K.RESET_AFTER, K.ERROR_AFTER, K.CUT_BODY],
                         ids=lambda k: k.value)
def test_applied_write_whose_retries_all_fail_is_done(
    lost: FaultKind, proxy: FaultProxy, faulty: CheckpointStorage,
    direct: CheckpointStorage,
) -> None:
    """The first attempt lands and its answer is lost, every retry is refused (503):
    the object holds our bytes, so the write is done, not a failure (eea6d66 raised
    StorageError SlowDown for a checkpoint marker that was stored)."""
    proxy.script(_fault(lost, "PUT", "/k"), _fault(K.SLOW_DOWN, "PUT", "/k", count=10))
    assert faulty.put_bytes("k", b"ours", create_only=True) == etag_of(b"ours")
    assert direct.get_bytes("k") == b"ours"


def test_unknown_when_the_read_back_never_succeeds(
    proxy: FaultProxy, faulty: CheckpointStorage, direct: CheckpointStorage,
) -> None:
    """Answer lost, and no read-back gets through: OutcomeUnknownError, which is
    neither "another writer" (ObjectAlreadyExistsError) nor a plain failure."""
    proxy.script(_fault(K.RESET_AFTER, "PUT", "/k"),
                 _fault(K.CUT_BODY, "GET", "/k", count=1000))
    with pytest.raises(OutcomeUnknownError) as info:
        faulty.put_bytes("k", b"ours", create_only=True)
    assert not isinstance(info.value, PreconditionFailedError)
    assert direct.get_bytes("k") == b"ours"  # it was in fact applied


def test_not_applied_is_not_done_and_not_unknown(
    proxy: FaultProxy, faulty: CheckpointStorage, direct: CheckpointStorage,
) -> None:
    """Every attempt refused before it reached the server, and the read-back finds no
    object: not done (a transient error), nothing stored."""
    proxy.script(_fault(K.RESET_BEFORE, "PUT", "/k", count=1000))
    with pytest.raises(EndpointUnreachableError) as info:
        faulty.put_bytes("k", b"ours", create_only=True)
    assert not isinstance(info.value, OutcomeUnknownError)
    assert not direct.exists("k")


def test_another_writers_bytes_are_evidence(
    proxy: FaultProxy, faulty: CheckpointStorage, direct: CheckpointStorage,
) -> None:
    """Another writer's object is there: after a lost answer too, the create-only write
    reports ObjectAlreadyExistsError and leaves it untouched."""
    direct.put_bytes("k", b"theirs", create_only=True)
    proxy.script(_fault(K.ERROR_BEFORE, "PUT", "/k"), _fault(K.CUT_BODY, "GET", "/k"))
    with pytest.raises(ObjectAlreadyExistsError):
        faulty.put_bytes("k", b"ours", create_only=True)
    assert direct.get_bytes("k") == b"theirs"


@pytest.mark.parametrize("lost", [K.RESET_AFTER, K.ERROR_AFTER], ids=lambda k: k.value)
def test_compare_and_swap_with_a_lost_answer(
    lost: FaultKind, proxy: FaultProxy, faulty: CheckpointStorage,
    direct: CheckpointStorage,
) -> None:
    """If-Match lands, answer lost, the retry meets 412 (the ETag moved on to ours):
    done. A stale ETag (another writer replaced it) stays PreconditionFailedError."""
    old = direct.put_bytes("k", b"v1")
    proxy.script(_fault(lost, "PUT", "/k"))
    assert faulty.put_bytes("k", b"v2", if_match=old) == etag_of(b"v2")
    assert direct.get_bytes("k") == b"v2"
    proxy.script(_fault(lost, "PUT", "/k"))
    with pytest.raises(PreconditionFailedError):
        faulty.put_bytes("k", b"v3", if_match=old)
    assert direct.get_bytes("k") == b"v2"


@pytest.mark.parametrize("lost", [K.RESET_AFTER, K.ERROR_AFTER], ids=lambda k: k.value)
def test_history_append_with_a_lost_answer_is_stored_once(
    lost: FaultKind, proxy: FaultProxy, faulty: CheckpointStorage,
    direct: CheckpointStorage,
) -> None:
    """Item 1, history: the event's create-only PUT lands, its answer is lost; the
    append succeeds and the event is stored once."""
    proxy.script(_fault(lost, "PUT", "/history/"))
    # no background compaction: a driver's first job_started starts one, whose writes
    # would race the bucket's teardown (it is not what this test is about)
    JobHistory(faulty, "j", compaction=None).append(JOB_STARTED, query="q")
    events = JobHistory(direct, "j").events()
    assert [e.type for e in events] == [JOB_STARTED]
    assert len(direct.list("j/history/")) == 1


# ------------------------------------------------------------------ the probe at start


@pytest.mark.parametrize("lost", [K.RESET_AFTER, K.ERROR_AFTER], ids=lambda k: k.value)
def test_conditional_write_probe_survives_a_lost_first_answer(
    lost: FaultKind, proxy: FaultProxy, s3_uri: str, direct: CheckpointStorage,
) -> None:
    """Item 2: the probe's first PUT lands and its answer is lost; botocore's retry
    meets 412. That is our own probe (its key is new): the endpoint honours
    If-None-Match and the create-only write goes on (eea6d66 raised StorageError
    PreconditionFailed, and the driver exited 1 before writing any history)."""
    proxy.script(_fault(lost, "PUT", PROBE_PREFIX))
    storage = _through(proxy, s3_uri)
    try:
        storage.put_bytes("first", b"x", create_only=True)
    finally:
        storage.close()
    assert [i.kind for i in proxy.injected] == [lost]
    assert direct.get_bytes("first") == b"x"


def test_probe_still_refuses_an_endpoint_that_ignores_if_none_match() -> None:
    """The same lost first answer in front of a server without conditional writes:
    the second probe PUT succeeds, so the storage still refuses create-only writes."""
    with local_s3_server(honour_if_none_match=False) as plain, FaultProxy(plain.url) as p:
        plain.create_bucket("no-conditional")
        p.script(_fault(K.RESET_AFTER, "PUT", PROBE_PREFIX))
        storage = _through(p, "s3://no-conditional/x")
        try:
            with pytest.raises(StorageError, match="ignores 'If-None-Match"):
                storage.put_bytes("first", b"x", create_only=True)
        finally:
            storage.close()


# ------------------------------------------------------------------ the CLI


@pytest.fixture
def cli_store(direct: CheckpointStorage) -> CheckpointStorage:
    for n in (1, 2, 3):
        write_snapshot(direct, "orders", n, contents={f"offsets/{n}": b"o" * n,
                                                      "state/0/0/1.delta": b"s" * 2048})
    history = JobHistory(direct, "orders")
    for n in range(25):
        history.append(CHECKPOINT_COMPLETED, id=n, batch_id=n)
    return direct


def _cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    return cli_main(list(argv), out=out), out.getvalue()


COMMANDS = [("jobs", "--json"), ("checkpoints", "orders", "--json"),
            ("history", "orders", "--json"), ("history", "orders")]


def test_cli_reads_through_faults_with_exact_output(
    cli_store: CheckpointStorage, proxy: FaultProxy, s3_endpoint: S3Endpoint,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Item 6: at 30 % faults on every request (no latency), every command exits 0 and
    prints exactly what it prints without faults (eea6d66: cut reads failed it)."""
    for name, value in s3_endpoint.env().items():
        monkeypatch.setenv(name, value)
    expected = {argv: _cli("--storage", cli_store.uri, *argv) for argv in COMMANDS}
    assert all(code == 0 for code, _ in expected.values())
    assert json.loads(expected[("history", "orders", "--json")][1])
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    for seed in range(2):
        proxy.set_schedule(FaultSchedule.uniform(0.3, seed, latency_share=0.0))
        for argv in COMMANDS:
            assert _cli("--storage", cli_store.uri, *argv) == expected[argv], (seed, argv)
    assert proxy.counts()[K.CUT_BODY] > 0
