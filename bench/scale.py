"""``python -m bench.scale [--quick]``: the realistic-scale suite (issue 9), one invocation,
every figure a ratio to a baseline measured in the same run. Results:
``bench/results/scale.json``.

* **RocksDB steady state** (:mod:`bench.steady`, benchmarks a-e): ``--keys`` keys (3M:
  ~130 MB of RocksDB state), batches touching 1 % of them, 5 s checkpoint interval,
  ``local[2]``: (a) throughput and per-batch p50/p99 vs plain Spark with its own
  ``checkpointLocation``; (b) uploaded bytes / state size per checkpoint, incremental vs
  full; (c) the runtime's upload path vs a raw boto3 pool, same files; (d) restore's
  download (``materialize``) vs a raw boto3 pool, same files, and vs the same pool
  hashing each file with SHA-256 as restore must, on the real RocksDB checkpoint and on
  ``--files`` x ``--file-mib`` synthetic files; (e) process start to first batch,
  restored vs fresh. A noise-floor row: the same plain run's CPU seconds, fastest vs
  slowest repeat.
* **exactly-once Parquet sink vs Spark's native parquet sink** (f): the same
  streaming query (``--sink-batches`` input files of ``--sink-rows`` rows), each variant
  in its own driver process on ``file://``, and a third variant that shows what any
  ``foreachBatch`` sink pays: ``foreachBatch`` + Spark's batch ``df.write.parquet``
  (at-least-once, what one writes by hand); wall time and peak RSS of the driver
  (Python + JVM), and the sink's own driver work per batch (row counts, fsync, the
  pre-commit record and the commit: :attr:`ParquetSink.last_stage`, Spark's write
  excluded). Output checked against the ground truth (row count and sum).

The S3 endpoint (moto) runs in its own process
(:func:`airflow_ckpt.testing.s3_server.s3_server_process`; with ``--https`` over TLS);
its CPU time is reported per run. Repeated variants run in alternating order; figures
are medians, printed with the lowest and highest ratio of the repeats paired by index.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.steady import (
    BUCKET,
    JOB,
    MiB,
    Steady,
    Workload,
    compare_download,
    compare_upload,
    figures,
)
from bench.suites import Row, paired_spread, table, write_report

RESULTS = Path(__file__).resolve().parent / "results" / "scale.json"


def restore_download(server: Any, work: Path, files: int, file_mib: int,
                     repeats: int) -> dict[str, Any]:
    """(d) on synthetic files: many mid-sized files, where per-request costs show."""
    from airflow_ckpt.runtime.checkpoint.metadata import FileEntry
    from airflow_ckpt.runtime.storage.layout import JobLayout
    from tests.fixtures.snapshots import make_manifest

    endpoint = server.endpoint
    storage = endpoint.storage(f"s3://{BUCKET}/synthetic")
    layout = JobLayout("job")
    entries = []
    for i in range(files):
        data = os.urandom(file_mib * MiB)
        path = f"state/0/{i % 4}/SSTs/{i:06d}.sst"
        key = layout.checkpoint_file(1, path)
        storage.put_bytes(key, data)
        entries.append(FileEntry(path, key[len(layout.root):], len(data),
                                 hashlib.sha256(data).hexdigest(), False))
    manifest = make_manifest("job", 1, files=tuple(entries), batch_id=0)
    try:
        return compare_download(endpoint, storage, manifest, layout.root, "synthetic/",
                                work, repeats)
    finally:
        storage.close()


def upload_synthetic(server: Any, work: Path, files: int, file_mib: int,
                     repeats: int) -> dict[str, Any]:
    """(c) on synthetic files (random bytes, the size of a large RocksDB checkpoint's
    SSTs): the upload paths against the raw pool at a chosen total size."""
    source = work / "upload-source"
    for i in range(files):
        path = source / "state" / "0" / str(i % 4) / "SSTs" / f"{i:06d}.sst"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(file_mib * MiB))
    try:
        return compare_upload(server.endpoint, source, repeats)
    finally:
        shutil.rmtree(source, ignore_errors=True)


# ---------------------------------------------------------------- sink comparison


def _sink_child(variant: str, input_dir: str, out_dir: str, chk_dir: str) -> None:
    """One driver process: run the query to completion with one sink variant."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from airflow_ckpt.runtime.sinks import ParquetSink

    spark = (SparkSession.builder.master("local[2]").appName(f"scale-{variant}")
             .config("spark.sql.shuffle.partitions", "4")
             .config("spark.ui.enabled", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    schema = "k long, v long"
    df = (spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(input_dir)
          .selectExpr("k", "v * 2 AS v2"))
    writer = df.writeStream.option("checkpointLocation", chk_dir).trigger(availableNow=True)
    own_ms: list[float] = []  # the sink's own driver work per batch (not Spark's write)
    if variant == "native":
        query = writer.format("parquet").option("path", out_dir).start()
    elif variant == "foreach_write":  # what a hand-written foreachBatch sink does
        query = writer.foreachBatch(
            lambda batch, _id: batch.write.mode("append").parquet(out_dir)).start()
    else:
        sink = ParquetSink(Path(out_dir).as_uri())

        def each(batch: Any, batch_id: int) -> None:
            sink.stage(batch, batch_id)
            started = time.perf_counter()
            sink.commit(batch_id)
            staged = sink.last_stage
            assert staged is not None
            own_ms.append(1000 * (staged.record_s + time.perf_counter() - started))

        query = writer.foreachBatch(each).start()
    query.awaitTermination()
    # per-batch durations (Spark's own progress events), for the steady-state figure
    batches = [p["durationMs"]["triggerExecution"] for p in
               sorted((json.loads(p.json) for p in query.recentProgress),
                      key=lambda p: p["batchId"])]
    Path(chk_dir + ".json").write_text(json.dumps({"batch_ms": batches, "own_ms": own_ms}))
    spark.stop()


def _driver_rss(pid: int) -> int:
    """The driver: the Python process plus its JVM (not the Python workers, which are
    the executors' in local mode)."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root] + [c for c in root.children(recursive=True) if "java" in c.name()]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            total += p.memory_info().rss
    return total


def sink_comparison(rows: int, batches: int, repeats: int) -> dict[str, Any]:
    import pyarrow as pa
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    work = Path(tempfile.mkdtemp(prefix="scale-sink-"))
    input_dir = work / "in"
    input_dir.mkdir()
    total_v = 0
    for b in range(batches):
        ks = pa.array(range(b * rows, (b + 1) * rows), pa.int64())
        pq.write_table(pa.table({"k": ks, "v": ks}), input_dir / f"part-{b:04d}.parquet")
        total_v += sum(range(b * rows, (b + 1) * rows))
    variants = ["native", "foreach_write", "parquet_sink"]
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    for r in range(repeats):
        for variant in variants if r % 2 == 0 else variants[::-1]:
            out, chk = work / f"out-{variant}-{r}", work / f"chk-{variant}-{r}"
            start = time.perf_counter()
            proc = subprocess.Popen([sys.executable, "-m", "bench.scale", "--sink-child",
                                     variant, str(input_dir), str(out), str(chk)])
            peak = 0
            while proc.poll() is None:
                peak = max(peak, _driver_rss(proc.pid))
                time.sleep(0.2)
            wall = time.perf_counter() - start
            if proc.returncode != 0:
                raise RuntimeError(f"{variant} run failed ({proc.returncode})")
            table = ds.dataset(str(out), format="parquet").to_table()
            ok = table.num_rows == rows * batches and \
                int(pa.compute.sum(table["v2"]).as_py()) == 2 * total_v
            child = json.loads(Path(str(chk) + ".json").read_text())
            batch_ms = child["batch_ms"]
            runs[variant].append({"wall_s": wall, "driver_rss_mb": peak / MiB, "ok": ok,
                                  "batch_ms": batch_ms, "own_ms": child["own_ms"],
                                  "after_first_s": sum(batch_ms[1:]) / 1000})
            if not ok:
                raise RuntimeError(f"{variant}: output differs from the ground truth")
    shutil.rmtree(work, ignore_errors=True)

    def med(variant: str, field: str) -> float:
        return statistics.median(x[field] for x in runs[variant])

    return {
        "rows_per_batch": rows, "batches": batches,
        "native_wall_s": med("native", "wall_s"), "sink_wall_s": med("parquet_sink", "wall_s"),
        "foreach_write_wall_s": med("foreach_write", "wall_s"),
        "foreach_write_after_first_s": med("foreach_write", "after_first_s"),
        "native_rss_mb": med("native", "driver_rss_mb"),
        "sink_rss_mb": med("parquet_sink", "driver_rss_mb"),
        "wall_ratio": med("parquet_sink", "wall_s") / med("native", "wall_s"),
        "native_after_first_s": med("native", "after_first_s"),
        "sink_after_first_s": med("parquet_sink", "after_first_s"),
        "after_first_ratio": med("parquet_sink", "after_first_s")
        / med("native", "after_first_s"),
        "rss_ratio": med("parquet_sink", "driver_rss_mb") / med("native", "driver_rss_mb"),
        # per batch after the 1st: native's whole batch vs the sink's own driver work
        "native_batch_ms": statistics.median(ms for r in runs["native"]
                                             for ms in r["batch_ms"][1:]),
        "sink_own_ms": statistics.median(ms for r in runs["parquet_sink"]
                                         for ms in r["own_ms"][1:]),
        "runs": runs,
    }


def steady_suite(server: Any, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Benchmarks a-e (see :mod:`bench.steady`)."""
    workload = Workload(args.keys, args.touched, args.rows, args.batches)
    steady = Steady(server, work, workload, args.full_batches)
    print(f"seed: {args.keys} keys ...", file=sys.stderr, flush=True)
    seed, manifest = steady.seed()
    if not seed.correct:
        raise RuntimeError("the seed run's output differs from the ground truth")
    seed_storage = steady.storage("seed")
    local_seed = work / "seed-local"
    download = compare_download(server.endpoint, seed_storage, manifest, f"{JOB}/", "seed/",
                                work, args.repeats_transfer, keep=local_seed)
    upload = compare_upload(server.endpoint, local_seed, args.repeats_transfer)
    seed_storage.close()
    seed_ckpt = seed.manifests[-1]
    runs = steady.measured(args.repeats, args.full, local_seed)
    out = figures(runs)
    out["seed"] = {"state_mb": manifest.state_size / MiB, "files": len(manifest.files),
                   "async_ms": seed_ckpt["async_ms"], "wall_s": seed.wall_s,
                   "checkpointed_mb": seed_ckpt["checkpointed_size"] / MiB}
    out["c_upload"] = upload
    out["d_restore_download"] = download
    out["workload"] = {"keys": args.keys, "touched": args.touched,
                       "touched_keys": workload.touched_keys, "rows_per_batch": args.rows,
                       "steady_batches": args.batches, "repeats": args.repeats}
    out["runs"] = [r.summary() for r in [seed, *runs]]
    out["wrong_output"] = [f"{r.variant}/{r.repeat}" for r in runs if not r.correct]
    return out


def _restore_rows(d: dict[str, Any]) -> list[Row]:
    """(d) against the raw download, and against the raw download that also hashes."""
    runs = d["runs"]
    return [Row("d restore", f"{d['bytes'] / MiB:.0f} MiB, {d['files']} files", "s",
                "raw boto3", d["raw_s"], "materialize", d["ours_s"],
                paired_spread(runs["ours"], runs["raw"])),
            Row("d restore", "the same, raw + SHA-256", "s", "raw + SHA-256",
                d["raw_sha256_s"], "materialize", d["ours_s"],
                paired_spread(runs["ours"], runs["raw_sha256"]))]


def _upload_rows(c: dict[str, Any]) -> list[Row]:
    """(c) against the raw upload: incremental (hashes, then sends) and full (hashes
    while sending)."""
    runs = c["runs"]
    rows = [Row("c upload", f"{c['bytes'] / MiB:.0f} MiB, {c['files']} files", "s",
                "raw boto3", c["raw_s"], "incremental", c["ours_s"],
                paired_spread(runs["ours"], runs["raw"])),
            Row("c upload", "the same, full checkpoint", "s", "raw boto3", c["raw_s"],
                "full (hash sending)", c["full_s"],
                paired_spread(runs["ours_full"], runs["raw"]))]
    reads = {name: statistics.median(x) for name, x in c.get("read_per_byte", {}).items()}
    if reads.get("raw"):  # bytes the client read per byte uploaded (Linux's rchar)
        rows += [Row("c upload", "bytes read / uploaded", "x", "raw boto3", reads["raw"],
                     subject, reads[name])
                 for name, subject in (("ours", "incremental"), ("ours_full", "full"))]
    return rows


def rows_of(out: dict[str, Any]) -> list[Row]:
    """The printed table."""
    rows: list[Row] = []
    if "steady" in out:
        s = out["steady"]
        a, e = s["a_steady_state"], s["e_first_batch"]
        pairs = a["paired_throughput_ratios"]
        rows += [
            Row("a steady", "rows/s after 1st batch", "1/s", "plain",
                a["plain_rows_per_s"], "checkpointed", a["ckpt_rows_per_s"],
                (min(pairs), max(pairs)) if len(pairs) >= 2 else None),
            Row("a steady", "batch p50", "ms", "plain", a["plain_p50_ms"],
                "checkpointed", a["ckpt_p50_ms"]),
            Row("a steady", "batch p99", "ms", "plain", a["plain_p99_ms"],
                "checkpointed", a["ckpt_p99_ms"]),
            Row("a steady", "CPU s, steady batches", "s", "plain",
                sum(a["plain_cpu_s"].values()), "checkpointed", sum(a["ckpt_cpu_s"].values())),
            Row("a steady", "process wall time", "s", "plain", a["plain_wall_s"],
                "checkpointed", a["ckpt_wall_s"]),
        ]
        noise = a.get("plain_cpu_s_by_repeat", [])
        if len(noise) >= 2:  # identical work: how much the machine's speed moves
            rows.append(Row("a noise", "plain CPU s, same work", "s", "fastest plain",
                            min(noise), "slowest plain", max(noise)))
        b = s["b_incremental_vs_full"]
        if "incremental" in b and "full" in b:
            rows += [
                Row("b upload", "uploaded/state per ckpt", "%", "incremental",
                    100 * b["incremental"]["uploaded_fraction_median"], "full",
                    100 * b["full"]["uploaded_fraction_median"]),
                Row("b upload", "uploaded per ckpt", "MiB", "incremental",
                    b["incremental"]["uploaded_mb_median"], "full",
                    b["full"]["uploaded_mb_median"]),
            ]
        rows += [
            *_upload_rows(s["c_upload"]),
            *_restore_rows(s["d_restore_download"]),
            Row("e start", "start -> 1st batch", "s", "fresh", e["fresh_s"], "restored",
                e["restored_s"]),
        ]
    if "upload" in out:
        rows += _upload_rows(out["upload"])
    if "restore_download" in out:
        rows += _restore_rows(out["restore_download"])
    if "sink" in out:
        k = out["sink"]

        def sink_spread(field: str, baseline: str = "native") -> tuple[float, float] | None:
            return paired_spread([r[field] for r in k["runs"]["parquet_sink"]],
                                 [r[field] for r in k["runs"][baseline]])

        rows += [Row("f sink", "wall time", "s", "native parquet", k["native_wall_s"],
                     "ParquetSink", k["sink_wall_s"], sink_spread("wall_s")),
                 Row("f sink", "batches after the 1st", "s", "native parquet",
                     k["native_after_first_s"], "ParquetSink", k["sink_after_first_s"],
                     sink_spread("after_first_s")),
                 Row("f sink", "wall time", "s", "foreachBatch",
                     k["foreach_write_wall_s"], "ParquetSink", k["sink_wall_s"],
                     sink_spread("wall_s", "foreach_write")),
                 Row("f sink", "batches after the 1st", "s", "foreachBatch",
                     k["foreach_write_after_first_s"], "ParquetSink", k["sink_after_first_s"],
                     sink_spread("after_first_s", "foreach_write")),
                 Row("f sink", "own work/batch, not Spark", "ms", "native batch",
                     k["native_batch_ms"], "ParquetSink", k["sink_own_ms"]),
                 Row("f sink", "driver RSS", "MiB", "native parquet", k["native_rss_mb"],
                     "ParquetSink", k["sink_rss_mb"])]
    return rows


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.scale",
                                description=(__doc__ or "").splitlines()[0])
    p.add_argument("--quick", action="store_true",
                   help="smoke run: 300k keys, fewer batches, one repeat (a few minutes)")
    p.add_argument("--only", choices=["steady", "restore", "upload", "sink"])
    p.add_argument("--keys", type=int, help="keys of state (default 3,000,000)")
    p.add_argument("--touched", type=float, default=0.01, help="fraction of keys per batch")
    p.add_argument("--rows", type=int, help="rows per steady batch (default 200,000)")
    p.add_argument("--batches", type=int, help="steady batches per run (default 24)")
    p.add_argument("--repeats", type=int, help="repeats of each run (default 2)")
    p.add_argument("--no-full", dest="full", action="store_false",
                   help="skip the full-checkpoint run (benchmark b)")
    p.add_argument("--full-batches", type=int,
                   help="steady batches of the full-checkpoint run (default 10)")
    p.add_argument("--files", type=int, default=48, help="synthetic restore/upload: files")
    p.add_argument("--file-mib", type=int, default=2,
                   help="synthetic restore/upload: MiB per file")
    p.add_argument("--repeats-transfer", type=int,
                   help="repeats of each upload/download comparison (c, d; default 9)")
    p.add_argument("--sink-rows", type=int, help="rows per sink batch (default 1,000,000)")
    p.add_argument("--sink-batches", type=int, help="sink batches (default 8)")
    p.add_argument("--https", action="store_true",
                   help="the S3 endpoint speaks HTTPS (a self-signed certificate made for the "
                   "run): botocore then reads a PUT's body once (unsigned payload, trailing "
                   "checksum), as against AWS S3")
    p.add_argument("--out", type=Path, default=RESULTS, help="where to write the JSON")
    p.add_argument("--sink-child", nargs=4, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    q = args.quick

    def pick(value: int | None, full: int, quick: int) -> int:
        return value if value is not None else (quick if q else full)

    args.keys = pick(args.keys, 3_000_000, 300_000)
    args.rows = pick(args.rows, 200_000, 20_000)
    args.batches = pick(args.batches, 24, 8)
    args.repeats = pick(args.repeats, 2, 1)
    args.full_batches = pick(args.full_batches, 10, 4)
    args.repeats_transfer = pick(args.repeats_transfer, 9, 1)
    args.sink_rows = pick(args.sink_rows, 1_000_000, 100_000)
    args.sink_batches = pick(args.sink_batches, 8, 3)
    if args.quick:
        args.files = min(args.files, 16)
    if (args.batches < 2 or args.repeats < 1 or args.repeats_transfer < 1
            or not 0 < args.touched <= 1):
        p.error("--batches must be >= 2, --repeats and --repeats-transfer >= 1, "
                "0 < --touched <= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.sink_child:
        _sink_child(*args.sink_child)
        return 0
    from airflow_ckpt.testing.s3_server import s3_server_process
    from bench.__main__ import machine

    started = time.perf_counter()
    load_before = os.getloadavg()[0]
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="airflow-ckpt-scale-") as tmp, \
            s3_server_process(serialize_writes=False, tls=args.https) as server:
        work = Path(tmp)
        server.endpoint.create_bucket(BUCKET)
        if args.only in (None, "steady"):
            out["steady"] = steady_suite(server, work / "steady", args)
        if args.only in (None, "restore"):
            out["restore_download"] = restore_download(server, work, args.files,
                                                       args.file_mib, args.repeats_transfer)
        if args.only == "upload":
            out["upload"] = upload_synthetic(server, work, args.files, args.file_mib,
                                             args.repeats_transfer)
    if args.only in (None, "sink"):
        out["sink"] = sink_comparison(args.sink_rows, args.sink_batches, args.repeats)
    import pyspark

    info = machine(pyspark.__version__)
    info["loadavg_1m"] = {"before": round(load_before, 2),
                          "after": round(os.getloadavg()[0], 2)}
    elapsed = time.perf_counter() - started
    rows = rows_of(out)
    print(f"\nairflow-ckpt scale benchmarks: {info['cpus']} CPUs, Spark {info['spark']}, "
          f"{elapsed:.0f} s total, load average {info['loadavg_1m']['before']:.1f} before / "
          f"{info['loadavg_1m']['after']:.1f} after")
    if "steady" in out:
        s = out["steady"]
        w = s["workload"]
        print(f"RocksDB: {w['keys']} keys ({s['seed']['state_mb']:.0f} MiB of state in the "
              f"seed checkpoint), {w['steady_batches']} batches x {w['rows_per_batch']} rows "
              f"touching {w['touched_keys']} keys, {w['repeats']} repeat(s)")
    print(table(rows))
    document = {"created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "command": "python -m bench.scale " + " ".join(argv or sys.argv[1:]),
                "elapsed_s": round(elapsed, 1), "machine": info, "benchmarks": out,
                "table": [r.to_dict() for r in rows]}
    return write_report(args.out, document, out.get("steady", {}).get("wrong_output", []))


if __name__ == "__main__":
    sys.exit(main())
