"""``python -m bench.scale``: the parts of the realistic-scale suite that exist so far.

* **restore download** (issue 9, target d): ``materialize`` of a checkpoint of
  ``--files`` x ``--file-mib`` state files vs a raw pool of 16 boto3 ``get_object`` calls
  writing the same files from the same endpoint. The endpoint (moto) runs in its own
  process. Alternating order, ``--repeats`` each, medians; both verify the bytes.
* **exactly-once Parquet sink vs Spark's native parquet sink** (target f): the same
  streaming query (``--batches`` input files of ``--rows`` rows, one file per batch),
  each variant in its own driver process on ``file://``; wall time and peak RSS of the
  driver process tree (Python + JVM). Output checked against the ground truth
  (row count and sum) with pyarrow.

Not yet here: the RocksDB steady-state run, upload ratios, restore-to-first-batch.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

MiB = 1 << 20


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _endpoint() -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    proc = subprocess.Popen([str(Path(sys.executable).with_name("moto_server")), "-p",
                             str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, url
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("moto_server did not start")


def restore_download(url: str, files: int, file_mib: int, repeats: int) -> dict[str, Any]:
    import boto3

    from airflow_ckpt.runtime.layout import JobLayout
    from airflow_ckpt.runtime.materialize import materialize
    from airflow_ckpt.runtime.metadata import FileEntry
    from airflow_ckpt.runtime.storage import open_storage
    from tests.fixtures.snapshots import make_manifest

    creds = {"aws_access_key_id": "x", "aws_secret_access_key": "x", "region_name": "us-east-1"}
    client = boto3.client("s3", endpoint_url=url, **creds)
    client.create_bucket(Bucket="scale")
    storage = open_storage("s3://scale/r", endpoint_url=url, **creds)
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

    def ours(dest: Path) -> None:
        materialize(storage, manifest, layout.root, dest)

    def raw(dest: Path) -> None:
        def one(entry: FileEntry) -> None:
            target = dest / entry.path
            target.parent.mkdir(parents=True, exist_ok=True)
            body = client.get_object(Bucket="scale", Key="r/" + layout.root + entry.key)["Body"]
            with target.open("wb") as out:
                while chunk := body.read(MiB):
                    out.write(chunk)
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(one, entries))

    times: dict[str, list[float]] = {"ours": [], "raw": []}
    for r in range(repeats):
        for name, fn in (("ours", ours), ("raw", raw)) if r % 2 == 0 else (("raw", raw),
                                                                             ("ours", ours)):
            dest = Path(tempfile.mkdtemp(prefix="scale-restore-"))
            start = time.perf_counter()
            fn(dest)
            times[name].append(time.perf_counter() - start)
            got = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())
            assert got == files * file_mib * MiB, (name, got)
            shutil.rmtree(dest)
    ours_s, raw_s = statistics.median(times["ours"]), statistics.median(times["raw"])
    return {"files": files, "bytes": files * file_mib * MiB, "ours_s": ours_s, "raw_s": raw_s,
            "ratio": ours_s / raw_s, "runs": times}


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
    if variant == "native":
        query = writer.format("parquet").option("path", out_dir).start()
    else:
        sink = ParquetSink(Path(out_dir).as_uri())

        def each(batch: Any, batch_id: int) -> None:
            sink.stage(batch, batch_id)
            sink.commit(batch_id)

        query = writer.foreachBatch(each).start()
    query.awaitTermination()
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
    runs: dict[str, list[dict[str, float]]] = {"native": [], "parquet_sink": []}
    for r in range(repeats):
        order = ["native", "parquet_sink"] if r % 2 == 0 else ["parquet_sink", "native"]
        for variant in order:
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
            runs[variant].append({"wall_s": wall, "driver_rss_mb": peak / MiB, "ok": ok})
            if not ok:
                raise RuntimeError(f"{variant}: output differs from the ground truth")
    shutil.rmtree(work, ignore_errors=True)

    def med(variant: str, field: str) -> float:
        return statistics.median(x[field] for x in runs[variant])

    return {
        "rows_per_batch": rows, "batches": batches,
        "wall_ratio": med("parquet_sink", "wall_s") / med("native", "wall_s"),
        "rss_ratio": med("parquet_sink", "driver_rss_mb") / med("native", "driver_rss_mb"),
        "runs": runs,
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__.splitlines()[0])
    p.add_argument("--files", type=int, default=64, help="state files for the restore run")
    p.add_argument("--file-mib", type=int, default=2)
    p.add_argument("--rows", type=int, default=1_000_000, help="rows per batch (sink run)")
    p.add_argument("--batches", type=int, default=5)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--only", choices=["restore", "sink"])
    p.add_argument("--sink-child", nargs=4, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.sink_child:
        _sink_child(*args.sink_child)
        return 0
    out: dict[str, Any] = {}
    if args.only in (None, "restore"):
        proc, url = _endpoint()
        try:
            out["restore_download"] = restore_download(url, args.files, args.file_mib,
                                                       args.repeats)
        finally:
            proc.terminate()
            proc.wait()
        r = out["restore_download"]
        print(f"restore download {r['files']} files, {r['bytes'] / MiB:.0f} MiB: "
              f"ours {r['ours_s']:.2f} s, raw boto3 pool {r['raw_s']:.2f} s, "
              f"ratio {r['ratio']:.2f}x")
    if args.only in (None, "sink"):
        out["sink"] = s = sink_comparison(args.rows, args.batches, args.repeats)
        print(f"ParquetSink vs native parquet sink, {args.batches} x {args.rows} rows: "
              f"wall {s['wall_ratio']:.2f}x, driver RSS {s['rss_ratio']:.2f}x")
    print(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
