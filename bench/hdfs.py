"""``python -m bench.hdfs [--quick]``: capture and restore of Spark's working directory on
HDFS vs on the local disk, in one run, as ratios. Results: ``bench/results/hdfs.json``.

One real working directory is made by the example query (local Spark, ``--files``
batches, the HDFS-backed state store, 4 shuffle partitions) on the local disk, then
copied to a Hadoop mini cluster (:mod:`airflow_ckpt.testing.hdfs_cluster`, on this
machine) twice: below a directory with snapshots allowed and below one without. Per
repeat, in alternating order:

* **capture** (the sync phase of a checkpoint of the last batch,
  :func:`~airflow_ckpt.runtime.checkpoint.snapshot.capture`): local hard links vs HDFS
  snapshot + copy into local staging vs HDFS list + copy, each HDFS way also with one
  copy at a time (the capture before ``COPY_THREADS``) as the baseline of the parallel
  copies;
* **restore install** (what restore does after materialising and verifying a
  checkpoint locally, :func:`~airflow_ckpt.runtime.workdir.replace_with`): a rename on
  the local disk vs a copy to HDFS renamed into place, the copy also one file at a time
  as the baseline of the parallel copies.

The download from checkpoint storage and its verification are the same bytes on either
side and are not part of the figures. HDFS here is one DataNode on the same disk, so the
ratios show the client's per-file and per-call costs (py4j, RPCs), not a network.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from airflow_ckpt.runtime.checkpoint.snapshot import capture, latest_batch
from airflow_ckpt.runtime.workdir import Workdir, replace_with
from airflow_ckpt.runtime.workdir.hadoop import HadoopWorkdir
from airflow_ckpt.testing.hdfs_cluster import hadoop_fs, make_dir, running_hdfs
from airflow_ckpt.testing.numbers import write_numbers
from bench.harness import example_query, spark_session
from bench.suites import Row, paired_spread, table, write_report

RESULTS = Path(__file__).resolve().parent / "results" / "hdfs.json"


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.hdfs",
                                description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer batches and repeats")
    p.add_argument("--files", type=int, help="batches of the working directory (default 30)")
    p.add_argument("--repeats", type=int, help="repeats of each measurement (default 7)")
    p.add_argument("--out", type=Path, default=RESULTS, help="where to write the JSON")
    args = p.parse_args(argv)
    args.files = args.files or (8 if args.quick else 30)
    args.repeats = args.repeats or (3 if args.quick else 7)
    return args


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _timed(fn: Callable[[], Any]) -> float:
    started = time.perf_counter()
    fn()
    return (time.perf_counter() - started) * 1000


def make_workdir(spark: Any, root: Path, files: int) -> Path:
    """A real working directory of the example query after ``files`` batches."""
    write_numbers(root / "in", files=files, per_file=1000)
    workdir = root / "local" / "work"
    query = (example_query(spark, root / "in", lambda df, _batch: df.count())
             .option("checkpointLocation", str(workdir)).start())
    query.awaitTermination()
    return workdir


def measure(spark: Any, uri: str, root: Path, files: int, repeats: int) -> dict[str, Any]:
    local = make_workdir(spark, root, files)
    batch = latest_batch(local, "commits")
    assert batch is not None
    fs, path = hadoop_fs(spark, uri)
    sides: dict[str, Workdir] = {"local": local}
    for name, snapshots in (("hdfs-snapshot", True), ("hdfs-copy", False)):
        base = make_dir(spark, f"{uri}/bench/{name}", snapshots=snapshots)
        fs.copyFromLocalFile(False, True, path(local.as_uri()), path(base + "/work"))
        sides[name] = HadoopWorkdir.of(spark, base + "/work", root / name)
        sides[f"{name}-1-thread"] = HadoopWorkdir.of(  # the capture before COPY_THREADS
            spark, base + "/work", root / f"{name}-serial", copy_threads=1)
    captured = capture(local, batch, root / "template")  # what a restore installs
    count, size = len(captured.files), sum(f.size for f in captured.files)
    times: dict[str, list[float]] = {f"capture {k}": [] for k in sides}
    times.update({"restore local": [], "restore hdfs": [], "restore hdfs-1-thread": []})
    targets: dict[str, Workdir] = {"restore local": root / "restored" / "work",
                                   "restore hdfs": sides["hdfs-snapshot"],
                                   "restore hdfs-1-thread": sides["hdfs-snapshot-1-thread"]}
    for repeat in range(repeats):
        order = list(sides) if repeat % 2 == 0 else list(reversed(sides))
        for name in order:
            staging = root / "staging" / f"{name}-{repeat}"
            times[f"capture {name}"].append(
                _timed(lambda w=sides[name], s=staging: capture(w, batch, s)))
            shutil.rmtree(staging)
        labels = ["restore local", "restore hdfs", "restore hdfs-1-thread"]
        for label in labels if repeat % 2 == 0 else list(reversed(labels)):
            tmp = root / "restore-tmp"
            shutil.copytree(captured.staging_dir, tmp)
            times[label].append(_timed(lambda t=targets[label], d=tmp: replace_with(t, d)))
        _log(f"repeat {repeat}: " + ", ".join(f"{k} {v[-1]:.0f} ms" for k, v in times.items()))
    return {"batch": batch, "files": count, "bytes": size, "times_ms": times}


def rows(times: dict[str, list[float]]) -> list[Row]:
    def row(metric: str, baseline: str, subject: str) -> Row:
        base, subj = times[baseline], times[subject]
        return Row("hdfs", metric, "ms", baseline, statistics.median(base), subject,
                   statistics.median(subj), paired_spread(subj, base))

    return [row("capture (sync phase)", "capture local", "capture hdfs-snapshot"),
            row("capture (sync phase)", "capture local", "capture hdfs-copy"),
            row("capture, parallel copies", "capture hdfs-snapshot-1-thread",
                "capture hdfs-snapshot"),
            row("capture, parallel copies", "capture hdfs-copy-1-thread", "capture hdfs-copy"),
            row("restore install", "restore local", "restore hdfs"),
            row("restore install, parallel copies", "restore hdfs-1-thread", "restore hdfs")]


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    with tempfile.TemporaryDirectory(prefix="airflow-ckpt-bench-hdfs-") as tmp:
        root = Path(tmp)
        with running_hdfs(root / "hdfs") as cluster:
            _log(f"HDFS mini cluster up in {cluster.started_in_s} s at {cluster.uri}")
            spark = spark_session()
            try:
                result = measure(spark, cluster.uri, root, args.files, args.repeats)
            finally:
                spark.stop()
    table_rows = rows(result["times_ms"])
    print(f"\nHDFS vs local working directory: {result['files']} files, "
          f"{result['bytes']} bytes (batch {result['batch']}), {args.repeats} repeats, "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}, "
          f"mini cluster start {cluster.started_in_s} s")
    print(table(table_rows))
    document = {"args": {"files": args.files, "repeats": args.repeats},
                "minicluster_start_s": cluster.started_in_s, **result,
                "rows": [r.to_dict() for r in table_rows]}
    return write_report(args.out, json.loads(json.dumps(document)), [])


if __name__ == "__main__":
    raise SystemExit(main())
