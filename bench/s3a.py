"""``python -m bench.s3a [--quick]``: Spark's working directory on ``s3a://`` vs on the
local disk, in one run, and what a checkpoint capture by server-side COPY would cost.
Results: ``bench/results/s3a.json``. Needs ``hadoop-aws`` and the AWS SDK v2 bundle
(~690 MB, fetched once by ``python -m airflow_ckpt.testing.jars --s3a``).

One real query (local Spark, ``local[2]``): a keyed aggregation over Parquet files
(``maxFilesPerTrigger=1``, one batch per file) in RocksDB state with changelog
checkpointing (what the examples use), the sink ``noop``, trigger ``availableNow``.
Batch 0 loads ``--keys`` keys, each with a random ``--pad``-byte value kept in state
(the state size); every later batch updates ``--updates`` random keys. The same query
runs in one process with ``checkpointLocation`` on a local directory and on
``s3a://`` (``--repeats`` runs of each, in alternating order, each from a fresh
location) against moto's S3 server in its own process
(:func:`~airflow_ckpt.testing.s3_server.s3_server_process`), which notes every request
it receives (:func:`~airflow_ckpt.testing.s3_server.drain_request_log`): what S3A sends,
counted at the endpoint, attributed to the batch whose progress event follows it.
Every run's state is read back (Spark's ``statestore`` source) and checked against the
input's ground truth.

Then, on the files the S3A run left in the bucket, the capture of its last batch:

* **today** (:class:`~airflow_ckpt.runtime.workdir.hadoop.HadoopWorkdir`, what the
  runtime does with a working directory on any Hadoop ``FileSystem``): S3A lists the
  tree and GETs each file of the batch into local staging;
* **by server-side COPY** (boto3 ``copy_object`` against the same endpoint,
  ``COPY_THREADS`` at once): every file of the batch (a full checkpoint), and only the
  files new since the previous batch's capture (incremental), plus the GETs that the
  manifest's SHA-256 of those new files would need.

Restore's install (``HadoopWorkdir.replace_with``: ``copyFromLocalFile`` beside the
working directory, then a rename) is not measured: against moto, S3A's file upload
fails (the AWS SDK v2 sends ``Expect: 100-continue`` and reports moto's answer as an
error with status 100; ``fs.s3a.connection.expect.continue=false`` did not change it).

moto on 127.0.0.1 has no network latency and copies in memory, so the request counts
are what AWS would bill while the times are a lower bound of what S3 takes (tens of ms
per request).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from airflow_ckpt.examples.job_setup import ROCKSDB
from airflow_ckpt.runtime.checkpoint.snapshot import hidden, wanted
from airflow_ckpt.runtime.workdir.hadoop import COPY_THREADS, HadoopWorkdir
from airflow_ckpt.testing.jars import hadoop_aws
from airflow_ckpt.testing.request_count import kind_of
from airflow_ckpt.testing.s3_server import (
    LoggedRequest,
    S3Endpoint,
    drain_request_log,
    s3_server_process,
)
from bench.requests import DAY_S, PRICE_PER_1000, cost_per_day
from bench.suites import Row, paired_spread, table, write_report

RESULTS = Path(__file__).resolve().parent / "results" / "s3a.json"
BUCKET = "airflow-ckpt-s3a"
#: the batch interval the per-day figures assume (a 10 s processing-time trigger)
BATCH_EVERY_S = 10.0
#: the checkpoint interval the per-day capture figures assume
CHECKPOINT_EVERY_S = 60.0
#: Spark's top-level entries of a checkpoint location, for attributing requests
_AREAS = ("offsets", "commits", "state", "sources", "metadata")


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.s3a",
                                description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small state, few batches")
    p.add_argument("--keys", type=int, help="keys in state (default 400,000; quick 20,000)")
    p.add_argument("--pad", type=int, help="bytes of each key's value (default 256)")
    p.add_argument("--updates", type=int,
                   help="keys updated per batch (default 20,000; quick 2,000)")
    p.add_argument("--batches", type=int, help="batches after the load (default 12; quick 6)")
    p.add_argument("--partitions", type=int,
                   help="shuffle (state store) partitions (default 8; quick 4)")
    p.add_argument("--repeats", type=int,
                   help="runs of each side, in alternating order (default 2; quick 1)")
    p.add_argument("--out", type=Path, default=RESULTS, help="where to write the JSON")
    args = p.parse_args(argv)
    args.keys = args.keys or (20_000 if args.quick else 400_000)
    args.pad = args.pad or 256
    args.updates = args.updates or (2_000 if args.quick else 20_000)
    args.batches = args.batches or (6 if args.quick else 12)
    args.partitions = args.partitions or (4 if args.quick else 8)
    args.repeats = args.repeats or (1 if args.quick else 2)
    return args


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def area_of(path: str, prefix: str) -> str:
    """Which part of a checkpoint location ``/bucket/<prefix>/...`` a request touched
    (``offsets``, ``commits``, ``state``, ``sources``, ``metadata``), else ``other``."""
    rel = path.lstrip("/").removeprefix(prefix.strip("/")).lstrip("/")
    top = rel.split("/", 1)[0]
    return top if top in _AREAS else "other"


def spark_session(endpoint: S3Endpoint, partitions: int) -> Any:
    """Local Spark with S3A on the class path and pointed at ``endpoint``."""
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master("local[2]").appName("airflow-ckpt-bench-s3a")
        .config("spark.jars", ",".join(str(p) for p in hadoop_aws().classpath()))
        .config("spark.driver.memory", "3g")
        .config("spark.sql.shuffle.partitions", str(partitions))
        .config("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
        .config("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled",
                "true")
        .config("spark.sql.streaming.numRecentProgressUpdates", "1000")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
    )
    for key, value in endpoint.s3a_conf().items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def write_input(spark: Any, root: Path, keys: int, pad: int, updates: int,
                batches: int) -> Path:
    """``in/f-000`` with every key, then one file per batch of ``updates`` random keys;
    each row a random ``pad``-character value (hex: LZ4 cannot shrink it much)."""
    from pyspark.sql import functions as F

    parts = max(1, pad // 32)
    value = F.substring(F.concat_ws("", *[F.md5(F.concat(F.col("id").cast("string"),
                                                         F.lit(f"-{i}-"), F.rand()))
                                          for i in range(parts + 1)]), 1, pad)
    directory = root / "in"
    for n in range(batches + 1):
        rows = (spark.range(keys) if n == 0 else
                spark.range(updates).select((F.rand(n) * keys).cast("long").alias("id")))
        (rows.select(F.col("id").alias("k"), value.alias("v"))
         .coalesce(1).write.parquet(str(directory / f"f-{n:03d}")))
    return directory


def run_query(spark: Any, input_dir: Path, location: str, endpoint_url: str | None
              ) -> dict[str, Any]:
    """Run the query to the end of its input with ``checkpointLocation=location``; per
    batch its durations and (with ``endpoint_url``) the requests the endpoint received
    before the batch's progress event."""
    from pyspark.sql import functions as F
    from pyspark.sql.streaming import StreamingQueryListener

    per_batch: dict[int, list[LoggedRequest]] = {}

    class Drain(StreamingQueryListener):
        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            if endpoint_url is not None:
                per_batch[event.progress.batchId] = drain_request_log(endpoint_url)

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            pass

    schema = "k long, v string"
    stream = (spark.readStream.schema(schema).option("maxFilesPerTrigger", 1)
              .option("recursiveFileLookup", "true").parquet(str(input_dir)))
    counts = stream.groupBy("k").agg(F.count("*").alias("n"), F.max("v").alias("v"))
    listener = Drain()
    spark.streams.addListener(listener)
    if endpoint_url is not None:
        drain_request_log(endpoint_url)
    started = time.perf_counter()
    try:
        query = (counts.writeStream.format("noop").outputMode("update")
                 .option("checkpointLocation", location).trigger(availableNow=True).start())
        query.awaitTermination()
        wall_s = time.perf_counter() - started
        progress = [p for p in query.recentProgress if p["numInputRows"] > 0]
    finally:
        spark.streams.removeListener(listener)
    if endpoint_url is not None:  # after the last event: the rest is the last batch's
        per_batch.setdefault(progress[-1]["batchId"], []).extend(
            drain_request_log(endpoint_url))
    batches = [{"batch": p["batchId"], "rows": p["numInputRows"],
                "ms": p["durationMs"], "state": p["stateOperators"][0]}
               for p in progress]
    return {"wall_s": wall_s, "batches": batches,
            "requests": {b: [(r.operation, r.path, r.body_bytes) for r in rs]
                         for b, rs in per_batch.items()}}


def check_state(spark: Any, location: str, keys: int, rows: int) -> str | None:
    """None if the query's state holds every key and ``rows`` counted rows; else why
    not (the statestore source reads the state the checkpoint location holds)."""
    state = spark.read.format("statestore").load(location).select("key", "value.*")
    counted = state.columns[1]  # count(*)'s buffer: the first aggregate's
    got = state.selectExpr("count(*) AS keys", f"sum(`{counted}`) AS rows").first()
    if (got["keys"], got["rows"]) != (keys, rows):
        return f"{location}: state has {got['keys']} keys, {got['rows']} rows; " \
               f"expected {keys}, {rows}"
    return None


def batch_files(client: Any, prefix: str, batch: int) -> dict[str, int]:
    """The files of the snapshot of ``batch`` under ``prefix`` (what a capture takes,
    :func:`~airflow_ckpt.runtime.checkpoint.snapshot.wanted`), by key: their sizes."""
    found: dict[str, int] = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET,
                                                                  Prefix=prefix + "/"):
        for item in page.get("Contents", []):
            if item["Key"].endswith("/"):
                continue  # a directory marker S3A made, not a file
            parts = tuple(item["Key"][len(prefix) + 1:].split("/"))
            if any(p.startswith(".") for p in parts[:-1]) or hidden(parts[-1]):
                continue
            if wanted(parts, batch)[0]:
                found[item["Key"]] = item["Size"]
    return found


def _parallel(fn: Any, items: Sequence[Any]) -> float:
    """Seconds to apply ``fn`` to every item, :data:`COPY_THREADS` at once."""
    started = time.perf_counter()
    with ThreadPoolExecutor(max(1, min(COPY_THREADS, len(items)))) as pool:
        list(pool.map(fn, items))
    return time.perf_counter() - started


def measure_captures(spark: Any, endpoint: S3Endpoint, prefix: str, batch: int,
                     root: Path) -> dict[str, Any]:
    """The capture of ``batch`` from the bucket: today's (S3A list + GET to local), and
    by server-side COPY (full and incremental), with the GETs hashing needs."""
    out: dict[str, Any] = {}
    drain_request_log(endpoint.url)
    workdir = HadoopWorkdir.of(spark, f"s3a://{BUCKET}/{prefix}", root / "hadoop")
    started = time.perf_counter()
    captured = workdir.capture(batch, root / "staging")
    out["today"] = {"s": time.perf_counter() - started, "files": len(captured.files),
                    "bytes": sum(f.size for f in captured.files),
                    "requests": _by_operation(drain_request_log(endpoint.url))}
    client = endpoint.client()
    try:
        files = batch_files(client, prefix, batch)
        before = batch_files(client, prefix, batch - 1)
        listed = drain_request_log(endpoint.url)
        out["differ"] = sorted({k[len(prefix) + 1:] for k in files}
                               ^ {f.path for f in captured.files})
        new = {k: s for k, s in files.items() if before.get(k) != s}
        for name, chosen in (("copy full", files), ("copy incremental", new)):
            keys = sorted(chosen)
            seconds = _parallel(lambda key, n=name: client.copy_object(
                Bucket=BUCKET, Key=f"_capture/{n.replace(' ', '-')}/{key}",
                CopySource={"Bucket": BUCKET, "Key": key}), keys)
            out[name] = {"s": seconds, "files": len(keys), "bytes": sum(chosen.values()),
                         "requests": _by_operation(drain_request_log(endpoint.url))}
        seconds = _parallel(lambda key: client.get_object(Bucket=BUCKET, Key=key)["Body"]
                            .read(), sorted(new))
        out["hash new files (GET)"] = {
            "s": seconds, "files": len(new), "bytes": sum(new.values()),
            "requests": _by_operation(drain_request_log(endpoint.url))}
        out["listing"] = {"requests": _by_operation(listed), "s": None, "files": 0,
                          "bytes": 0}
    finally:
        client.close()
    return out


def _by_operation(requests: Sequence[LoggedRequest]) -> dict[str, int]:
    return dict(Counter(r.operation for r in requests))


def request_summary(runs: Sequence[dict[str, Any]], key: str) -> dict[str, Any]:
    """Requests per batch of ``key`` (``steady`` or ``first``) over the S3A ``runs``:
    by operation, by billing kind, by area, bytes sent."""
    rows: list[tuple[str, str, int]] = []
    counts: list[int] = []
    areas: Counter[str] = Counter()
    for run in runs:
        batches = run[key] if key == "steady" else [run[key]]
        for batch in batches:
            sent = run["requests"].get(batch["batch"], [])
            rows.extend(sent)
            counts.append(len(sent))
            areas.update(area_of(r[1], f"{BUCKET}/{run['prefix']}") for r in sent)
    n = max(1, len(counts))
    return {
        "per_batch": len(rows) / n,
        "by_operation": {k: v / n for k, v in Counter(r[0] for r in rows).most_common()},
        "by_kind": {k: v / n for k, v in Counter(kind_of(r[0]) for r in rows).most_common()},
        "by_area": {k: v / n for k, v in areas.most_common()},
        "bytes_sent_per_batch": sum(r[2] for r in rows) / n,
        "per_batch_each": counts,
    }


def per_day(per_event: dict[str, float], every_s: float) -> tuple[float, float]:
    """(requests, USD) a day for ``per_event`` requests by billing kind, once per
    ``every_s`` seconds."""
    events = DAY_S / every_s
    counts = Counter({k: round(v * events) for k, v in per_event.items()})
    return float(sum(counts.values())), cost_per_day(counts)


def _kinds(by_operation: dict[str, int]) -> dict[str, float]:
    kinds: dict[str, float] = {}
    for operation, n in by_operation.items():
        kinds[kind_of(operation)] = kinds.get(kind_of(operation), 0.0) + n
    return kinds


def _median_ms(batches: Iterable[dict[str, Any]], key: str) -> float:
    return statistics.median(b["ms"].get(key, 0) for b in batches)


def rows(local: Sequence[dict[str, Any]], s3a: Sequence[dict[str, Any]]) -> list[Row]:
    """Medians over every steady batch of every repeat; the spread of the repeats'
    medians paired by repeat."""
    def row(metric: str, key: str, part: str = "steady") -> Row:
        def medians(runs: Sequence[dict[str, Any]]) -> list[float]:
            return [_median_ms(r[part] if part == "steady" else [r[part]], key) for r in runs]

        def over(runs: Sequence[dict[str, Any]]) -> float:
            return _median_ms([b for r in runs for b in (
                r[part] if part == "steady" else [r[part]])], key)

        return Row("s3a", metric, "ms", "local", over(local), "s3a", over(s3a),
                   paired_spread(medians(s3a), medians(local)))

    return [row("batch (triggerExecution)", "triggerExecution"),
            row("batch: addBatch", "addBatch"),
            row("batch: walCommit", "walCommit"),
            row("batch: commitOffsets", "commitOffsets"),
            row("load batch 0", "triggerExecution", "first")]


def _state_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in (directory / "state").rglob("*") if p.is_file())


def run_both(spark: Any, endpoint: S3Endpoint, root: Path, input_dir: Path,
             args: argparse.Namespace, wrong: list[str]) -> dict[str, list[dict[str, Any]]]:
    """``--repeats`` runs of the query on each side, in alternating order, each from a
    fresh checkpoint location; each run's state checked against the ground truth."""
    expected_rows = args.keys + args.batches * args.updates
    runs: dict[str, list[dict[str, Any]]] = {"local": [], "s3a": []}
    for repeat in range(args.repeats):
        prefix = f"q-{os.urandom(3).hex()}"
        sides = [("local", str(root / f"work-{repeat}"), None),
                 ("s3a", f"s3a://{BUCKET}/{prefix}", endpoint.url)]
        for side, location, url in sides if repeat % 2 == 0 else reversed(sides):
            run = run_query(spark, input_dir, location, url)
            run.update(prefix=prefix, location=location, first=run["batches"][0],
                       steady=run["batches"][1:])
            if (why := check_state(spark, location, args.keys, expected_rows)):
                wrong.append(why)
            runs[side].append(run)
            _log(f"repeat {repeat} {side}: {len(run['batches'])} batches in "
                 f"{run['wall_s']:.1f} s")
    return runs


def report(args: argparse.Namespace, runs: dict[str, list[dict[str, Any]]],
           captures: dict[str, Any], state_bytes: int) -> dict[str, Any]:
    """Print the figures; the JSON document of them."""
    requests = request_summary(runs["s3a"], "steady")
    load = request_summary(runs["s3a"], "first")
    batch_day = per_day(requests["by_kind"], BATCH_EVERY_S)
    copy_day = per_day(_kinds(captures["copy incremental"]["requests"]), CHECKPOINT_EVERY_S)
    table_rows = rows(runs["local"], runs["s3a"])
    print(f"\nS3A vs local checkpointLocation: RocksDB state {state_bytes / 1e6:.1f} MB on "
          f"disk ({args.keys} keys x {args.pad} B), {args.partitions} partitions, "
          f"{args.batches} batches of {args.updates} updates, {args.repeats} repeats, "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    print(table(table_rows))
    print(f"\nS3 requests per batch (S3A, counted at the endpoint): "
          f"{requests['per_batch']:.0f} (each: {requests['per_batch_each']}); "
          f"loading batch: {load['per_batch']:.0f}")
    print("  by operation: " + ", ".join(f"{k} {v:.1f}" for k, v in
                                         requests["by_operation"].items()))
    print("  by area: " + ", ".join(f"{k} {v:.1f}" for k, v in requests["by_area"].items()))
    print(f"  bytes sent per batch: {requests['bytes_sent_per_batch'] / 1e6:.2f} MB")
    print(f"  a batch every {BATCH_EVERY_S:.0f} s: {batch_day[0]:,.0f} requests/day, "
          f"${batch_day[1]:.2f}/day (prices per 1,000: {PRICE_PER_1000})")
    print("\ncapture of the last batch of the last S3A run, from the bucket:")
    for name, c in captures.items():
        if name == "differ":
            print(f"  files that only one of today's capture and the COPY set took: {c}")
            continue
        seconds = "" if c["s"] is None else f"{c['s'] * 1000:.0f} ms, "
        print(f"  {name:<22} {seconds}{c['files']} files, {c['bytes'] / 1e6:.2f} MB, "
              f"requests {c['requests']}")
    print(f"  incremental COPY capture every {CHECKPOINT_EVERY_S:.0f} s: "
          f"{copy_day[0]:,.0f} requests/day, ${copy_day[1]:.2f}/day")
    return {"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "state_bytes_local": state_bytes, "load_avg": os.getloadavg()[0],
            "runs": {side: [{k: v for k, v in run.items() if k != "requests"} for run in rs]
                     for side, rs in runs.items()},
            "s3a_requests": {"steady": requests, "load": load},
            "per_day": {"batches": batch_day, "incremental_copy_capture": copy_day,
                        "batch_every_s": BATCH_EVERY_S,
                        "checkpoint_every_s": CHECKPOINT_EVERY_S},
            "captures": captures, "rows": [r.to_dict() for r in table_rows]}


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    wrong: list[str] = []
    with tempfile.TemporaryDirectory(prefix="airflow-ckpt-bench-s3a-") as tmp, \
            s3_server_process(serialize_writes=False, log_requests=True) as server:
        root = Path(tmp)
        endpoint = server.endpoint
        endpoint.create_bucket(BUCKET)
        spark = spark_session(endpoint, args.partitions)
        try:
            input_dir = write_input(spark, root, args.keys, args.pad, args.updates,
                                    args.batches)
            _log(f"input written: {args.keys} keys x {args.pad} B, {args.batches} batches "
                 f"of {args.updates} updates, {args.partitions} partitions")
            runs = run_both(spark, endpoint, root, input_dir, args, wrong)
            last = runs["s3a"][-1]
            captures = measure_captures(spark, endpoint, last["prefix"],
                                        last["batches"][-1]["batch"], root)
        finally:
            spark.stop()
        state_bytes = _state_bytes(root / "work-0")
    document = report(args, runs, captures, state_bytes)
    return write_report(args.out, json.loads(json.dumps(document, default=str)), wrong)


if __name__ == "__main__":
    raise SystemExit(main())
