"""``python -m bench history``: what a job page and the restart log cost on a long history.

A job that has run for a long time at a 10 s checkpoint interval (``--events``, default
100,000 history events: about 11.5 days) is written twice to a real S3 endpoint (moto's
server, in its own process; one bucket per job, as moto lists a whole bucket per page):

* ``legacy-job``: every event its own object, as before compaction existed;
* ``compacted-job``: the same events as :meth:`JobHistory.compact` leaves them (segments
  written by the same code the compaction uses, no retention, so the *worst* case), plus
  a raw tail of the newest ``--raw-tail`` events not compacted yet.

Writing 100,000 objects with HTTP PUTs takes about 10 minutes on 2 busy cores (the rate
of a 1,000-event sample is printed), so the rest of the legacy job is stored straight
into the server's moto backend: the same bytes ``JobHistory.append`` PUTs, read back
over HTTP like any object.

Measured in the same run, requests counted with a boto3 ``before-send`` hook on the
client the storage uses:

1. **job page**: the old read path (the plugin's former ``read_history``: list the whole
   ``history/`` prefix, GET the newest 1,000 events, then the checkpoint statistics) on
   ``legacy-job`` vs :func:`airflow_ckpt.plugins.overview.job_view` (all the new page
   shows: health, lease, summary, charts) on ``compacted-job``; then the new page again
   with a warm :class:`EventCache` (the api-server keeps one per storage);
2. **restart log, incremental refresh** (a supervisor polling after a failure): the old
   ``RestartLog.refresh`` (list the whole prefix, read what is new) vs the new one
   (``StartAfter`` the cursor);
3. **compaction cost**: :meth:`JobHistory.compact` over ``--compact-events`` raw events
   (requests and time per event).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from airflow_ckpt.plugins import overview
from airflow_ckpt.runtime.history import events as ev
from airflow_ckpt.runtime.history.events import HistoryEvent, stream_of
from airflow_ckpt.runtime.history.journal import CompactionPolicy, JobHistory
from airflow_ckpt.runtime.history.reader import EventCache
from airflow_ckpt.runtime.storage.base import CheckpointStorage
from airflow_ckpt.runtime.storage.layout import JobLayout
from airflow_ckpt.testing.s3_server import s3_server_process
from bench.suites import Row, table

BUCKET = "airflow-ckpt-bench-history"
RESULTS = Path(__file__).resolve().parent / "results" / "history.json"
PAGE_LIMIT = 1000  # the plugin's default history_limit
INTERVAL_MS = 10_000
RUN_ID = "stream_dag/scheduled__2026-01-01/run"


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench history", description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=100_000, help="history events per job")
    p.add_argument("--raw-tail", type=int, default=20,
                   help="newest events left raw in the compacted job (not compacted yet)")
    p.add_argument("--compact-events", type=int, default=2_000,
                   help="raw events one measured compaction folds")
    p.add_argument("--threads", type=int, default=16, help="parallel PUTs while writing")
    p.add_argument("--repeats", type=int, default=3,
                   help="measurements of each new read path (median reported)")
    p.add_argument("--legacy-repeats", type=int, default=1,
                   help="measurements of each legacy read path: each lists the whole "
                        "history (moto serves ~1 page of 1,000 keys per second here)")
    p.add_argument("--out", type=Path, default=RESULTS, help="where to write the JSON")
    return p.parse_args(argv)


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- S3 server


class RequestCounter:
    """Counts S3 API calls a storage's boto3 client sends, by operation."""

    def __init__(self, storage: CheckpointStorage) -> None:
        self.calls: Counter[str] = Counter()
        client = storage._client  # type: ignore[attr-defined]  # the bench measures it
        client.meta.events.register("before-send.s3.*", self._count)

    def _count(self, event_name: str, **_: Any) -> None:
        self.calls[event_name.rsplit(".", 1)[-1]] += 1

    @contextmanager
    def measure(self) -> Iterator[dict[str, Any]]:
        result: dict[str, Any] = {}
        self.calls.clear()
        started = time.perf_counter()
        yield result
        result["seconds"] = time.perf_counter() - started
        result["requests"] = sum(self.calls.values())
        result["by_operation"] = dict(self.calls)


# --------------------------------------------------------------------------- the story


def story(job: str, n: int, start_ms: int) -> list[HistoryEvent]:
    """``n`` events of one long Airflow run: a submit and a start, then a checkpoint
    every 10 s, a failed checkpoint every 500, a query failure + restart every 5,000."""
    layout = JobLayout(job)
    out: list[HistoryEvent] = []
    ms = start_ms

    def add(event_type: str, **data: Any) -> None:
        nonlocal ms
        ms += 1
        body = {"type": event_type, "ts": ms / 1000, "job": job, **data}
        out.append(HistoryEvent(event_type, ms / 1000,
                                layout.history_event(len(out) + 1), body))

    add(ev.JOB_SUBMITTED, run_id=RUN_ID, attempt=1, restore="latest", master="local[2]",
        airflow={"dag_id": "stream_dag", "run_id": "scheduled__2026-01-01", "task_id": "run"})
    add(ev.JOB_STARTED, run_id=RUN_ID, attempt=1, spark_version="4.2.0", restore="latest",
        checkpoint_config={"execution.checkpointing.interval": "10 s"})
    checkpoint = 0
    while len(out) < n:
        ms += INTERVAL_MS
        checkpoint += 1
        if checkpoint % 5000 == 0:
            add(ev.FAILURE, level="query", run_id=RUN_ID, cause="executor lost", attempt=1)
            add(ev.RESTART, level="query", run_id=RUN_ID, strategy="fixed-delay", restart=True,
                delay_s=1.0, attempt=checkpoint // 5000, strategy_state={}, cause="lost")
            add(ev.RESTORED, path=f"s3://b/{job}/chk-{checkpoint - 1}", kind="checkpoint",
                checkpoint_id=checkpoint - 1, batch_id=checkpoint * 3, from_job=job)
        elif checkpoint % 500 == 0:
            add(ev.CHECKPOINT_FAILED, id=checkpoint, status="FAILED", is_savepoint=False,
                trigger="periodic", trigger_timestamp=ms, failure_message="upload timed out")
        else:
            e2e = 900 + (checkpoint * 37) % 700
            add(ev.CHECKPOINT_COMPLETED, id=checkpoint, status="COMPLETED", is_savepoint=False,
                trigger="periodic", batch_id=checkpoint * 3, trigger_timestamp=ms - e2e,
                latest_ack_timestamp=ms, state_size=50_000_000 + checkpoint * 10,
                checkpointed_size=2_000_000 + (checkpoint * 7919) % 500_000,
                end_to_end_duration=e2e, start_delay=120, sync_duration=15,
                async_duration=e2e - 135, num_subtasks=17, num_acknowledged_subtasks=17,
                failure_message=None, path=f"s3://b/{job}/chk-{checkpoint}")
    return out[:n]


def put_raw(storage: CheckpointStorage, events: Sequence[HistoryEvent], threads: int) -> float:
    """Write each event as its own object (what ``JobHistory.append`` writes); events/s."""
    started = time.perf_counter()

    def put(event: HistoryEvent) -> None:
        storage.put_bytes(event.key, json.dumps(event.data).encode())

    with ThreadPoolExecutor(threads) as pool:
        for done, _ in enumerate(pool.map(put, events), 1):
            if done % 20_000 == 0:
                rate = done / (time.perf_counter() - started)
                _log(f"  {done} raw events written ({rate:.0f}/s)")
    return len(events) / (time.perf_counter() - started)


def put_compacted(history: JobHistory, events: Sequence[HistoryEvent], raw_tail: int,
                  threads: int, retain_checkpoint_events: int | None = None) -> None:
    """The events as compaction leaves them: segments per stream, plus a raw tail; with
    ``retain_checkpoint_events`` (the compaction's retention), only the newest segments
    of the ``checkpoints`` stream that hold that many (as compaction drops them)."""
    segment_events = CompactionPolicy().segment_events
    old, tail = events[: len(events) - raw_tail], events[len(events) - raw_tail:]
    sealed = old[-1].seq if old else 0  # every segment seals up to the last compacted
    for stream in ("checkpoints", "events"):
        mine = [e for e in old if stream_of(e.type) == stream]
        chunks = [mine[i:i + segment_events] for i in range(0, len(mine), segment_events)]
        if stream == "checkpoints" and retain_checkpoint_events is not None:
            kept = 0
            for index in range(len(chunks) - 1, -1, -1):  # newest first, as compaction
                if kept >= retain_checkpoint_events:
                    chunks = chunks[index + 1:]
                    break
                kept += len(chunks[index])
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(history._write_segment, [stream] * len(chunks), chunks,
                          [sealed] * len(chunks)))
    put_raw(history.storage, tail, threads)


# ------------------------------------------------------------------------ the old path


def legacy_read_history(storage: CheckpointStorage, job: str, limit: int) -> overview.HistoryWindow:
    """The plugin's ``read_history`` before compaction (verbatim logic): list the whole
    prefix, GET the newest ``limit`` objects one by one."""
    prefix = JobLayout(job).history_prefix
    keys = [info.key for info in storage.list(prefix) if info.key.endswith(".json")]
    window = keys[-limit:] if limit > 0 else keys
    out = overview.HistoryWindow(job, [], total=len(keys), read=len(window))
    for key in window:
        body = json.loads(storage.get_bytes(key))
        out.events.append(HistoryEvent(str(body["type"]), float(body["ts"]), key, body))
    return out


def legacy_page(storage: CheckpointStorage, job: str) -> None:
    window = legacy_read_history(storage, job, PAGE_LIMIT)
    stats = overview.checkpoint_stats(storage, job, window)
    overview.timeline(window)
    assert stats["counts"]["total"] > 0


def legacy_refresh(storage: CheckpointStorage, job: str, cursor: str) -> str:
    """The old ``RestartLog.refresh`` after its first read: list everything, read the new."""
    keys = [i.key for i in storage.list(JobLayout(job).history_prefix) if i.key.endswith(".json")]
    for key in keys:
        if key > cursor:
            json.loads(storage.get_bytes(key))
    return max(keys[-1], cursor)


# ---------------------------------------------------------------------------- measuring


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def measure(counter: RequestCounter, fn: Callable[[], Any], repeats: int) -> dict[str, Any]:
    runs = []
    for _ in range(repeats):
        with counter.measure() as result:
            fn()
        runs.append(result)
    return {"seconds": _median([r["seconds"] for r in runs]),
            "requests": _median([r["requests"] for r in runs]),
            "by_operation": runs[-1]["by_operation"], "runs": len(runs)}


ROOT = "root"  # the storage prefix inside each bucket


def _raw_objects(events: Sequence[HistoryEvent]) -> list[tuple[str, bytes]]:
    """Exactly the objects ``JobHistory.append`` writes for these events (bucket keys)."""
    return [(f"{ROOT}/{e.key}", json.dumps(e.data, default=str).encode()) for e in events]


def run(args: argparse.Namespace) -> tuple[list[Row], dict[str, Any]]:
    rows: list[Row] = []
    report: dict[str, Any] = {}
    with s3_server_process(serialize_writes=False) as server:
        endpoint = server.endpoint
        stores: dict[str, CheckpointStorage] = {}
        counters: dict[str, RequestCounter] = {}
        for name in ("legacy", "compacted", "backlog"):  # one bucket each, as separate
            bucket = f"{BUCKET}-{name}"                  # jobs: moto lists per bucket
            endpoint.create_bucket(bucket)
            stores[name] = endpoint.storage(f"s3://{bucket}/{ROOT}",
                                            max_workers=args.threads)
            counters[name] = RequestCounter(stores[name])
        start_ms = int(time.time() * 1000) - args.events * INTERVAL_MS - 60_000
        legacy_events = story("legacy-job", args.events, start_ms)
        compacted_events = story("compacted-job", args.events, start_ms)

        # writing: HTTP PUTs for a sample (their rate), the rest server side
        sample = min(1000, args.events)
        http_rate = put_raw(stores["legacy"], legacy_events[:sample], args.threads)
        _log(f"HTTP PUT, {args.threads} threads: {http_rate:.0f} events/s; "
             f"{args.events} would take {args.events / http_rate:.0f} s: bulk-loading the rest")
        load_rate = server.bulk_load(f"{BUCKET}-legacy",
                                     _raw_objects(legacy_events[sample:]))
        report["write_raw"] = {"events": args.events, "http_put_events_per_s": http_rate,
                               "bulk_load_events_per_s": load_rate}
        started = time.perf_counter()
        compacted = JobHistory(stores["compacted"], "compacted-job", compaction=None)
        put_compacted(compacted, compacted_events, args.raw_tail, args.threads)
        listing = compacted.listing()
        report["write_compacted"] = {"seconds": time.perf_counter() - started,
                                     "segments": len(listing.segments), "raw": len(listing.raw)}
        _log(f"compacted-job: {len(listing.segments)} segments + {len(listing.raw)} raw "
             f"written over HTTP in {time.perf_counter() - started:.1f} s")

        legacy, new = stores["legacy"], stores["compacted"]
        old = measure(counters["legacy"], lambda: legacy_page(legacy, "legacy-job"),
                      args.legacy_repeats)
        _log(f"legacy page view: {old['seconds']:.2f} s, {old['requests']} requests")
        fresh = measure(counters["compacted"], lambda: overview.job_view(
            new, "compacted-job", limit=PAGE_LIMIT), args.repeats)
        cache = EventCache()
        overview.job_view(new, "compacted-job", limit=PAGE_LIMIT, cache=cache)
        warm = measure(counters["compacted"], lambda: overview.job_view(
            new, "compacted-job", limit=PAGE_LIMIT, cache=cache), args.repeats)
        report["job_page"] = {"legacy": old, "new": fresh, "new_warm_cache": warm}
        for metric, unit, key in (("page view time", "s", "seconds"),
                                  ("page view requests", "req", "requests")):
            rows.append(Row("job_page", metric, unit, "legacy/raw", old[key],
                            "new/compacted", fresh[key]))
            rows.append(Row("job_page", metric + " (warm)", unit, "legacy/raw", old[key],
                            "new/cached", warm[key]))

        # restart log: positioned at the newest event; one failure later, refresh
        from airflow_ckpt.runtime.history.restart_log import RestartLog

        legacy_cursor = legacy_events[-1].key
        JobHistory(legacy, "legacy-job", compaction=None).append(
            ev.FAILURE, level="driver", run_id=RUN_ID, cause="bench")
        history = JobHistory(new, "compacted-job", compaction=None)
        restart_log = RestartLog(history, {"restart-strategy.type": "fixed-delay"}, RUN_ID)
        first = measure(counters["compacted"], restart_log.refresh, 1)
        # written by another process (the driver), so the refresh has to fetch it
        JobHistory(new, "compacted-job", compaction=None).append(
            ev.FAILURE, level="driver", run_id=RUN_ID, cause="bench")
        old_refresh = measure(counters["legacy"], lambda: legacy_refresh(
            legacy, "legacy-job", legacy_cursor), 1)
        new_refresh = measure(counters["compacted"], restart_log.refresh, 1)  # as legacy: 1 new
        report["restart_log"] = {"legacy_refresh": old_refresh, "new_refresh": new_refresh,
                                 "new_first_read": first}
        for metric, unit, key in (("refresh time", "s", "seconds"),
                                  ("refresh requests", "req", "requests")):
            rows.append(Row("restart_log", metric, unit, "legacy/list all", old_refresh[key],
                            "StartAfter", new_refresh[key]))

        # compaction of a raw backlog (as a driver's first compaction after an upgrade)
        backlog = story("backlog-job", args.compact_events, start_ms)
        server.bulk_load(f"{BUCKET}-backlog", _raw_objects(backlog))
        target = JobHistory(stores["backlog"], "backlog-job", compaction=None)
        with counters["backlog"].measure() as compaction:
            result = target.compact()
        compaction["result"] = {"compacted": result.compacted,
                                "segments_written": result.segments_written}
        compaction["requests_per_event"] = compaction["requests"] / max(result.compacted, 1)
        compaction["ms_per_event"] = compaction["seconds"] * 1000 / max(result.compacted, 1)
        report["compaction"] = compaction
        # the steady state: the driver compacts every 50 of its own appends (it wrote them,
        # so it reads none back) into the open segment it wrote last
        writer = JobHistory(stores["backlog"], "backlog-job",
                            compaction=CompactionPolicy(every=0))
        for i in range(50):
            writer.append(ev.CHECKPOINT_COMPLETED, id=10_000 + i)
        writer.compact()  # writes the open segment this writer then holds
        for i in range(50):
            writer.append(ev.CHECKPOINT_COMPLETED, id=20_000 + i)
        with counters["backlog"].measure() as steady:
            steady_result = writer.compact()
        steady["compacted"] = steady_result.compacted
        report["compaction_steady"] = steady
        for storage in stores.values():
            storage.close()
    return rows, report


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    load = os.getloadavg()[0]
    rows, report = run(args)
    elapsed = time.perf_counter() - started
    print(f"\nairflow-ckpt history benchmark: {args.events} events per job, "
          f"{os.cpu_count()} CPUs, {elapsed:.0f} s total, load average {load:.1f} before")
    # request-count ratios are small (1/40): four digits, values to the millisecond
    print(table(rows, ratio_digits=4, value=lambda v: f"{v:.3f}"))
    c = report["compaction"]
    print(f"compaction of a raw backlog: {c['result']['compacted']} events in "
          f"{c['seconds']:.2f} s, {c['requests']} requests ({c['requests_per_event']:.2f}/event, "
          f"{c['ms_per_event']:.2f} ms/event)")
    s = report["compaction_steady"]
    print(f"steady-state compaction by the writer: {s['compacted']} events in "
          f"{s['seconds'] * 1000:.0f} ms, {s['requests']} requests {s['by_operation']}")
    document = {"created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "elapsed_s": round(elapsed, 1),
                "settings": vars(args) | {"out": str(args.out)},
                "rows": [r.to_dict() for r in rows], "details": report}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=1, default=str) + "\n")
    print(f"\nwritten: {args.out}")
    return 0
