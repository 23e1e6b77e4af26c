"""``python -m bench.year [--quick] [--server moto|seaweedfs]``: a year-old job root against
a fresh one (issue 26).

On a local S3 endpoint (moto in its own process, or SeaweedFS's ``weed mini``) it builds
the job root a year of running leaves: hourly savepoints (8,760), answered control
requests (20,000), history events (500,000, compacted into segments with a raw tail, as
the driver leaves them: the checkpoint statistics beyond the default compaction's
``retain_checkpoint_events`` dropped, unless ``--no-history-retention``), checkpoint ids
past two million and a lease record reserving them; and a fresh job root (no savepoint or
request, 20 events; the same two retained checkpoints and lease record). Savepoints and
requests are stored server side on moto (``bulk_load``), by PUTs on SeaweedFS, the
history's segments by HTTP; building is timed apart from the steps. Then, for each root in
the same run, every HTTP request counted at the boto3 client (pages and retries included)
and the seconds of each S3 call by area and kind; both roots are built before either is
measured and the repeated steps alternate between them (:func:`interleaved`), so that
both meet the server in the same state and the same minutes' load (measured one after
the other, the fresh root on an almost empty server and the old one after its drain,
quick runs on SeaweedFS put the steady answer at 0.56x to 10.6x the fresh one's):

* **start-up**: what a driver does before its first checkpoint: the lease claim with its
  adoption, ``restore(latest)`` (materialised) and the checkpoint store's recovery;
* **answer**: a new savepoint request answered: the driver's look at ``control/``, the
  answer; the year-old root's first look also deletes answered requests (at most 200
  a look; the objects were stored now, so the driver's storage clock is set a year on)
  and is shown apart, then the steady look after the backlog drained;
* **history page**: the newest 50 events (the UI's page); the fresh job has run an
  hour (a raw tail of 20 events, as the year-old one).

Goal: the year-old root within 1.2x of the fresh one.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

from airflow_ckpt.runtime.checkpoint.catalog import CheckpointCatalog
from airflow_ckpt.runtime.checkpoint.metadata import FileEntry, Manifest, OperatorInfo, Timings
from airflow_ckpt.runtime.checkpoint.savepoint_history import IN_HISTORY
from airflow_ckpt.runtime.checkpoint.store import CompletedCheckpointStore
from airflow_ckpt.runtime.control.channel import ControlChannel, ControlRequest, ControlResult
from airflow_ckpt.runtime.history.journal import DEFAULT_COMPACTION, JobHistory
from airflow_ckpt.runtime.history.reader import HistoryReader
from airflow_ckpt.runtime.lease.holder import JobLease
from airflow_ckpt.runtime.lease.record import LeaseRecord, lease_key
from airflow_ckpt.runtime.restore.choose import restore
from airflow_ckpt.runtime.storage import CheckpointStorage
from airflow_ckpt.runtime.storage.layout import JobLayout
from airflow_ckpt.testing.request_count import RequestCounter, area_of, kind_of
from airflow_ckpt.testing.s3_server import S3Endpoint, s3_server_process, seaweedfs_server
from bench.history import put_compacted, story

BUCKET = "airflow-ckpt-year"
JOB = "orders"
YEAR_S = 366 * 86400.0
#: a year of hourly savepoints, answered requests, history events (the issue's figures)
FULL = {"savepoints": 8760, "requests": 20_000, "events": 500_000}
QUICK = {"savepoints": 876, "requests": 2_000, "events": 20_000}
GOAL = 1.2
#: raw (not yet compacted) history events: a compaction runs every 50 appends
RAW_TAIL = 20


def _manifest(job: str, checkpoint_id: int, savepoint_id: str | None,
              files: tuple[FileEntry, ...], completed_ts: float) -> Manifest:
    return Manifest(
        job=job, checkpoint_id=checkpoint_id,
        kind="savepoint" if savepoint_id else "checkpoint",
        trigger="periodic", batch_id=checkpoint_id, spark_version="4.2.0",
        query_id="q-year", mode="EXACTLY_ONCE",
        source_offsets=[{"source": 0, "end": checkpoint_id}], operators=(OperatorInfo(0, 4),),
        files=files, state_size=sum(f.size for f in files),
        checkpointed_size=sum(f.size for f in files), num_subtasks=4,
        num_acknowledged_subtasks=4,
        timings=Timings(completed_ts - 1, completed_ts - 1, completed_ts, 0, 10, 990, 1000),
        savepoint_id=savepoint_id, extra={IN_HISTORY: True} if savepoint_id else {},
    )


def year_objects(job: str, savepoints: int, requests: int, first_id: int,
                 now: float) -> list[tuple[str, bytes]]:
    """The savepoints (``_metadata`` only: nothing at start-up may need more) and the
    answered requests of a year, as bucket keys relative to the storage root."""
    layout = JobLayout(job)
    out: list[tuple[str, bytes]] = []
    for n in range(savepoints):
        checkpoint_id = first_id - 1 - 240 * (savepoints - n)  # one an hour: ids between
        sp = f"periodic-{checkpoint_id}"
        out.append((layout.savepoint_metadata(sp),
                    _manifest(job, checkpoint_id, sp, (), now - YEAR_S + 3600 * n).to_json()))
    for n in range(requests):
        created = now - YEAR_S + n * (YEAR_S / max(requests, 1))
        request_id = f"{int(created * 1000):013d}-{n:08x}"
        out.append((layout.control_request(request_id),
                    ControlRequest(request_id, "savepoint", created, created + 600).to_json()))
        answer = ControlResult(request_id, "completed", created + 10)
        out.append((layout.control_result(request_id), json.dumps(asdict(answer)).encode()))
    return out


def base_root(storage: CheckpointStorage, job: str, first_id: int) -> None:
    """What both roots hold: two retained checkpoints (one small file each) and the
    released lease record of their driver, reserving ids up to ``first_id + 100``."""
    layout = JobLayout(job)
    for n in (first_id, first_id + 1):
        data = f"v1\n{{\"batch\": {n}}}\n".encode()
        key = layout.checkpoint_file(n, "offsets/0")
        storage.put_bytes(key, data)
        entry = FileEntry(path="offsets/0", key=key[len(layout.root):], size=len(data),
                          sha256=hashlib.sha256(data).hexdigest(), shared=False)
        storage.put_bytes(layout.checkpoint_metadata(n),
                          _manifest(job, n, None, (entry,), time.time()).to_json(),
                          create_only=True)
    record = LeaseRecord(9, "run-year", "host", 1, 0.0, 0.0, released=True,
                         adopted=(), first_id=first_id, id_limit=first_id + 100)
    storage.put_bytes(lease_key(layout.lease_prefix, 9), record.to_json())


def start_up(storage: CheckpointStorage, job: str, workdir: Path) -> None:
    """Lease claim with adoption, restore(latest), the store's recovery (then release)."""
    lease = JobLease(storage, job, "run-bench")
    record = lease.acquire(adopt=CheckpointCatalog(storage, job).adopt)
    try:
        restore(storage, job, "latest", workdir, JobHistory(storage, job, compaction=None))
        CompletedCheckpointStore(storage, job, num_retained=2, epoch=record.epoch).recover()
    finally:
        lease.release()


def answer_one(storage: CheckpointStorage, driver: ControlChannel, storage_now: float) -> None:
    """A request written, found by the driver's look, answered."""
    request = ControlChannel(storage, driver.layout.job).request_savepoint(timeout_s=600)
    found = [r for r in driver.look(time.monotonic(), storage_now=storage_now)
             if r.request_id == request.request_id]
    assert found, "the driver did not find the request"
    driver.answer(ControlResult(request.request_id, "completed", time.time()))


class RequestTimer:
    """The seconds of every S3 call a storage makes (botocore's ``before-call`` to
    ``after-call``: the request, its response and its parsing), summed by
    ``area kind`` (:func:`~airflow_ckpt.testing.request_count.area_of`), and the keys
    its listings returned: which request of a step costs its time (a history segment's
    area is ``segment``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.seconds: Counter[str] = Counter()
        self.listed: Counter[str] = Counter()

    def attach(self, storage: CheckpointStorage) -> None:
        events = storage._client.meta.events  # type: ignore[attr-defined]  # S3Storage's
        events.register("before-parameter-build.s3", self._key)
        events.register("before-call.s3", self._before)
        events.register("after-call.s3", self._after)
        events.register("after-call-error.s3", self._after)

    @staticmethod
    def _key(context: dict[str, Any], params: dict[str, Any], **_: Any) -> None:
        objects = params.get("Delete", {}).get("Objects") or [{}]
        context["bench_key"] = (params.get("Key") or params.get("Prefix")
                                or objects[0].get("Key", ""))

    @staticmethod
    def _before(context: dict[str, Any], **_: Any) -> None:
        context["bench_started"] = time.perf_counter()

    def _after(self, context: dict[str, Any], event_name: str, parsed: Any = None,
               **_: Any) -> None:
        key = context.get("bench_key", "")
        area = "segment" if "/history/segments/" in key else area_of(key)
        name = f"{area} {kind_of(event_name.rsplit('.', 1)[-1])}"
        with self._lock:
            self.seconds[name] += time.perf_counter() - context["bench_started"]
            if isinstance(parsed, dict) and "KeyCount" in parsed:
                self.listed[name] += parsed["KeyCount"]

    def snapshot(self) -> tuple[Counter[str], Counter[str]]:
        with self._lock:
            return Counter(self.seconds), Counter(self.listed)


Run = tuple[float, Counter[str], dict[str, float], dict[str, int]]


def _call(counter: RequestCounter, fn: Callable[[], Any], timer: RequestTimer | None) -> Run:
    """One call of ``fn``: its seconds, requests by kind, and (with ``timer``) the
    seconds of its S3 calls and the keys its listings returned by ``area kind``."""
    before, started = counter.counts(), time.perf_counter()
    timed_before, listed_before = timer.snapshot() if timer else (Counter(), Counter())
    fn()
    seconds = time.perf_counter() - started
    timed, listed = timer.snapshot() if timer else (Counter(), Counter())
    by_kind: Counter[str] = Counter()
    for (_area, kind), n in (counter.counts() - before).items():
        by_kind[kind] += n
    return (seconds, by_kind, {k: round(v, 4) for k, v in (timed - timed_before).items()},
            dict(listed - listed_before))


def _summary(runs: list[Run]) -> dict[str, Any]:
    """Requests (by kind, of the first call), seconds (the median, each listed) and the
    median call's S3 seconds and listed keys."""
    first = runs[0][1]
    middle = sorted(runs, key=lambda run: run[0])[len(runs) // 2]
    return {"requests": sum(first.values()),
            "seconds": round(statistics.median(s for s, *_ in runs), 3),
            "seconds_each": [round(s, 3) for s, *_ in runs],
            "requests_each": [sum(k.values()) for _, k, *_ in runs], "by_kind": dict(first),
            "call_seconds": middle[2], "keys_listed": middle[3]}


def measured(counter: RequestCounter, fn: Callable[[], Any], repeats: int = 1,
             timer: RequestTimer | None = None) -> dict[str, Any]:
    """``repeats`` calls of ``fn`` in a row (see :func:`_summary`)."""
    return _summary([_call(counter, fn, timer) for _ in range(repeats)])


def interleaved(steps: dict[str, tuple[RequestCounter, Callable[[], Any], RequestTimer]],
                repeats: int) -> dict[str, dict[str, Any]]:
    """Each of ``steps`` (by root) called ``repeats`` times, the roots alternating and
    their order swapped every round: both see the server in the same state (what one
    root's building or draining left it doing), and the load of the same minutes."""
    runs: dict[str, list[Run]] = {name: [] for name in steps}
    for r in range(repeats):
        for name in (list(steps) if r % 2 == 0 else list(reversed(steps))):
            counter, fn, timer = steps[name]
            runs[name].append(_call(counter, fn, timer))
    return {name: _summary(found) for name, found in runs.items()}


#: the S3 servers a run can use; moto is the default
SERVERS = ("moto", "seaweedfs")
#: a bulk loader: stores (key, bytes) pairs in a bucket, however the server allows
Loader = Callable[[str, Sequence[tuple[str, bytes]]], object]


@contextmanager
def year_server(name: str) -> Iterator[tuple[S3Endpoint, Loader]]:
    """The S3 server ``name`` runs while in the block, and how it stores the year's
    objects: moto in its own process, straight into its backend (no HTTP); SeaweedFS
    (``weed mini``, the tests' second server) by PUTs from a pool of threads."""
    if name == "moto":
        with s3_server_process(serialize_writes=False) as server:
            yield server.endpoint, server.bulk_load
    elif name == "seaweedfs":
        with seaweedfs_server() as endpoint:
            yield endpoint, lambda bucket, objects: _put_all(endpoint, bucket, objects)
    else:
        raise ValueError(f"server {name!r}: expected one of {', '.join(SERVERS)}")


def _put_all(endpoint: S3Endpoint, bucket: str, objects: Sequence[tuple[str, bytes]],
             threads: int = 10) -> None:
    client = endpoint.client()  # botocore's pool: 10 connections
    try:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(lambda o: client.put_object(Bucket=bucket, Key=o[0], Body=o[1]),
                          objects))
    finally:
        client.close()


def run(sizes: dict[str, int], server: str = "moto", repeats: int = 3,
        retention: bool = True) -> dict[str, Any]:
    """Both roots built on ``server``, then measured: each step but the first answer
    (once by nature) timed ``repeats`` times, the two roots alternating
    (:func:`interleaved`); the history's checkpoint statistics kept as the default
    compaction keeps them (``retention``) or all of them."""
    report: dict[str, Any] = {"sizes": sizes, "server": server, "repeats": repeats,
                              "history_retention": retention,
                              "loadavg_1m": {"before": round(os.getloadavg()[0], 2)}}
    now = time.time()
    first_id = 2_000_000
    later = now + YEAR_S  # the driver's storage clock: a year after the objects were stored
    with year_server(server) as (endpoint, load), tempfile.TemporaryDirectory() as tmp:
        roots: dict[str, tuple[CheckpointStorage, RequestCounter, RequestTimer,
                               ControlChannel]] = {}
        for name in ("fresh", "year"):  # both built before either is measured
            bucket = f"{BUCKET}-{name}"
            endpoint.create_bucket(bucket)
            storage = endpoint.storage(f"s3://{bucket}/root", max_workers=16)
            base_root(storage, JOB, first_id)
            started = time.perf_counter()
            if name == "year":
                load(bucket, [(f"root/{k}", v) for k, v in year_objects(
                    JOB, sizes["savepoints"], sizes["requests"], first_id, now)])
            # the fresh job ran an hour: its history is a raw tail as long as the old one's
            events = story(JOB, sizes["events"] if name == "year" else RAW_TAIL,
                           int((now - YEAR_S) * 1000))
            put_compacted(JobHistory(storage, JOB, compaction=None), events, RAW_TAIL, 16,
                          DEFAULT_COMPACTION.retain_checkpoint_events if retention else None)
            report[f"build_{name}_s"] = round(time.perf_counter() - started, 1)
            counter, timer = RequestCounter(), RequestTimer()
            counter.attach(storage)
            timer.attach(storage)
            roots[name] = (storage, counter, timer, ControlChannel(storage, JOB))
            report[name] = {}
        for step, result in interleaved({name: (c, lambda s=s, n=name: start_up(
                s, JOB, Path(tmp) / n), t) for name, (s, c, t, _) in roots.items()},
                repeats).items():
            report[step]["start_up"] = result
        for name, (storage, counter, _, driver) in roots.items():
            report[name]["first_answer"] = measured(counter, lambda s=storage, d=driver:
                                                    answer_one(s, d, later))
            started = time.perf_counter()
            while len(storage.list(JobLayout(JOB).control_prefix)) > 400:
                driver.look(time.monotonic(), storage_now=later)  # drain the backlog
            report[f"drain_{name}_s"] = round(time.perf_counter() - started, 1)
        for step, fn in (("answer", lambda s, d: answer_one(s, d, later)),
                         ("history_page", lambda s, d: HistoryReader(s, JOB).newest(50))):
            for name, result in interleaved({name: (c, lambda s=s, d=d, f=fn: f(s, d), t)
                                             for name, (s, c, t, d) in roots.items()},
                                            repeats).items():
                report[name][step] = result
        for storage, *_ in roots.values():
            storage.close()
    report["loadavg_1m"]["after"] = round(os.getloadavg()[0], 2)
    return report


def table(report: dict[str, Any]) -> list[str]:
    lines = [f"year-old job root ({report['sizes']}) vs fresh on {report['server']}, same run "
             f"(goal <= {GOAL}x; seconds: median of {report['repeats']}); built in "
             f"{report['build_year_s']} s (fresh {report['build_fresh_s']} s), old answers "
             f"drained in {report['drain_year_s']} s; history retention "
             f"{report.get('history_retention', True)}; "
             f"load average {report['loadavg_1m']}",
             f"{'step':<14} {'fresh req':>9} {'year req':>9} {'ratio':>6} "
             f"{'fresh s':>8} {'year s':>8} {'ratio':>6}"]
    for step in ("start_up", "first_answer", "answer", "history_page"):
        f, y = report["fresh"][step], report["year"][step]
        lines.append(f"{step:<14} {f['requests']:>9} {y['requests']:>9} "
                     f"{y['requests'] / max(f['requests'], 1):>6.2f} {f['seconds']:>8.3f} "
                     f"{y['seconds']:>8.3f} {y['seconds'] / max(f['seconds'], 1e-9):>6.2f}")
    lines.append("seconds of the S3 calls by area and kind (keys listed), the median call, "
                 "fresh / year-old:")
    for step in ("answer", "history_page"):
        f, y = report["fresh"][step], report["year"][step]
        for name in sorted(set(f["call_seconds"]) | set(y["call_seconds"])):
            lines.append(
                f"  {step:<13} {name:<14} {f['call_seconds'].get(name, 0):>7.4f} "
                f"({f['keys_listed'].get(name, 0)}) / {y['call_seconds'].get(name, 0):>7.4f} "
                f"({y['keys_listed'].get(name, 0)})")
    return lines


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.year", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help=f"a tenth of a year's objects {QUICK}")
    p.add_argument("--server", choices=SERVERS, default="moto",
                   help="the S3 server (seaweedfs: scripts/build_seaweedfs.sh's weed binary, "
                   "built on first use)")
    p.add_argument("--repeats", type=int, default=3,
                   help="timed calls of each repeatable step (seconds: their median)")
    p.add_argument("--no-history-retention", dest="retention", action="store_false",
                   help="keep every checkpoint statistic in the year-old history (the "
                   "compaction's retain_checkpoint_events=None) instead of the newest "
                   f"{DEFAULT_COMPACTION.retain_checkpoint_events:,} (the default)")
    p.add_argument("--out", type=Path, help="also write the JSON report here")
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error("--repeats must be >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    report = run(QUICK if args.quick else FULL, args.server, args.repeats, args.retention)
    print("\n".join(table(report)))
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
