"""RocksDB steady state at realistic scale: the part of ``python -m bench.scale`` that runs
a keyed aggregation over millions of keys (issue 9, benchmarks a-e).

The query: ``groupBy(k).agg(count, sum(v), max(p))`` over a parquet file source
(``maxFilesPerTrigger=1``: one micro-batch per input file, ``availableNow``), RocksDB
state store with changelog checkpointing, ``local[2]``, 4 state partitions, update
output through ``foreachBatch``, which reduces each batch's output to a checksum
(rows, sum of counts, sum of sums, sum of ``crc32(max(p))``) on the executors. ``p`` is
a random 24-character string, so each key holds ~40 bytes of incompressible state.

* **seed**: batch 0 holds every key once (``--keys``, default 3M: ~130 MB of RocksDB
  SSTs). It runs once, under ``CheckpointedJob``, into ``s3://<bucket>/seed`` (changelog
  checkpointing off for this one batch, so that the state is a RocksDB snapshot, not a
  replay log); its final checkpoint is the starting point of every measured run.
* **steady batches** 1..N: each touches 1 % of the keys (``--touched``), ``--rows``
  rows per batch.
* **plain** (baseline): Spark with its own ``checkpointLocation``, a local copy of the
  seed checkpoint (materialised once, not timed), no runtime.
* **incremental** / **full**: the same query under ``CheckpointedJob`` (5 s interval,
  3 retained), restored from a server-side copy of the seed prefix (so each run finds
  its own job's ``shared/`` files, as a long-running job does). The full run (for
  benchmark b only) is stopped after ``full_batches`` steady batches.
* **fresh**: ``CheckpointedJob`` with ``restore=none`` over batch 1 alone: the first
  batch of a job without state, the baseline of restore-to-first-batch.

Every run is its own driver process (``python -m bench.steady <spec.json>``), started
by the parent with the clock running: "process start -> first batch" is from ``Popen``
to the end of the first batch's ``triggerExecution`` (Spark's progress event). Every
run's per-batch checksums are compared with a ground truth computed with numpy from the
same generator (:class:`Workload`), independent of Spark.

The parent also measures, on the seed checkpoint's real files, the runtime's upload path
(``upload_snapshot``: sha256 + s3transfer PUTs, 8 threads as the coordinator uses) vs a
raw pool of 8 boto3 ``put_object``, and ``materialize`` (restore's download: streamed
GET + sha256, 16 threads) vs a raw pool of 16 ``get_object``, alternating, medians.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    from airflow_ckpt.runtime.checkpoint.metadata import Manifest
    from airflow_ckpt.runtime.storage import CheckpointStorage
    from airflow_ckpt.testing.s3_server import S3Endpoint, S3ServerProcess

MiB = 1 << 20
BUCKET = "airflow-ckpt-scale"
JOB = "scale"
PAYLOAD = 24  # characters of max(p): base64 of 18 random bytes
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
CHANGELOG = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"
STATE_PARTITIONS = 4
INTERVAL = "5 s"
UPLOAD_THREADS = 8  # CheckpointCoordinator's upload_threads default
DOWNLOAD_THREADS = 16  # materialize's max_workers default


def checkpoint_config(incremental: bool) -> dict[str, Any]:
    return {"execution.checkpointing.interval": INTERVAL,
            "execution.checkpointing.num-retained": 3,
            "execution.checkpointing.incremental": incremental}


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- input


Checksum = tuple[int, int, int, int]  # rows, sum(count), sum(sum), sum(crc32(max(p)))


@dataclass(frozen=True)
class Workload:
    """Deterministic input: batch 0 = every key once, batches 1..N touch ``touched``
    of the keys (every touched key at least once) with ``rows`` rows."""

    keys: int
    touched: float
    rows: int
    batches: int  # steady batches
    seed: int = 9

    @property
    def touched_keys(self) -> int:
        return max(1, int(self.keys * self.touched))

    def batch(self, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Batch ``i`` as numpy arrays ``k`` (int64), ``v`` (int64), ``p`` (S24)."""
        import numpy as np

        rng = np.random.default_rng([self.seed, i])
        if i == 0:
            k = np.arange(self.keys, dtype=np.int64)
        else:
            hit = rng.choice(self.keys, self.touched_keys, replace=False).astype(np.int64)
            extra = max(self.rows - len(hit), 0)
            k = np.concatenate([hit, hit[rng.integers(0, len(hit), extra)]])
        v = rng.integers(0, 1000, len(k), dtype=np.int64)
        raw = base64.b64encode(rng.bytes(len(k) * PAYLOAD * 3 // 4))
        p = np.frombuffer(raw, dtype=f"S{PAYLOAD}")
        return k, v, p

    def write(self, directory: Path, i: int, mtime: float) -> Path:
        """Write batch ``i`` as ``b<i>.parquet`` (mtime fixes the file source's order)."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.parquet as pq

        k, v, p = self.batch(i)
        n = len(k)
        offsets = np.arange(0, PAYLOAD * (n + 1), PAYLOAD, dtype=np.int32)
        strings = pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(p.tobytes()))
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"b{i:05d}.parquet"
        pq.write_table(pa.table({"k": k, "v": v, "p": strings}), path)
        os.utime(path, (mtime, mtime))
        return path

    def truth(self, batches: Iterable[int]) -> list[Checksum]:
        """The update output's checksum after each of ``batches``, from empty state:
        computed with numpy, independently of Spark."""
        import numpy as np

        count = np.zeros(self.keys, dtype=np.int64)
        total = np.zeros(self.keys, dtype=np.int64)
        top = np.zeros(self.keys, dtype=f"S{PAYLOAD}")  # b"" sorts below every payload
        out: list[Checksum] = []
        for i in batches:
            k, v, p = self.batch(i)
            count += np.bincount(k, minlength=self.keys)
            total += np.bincount(k, weights=v, minlength=self.keys).astype(np.int64)
            if bool(np.all(k[1:] > k[:-1])):  # batch 0: every key once, in order
                keys, best = k, p
            else:
                order = np.lexsort((p, k))
                ks, ps = k[order], p[order]
                last = np.append(ks[1:] != ks[:-1], True)  # the max p of each key
                keys, best = ks[last], ps[last]
            top[keys] = np.where(top[keys] > best, top[keys], best)
            crc = sum(zlib.crc32(x) for x in top[keys].tolist())
            out.append((len(keys), int(count[keys].sum()), int(total[keys].sum()), crc))
        return out


# ----------------------------------------------------------------------------- the child


def child(spec_path: str) -> None:
    """One driver process: run the query (plain or checkpointed), write the results."""
    spec = json.loads(Path(spec_path).read_text())
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    import logging

    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F
    from pyspark.sql.streaming import StreamingQueryListener

    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("py4j").setLevel(logging.ERROR)
    spark = (SparkSession.builder.master("local[2]").appName(f"scale-{spec['variant']}")
             .config("spark.driver.memory", "2g")
             .config("spark.sql.shuffle.partitions", str(STATE_PARTITIONS))
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
             .config(CHANGELOG, str(spec["changelog"]).lower())
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark_up = time.time()
    progress: list[dict[str, Any]] = []
    cpu: dict[str, dict[str, float]] = {}
    sample = _cpu_sampler(spec["endpoint_pid"])

    def stop_all() -> None:
        for query in spark.streams.active:
            query.stop()

    class Progress(StreamingQueryListener):
        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            p = event.progress
            if not progress:
                cpu["first_batch"] = sample()
            start = datetime.fromisoformat(p.timestamp.replace("Z", "+00:00")).timestamp()
            progress.append({"batch": p.batchId, "start": start, "rows": p.numInputRows,
                             "ms": p.durationMs.get("triggerExecution", 0)})
            if spec.get("max_batches") and len(progress) == spec["max_batches"]:
                # batch committed: stop the query as if its source had ended (not from
                # the listener's own thread, which stop() would wait for)
                threading.Thread(target=stop_all, daemon=True).start()

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            pass

    spark.streams.addListener(Progress())
    checks: dict[int, list[int]] = {}
    agg = (spark.readStream.schema("k long, v long, p string")
           .option("maxFilesPerTrigger", 1).parquet(spec["input"])
           .groupBy("k").agg(F.count("*").alias("c"), F.sum("v").alias("s"),
                             F.max("p").alias("p")))

    def each(df: Any, batch_id: int) -> None:
        row = df.agg(F.count("*"), F.sum("c"), F.sum("s"),
                     F.sum(F.crc32(F.col("p").cast("binary")))).first()
        checks[batch_id] = [int(x or 0) for x in row]

    def build() -> Any:
        return (agg.writeStream.outputMode("update").foreachBatch(each)
                .trigger(availableNow=True))

    manifests: list[dict[str, Any]] = []
    if spec["variant"] == "plain":
        query = build().option("checkpointLocation", spec["location"]).start()
        query.awaitTermination()
        if query.exception() is not None:
            raise RuntimeError(str(query.exception()))
    else:
        from airflow_ckpt.runtime.job import CheckpointedJob
        from airflow_ckpt.runtime.storage import open_storage

        storage = open_storage(spec["storage"], endpoint_url=spec["endpoint"],
                               region_name="us-east-1", aws_access_key_id="testing",
                               aws_secret_access_key="testing")
        job = CheckpointedJob(spark, job=JOB, storage=storage,
                              checkpoint_config=spec["checkpoint_config"],
                              restart_strategy={"type": "none"}, restore=spec["restore"],
                              workdir=spec["location"])
        job.on_checkpoint(lambda m: manifests.append(_manifest_summary(m)))
        job.run(build)
    queried = time.time()
    cpu["query_done"] = sample()
    deadline = time.monotonic() + 30  # progress events arrive asynchronously
    while len(progress) < len(checks) and time.monotonic() < deadline:
        time.sleep(0.05)
    Path(spec["out"]).write_text(json.dumps({
        "spark_up": spark_up, "query_done": queried, "progress": progress, "cpu": cpu,
        "checks": checks, "manifests": manifests,
    }))
    spark.stop()


#: the processes whose CPU seconds a run reports (the sampler's keys besides "ts")
CPU_PARTS = ("python", "jvm", "endpoint")


def _cpu_sampler(endpoint_pid: int) -> Callable[[], dict[str, float]]:
    """CPU seconds so far of this driver's Python process, its JVM and the S3 endpoint."""
    import psutil

    me, endpoint = psutil.Process(), psutil.Process(endpoint_pid)

    def seconds(p: psutil.Process) -> float:
        t = p.cpu_times()
        return float(t.user + t.system)

    def sample() -> dict[str, float]:
        jvm = sum(seconds(c) for c in me.children(recursive=True) if "java" in c.name())
        return {"ts": time.time(), "python": seconds(me), "jvm": jvm,
                "endpoint": seconds(endpoint)}

    return sample


def _manifest_summary(m: Manifest) -> dict[str, Any]:
    return {"id": m.checkpoint_id, "trigger": m.trigger, "batch_id": m.batch_id,
            "files": len(m.files), "state_size": m.state_size,
            "checkpointed_size": m.checkpointed_size,
            "sync_ms": m.timings.sync_duration_ms, "async_ms": m.timings.async_duration_ms,
            "e2e_ms": m.timings.end_to_end_duration_ms}


# ----------------------------------------------------------------------------- runs


@dataclass
class Run:
    """One driver process of a variant, as the parent saw it."""

    variant: str  # seed, plain, incremental, full, fresh
    repeat: int
    started: float  # time.time() just before Popen
    exited: float
    result: dict[str, Any]
    correct: bool
    endpoint_cpu_s: float
    progress: list[dict[str, Any]] = field(init=False)

    def __post_init__(self) -> None:
        self.progress = sorted(self.result["progress"], key=lambda p: p["batch"])

    @property
    def manifests(self) -> list[dict[str, Any]]:
        return list(self.result["manifests"])

    def batch_end(self, p: dict[str, Any]) -> float:
        return float(p["start"]) + p["ms"] / 1000

    @property
    def first_batch_s(self) -> float:
        """Process start -> end of the first batch (restore and state loading included)."""
        return self.batch_end(self.progress[0]) - self.started

    @property
    def steady(self) -> list[dict[str, Any]]:
        """Every batch after the first (which loads the state)."""
        return self.progress[1:]

    @property
    def steady_window_s(self) -> float:
        """End of the first batch -> end of the last: the steady batches' wall time."""
        return self.batch_end(self.progress[-1]) - self.batch_end(self.progress[0])

    @property
    def steady_rows(self) -> int:
        return sum(int(p["rows"]) for p in self.steady)

    def steady_cpu_s(self, part: str) -> float:
        """CPU seconds of ``part`` (python, jvm, endpoint) from the end of the first
        batch to the end of the query."""
        cpu = self.result["cpu"]
        return float(cpu["query_done"][part] - cpu["first_batch"][part])

    @property
    def startup(self) -> dict[str, float]:
        """Process start -> first batch, in three parts: the SparkSession (JVM) is up;
        the query's first trigger starts (for a checkpointed run: lease, restore,
        coordinator); the first batch ends (Spark loads the state as it runs)."""
        first = self.progress[0]
        return {"spark_up_s": self.result["spark_up"] - self.started,
                "to_first_trigger_s": float(first["start"]) - self.result["spark_up"],
                "first_batch_s": first["ms"] / 1000}

    @property
    def wall_s(self) -> float:
        return self.exited - self.started

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "variant": self.variant, "repeat": self.repeat, "wall_s": round(self.wall_s, 3),
            "correct": self.correct, "endpoint_cpu_s": round(self.endpoint_cpu_s, 2),
            "start_to_first_batch_s": round(self.first_batch_s, 3),
            "startup": {k: round(v, 3) for k, v in self.startup.items()},
            "batches": [[p["batch"], p["ms"], p["rows"]] for p in self.progress],
            "checkpoints": self.manifests,
        }
        if len(self.progress) > 1:
            out["steady_window_s"] = round(self.steady_window_s, 3)
            out["steady_cpu_s"] = {part: round(self.steady_cpu_s(part), 2)
                                   for part in CPU_PARTS}
        return out


def _cpu_s(pid: int) -> float:
    import psutil

    try:
        t = psutil.Process(pid).cpu_times()
    except psutil.NoSuchProcess:
        return 0.0
    return float(t.user + t.system)


class Steady:
    """The parent of one invocation: the endpoint, the input, the seed, the runs."""

    def __init__(self, server: S3ServerProcess, root: Path, workload: Workload,
                 full_batches: int) -> None:
        self.server = server
        self.endpoint: S3Endpoint = server.endpoint
        self.root = root
        self.workload = workload
        self.full_batches = min(full_batches, workload.batches)
        self.input = root / "in"
        root.mkdir(parents=True, exist_ok=True)
        self.client = self.endpoint.client()
        self.endpoint.create_bucket(BUCKET)
        self._count = 0
        self._truth: dict[str, list[Checksum]] = {}
        self._truth_lock = threading.Lock()

    def storage(self, prefix: str) -> CheckpointStorage:
        return self.endpoint.storage(f"s3://{BUCKET}/{prefix}")

    def launch(self, variant: str, repeat: int, *, input_dir: Path, location: Path,
               prefix: str | None = None, restore: str = "latest", changelog: bool = True,
               incremental: bool = True, max_batches: int | None = None) -> Run:
        """One driver process; returns when it exited, its output checked."""
        self._count += 1
        tag = f"{self._count:02d}-{variant}"
        out = self.root / f"result-{tag}.json"
        spec: dict[str, Any] = {
            "variant": "plain" if variant == "plain" else "checkpointed",
            "input": str(input_dir), "location": str(location),
            "storage": f"s3://{BUCKET}/{prefix}" if prefix else None,
            "endpoint": self.endpoint.url, "restore": restore, "changelog": changelog,
            "checkpoint_config": checkpoint_config(incremental),
            "endpoint_pid": self.server.pid, "max_batches": max_batches, "out": str(out)}
        spec_path = self.root / f"spec-{tag}.json"
        spec_path.write_text(json.dumps(spec))
        cpu = _cpu_s(self.server.pid)
        started = time.time()
        proc = subprocess.run([sys.executable, "-m", "bench.steady", str(spec_path)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        exited = time.time()
        if proc.returncode != 0:
            raise RuntimeError(f"{variant} run failed ({proc.returncode}):\n"
                               + proc.stderr[-4000:])
        result = json.loads(out.read_text())
        run = Run(variant, repeat, started, exited, result, False,
                  _cpu_s(self.server.pid) - cpu)
        run.correct = self.check(run)
        _log(f"  {variant:<11} repeat {repeat}: {run.wall_s:6.1f} s, first batch after "
             f"{run.first_batch_s:5.1f} s, {len(run.progress)} batches, "
             f"{len(run.manifests)} checkpoints, "
             f"{'correct' if run.correct else 'WRONG OUTPUT'}")
        return run

    def check(self, run: Run) -> bool:
        """Compare every batch's checksum with the ground truth."""
        got = {int(b): tuple(c) for b, c in run.result["checks"].items()}
        if run.variant == "fresh":
            expected = dict(enumerate(self.truth("fresh", [1])))
        elif run.variant == "seed":
            expected = {0: self.truth("main", [])[0]}
        else:
            expected = dict(enumerate(self.truth("main", [])))
            expected.pop(0)
            if run.variant == "full":  # stopped after full_batches (one more may run)
                expected = {b: c for b, c in expected.items() if b in got}
                return got == expected and len(got) >= self.full_batches
        return got == expected and len(run.progress) == len(expected)

    def truth(self, name: str, batches: Sequence[int]) -> list[Checksum]:
        """Computed once per name (``[]``: batches 0..N); thread-safe."""
        with self._truth_lock:
            if name not in self._truth:
                chosen = batches or range(self.workload.batches + 1)
                self._truth[name] = self.workload.truth(chosen)
            return self._truth[name]

    def clone(self, prefix: str) -> None:
        """Server-side copy of every seed object to ``prefix/`` (not timed)."""
        paginator = self.client.get_paginator("list_objects_v2")
        keys = [o["Key"] for page in paginator.paginate(Bucket=BUCKET, Prefix="seed/")
                for o in page.get("Contents", [])]

        def copy(key: str) -> None:
            self.client.copy_object(Bucket=BUCKET, Key=prefix + key[len("seed"):],
                                    CopySource={"Bucket": BUCKET, "Key": key})

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(copy, keys))

    # -- the plan ---------------------------------------------------------------------

    def seed(self) -> tuple[Run, Manifest]:
        """Batch 0 (every key) into ``seed/``; its latest checkpoint."""
        from airflow_ckpt.runtime.checkpoint.catalog import CheckpointCatalog

        base = time.time() - 10_000
        self.workload.write(self.input, 0, base)
        truth = threading.Thread(target=self.truth, args=("main", []))
        truth.start()  # numpy, while the JVM works
        run = self.launch("seed", 0, input_dir=self.input, location=self.root / "w-seed",
                          prefix="seed", restore="none", changelog=False)
        truth.join()
        for i in range(1, self.workload.batches + 1):
            self.workload.write(self.input, i, base + i)
        fresh = self.root / "in-fresh"  # batch 1 alone (a link)
        fresh.mkdir()
        os.link(self.input / "b00001.parquet", fresh / "b00001.parquet")
        manifest = CheckpointCatalog(self.storage("seed"), JOB).latest_checkpoint()
        assert manifest is not None
        return run, manifest

    def measured(self, repeats: int, full: bool, local_seed: Path) -> list[Run]:
        """plain / incremental / fresh per repeat (alternating order); one full run."""
        runs: list[Run] = []
        variants = ["plain", "incremental", "fresh"]
        for repeat in range(repeats):
            for variant in variants if repeat % 2 == 0 else variants[::-1]:
                runs.append(self.one(variant, repeat, local_seed))
            if repeat == 0 and full:
                runs.append(self.one("full", 0, local_seed))
        return runs

    def one(self, variant: str, repeat: int, local_seed: Path) -> Run:
        tag = f"r{repeat}-{variant}"
        location = self.root / f"w-{tag}"
        if variant == "plain":
            shutil.copytree(local_seed, location)
            return self.launch(variant, repeat, input_dir=self.input, location=location)
        if variant == "fresh":
            return self.launch(variant, repeat, input_dir=self.root / "in-fresh",
                               location=location, prefix=tag, restore="none")
        self.clone(tag)
        full = variant == "full"
        return self.launch(variant, repeat, input_dir=self.input, location=location,
                           prefix=tag, incremental=not full,
                           max_batches=self.full_batches if full else None)


# ----------------------------------------------------------------------------- transfers


def _median(values: Iterable[float]) -> float:
    data = list(values)
    return float(statistics.median(data)) if data else 0.0


def alternate(variants: dict[str, Callable[[int], None]], repeats: int,
              after: Callable[[str, int], None] = lambda _n, _r: None
              ) -> dict[str, list[float]]:
    """Time each variant ``repeats`` times, in alternating order; ``after`` (not timed)
    checks and cleans up."""
    times: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for r in range(repeats):
        for name in names if r % 2 == 0 else names[::-1]:
            started = time.perf_counter()
            variants[name](r)
            times[name].append(time.perf_counter() - started)
            after(name, r)
    return times


def compare_download(endpoint: S3Endpoint, storage: CheckpointStorage, manifest: Manifest,
                     root_key: str, key_prefix: str, work: Path, repeats: int,
                     keep: Path | None = None) -> dict[str, Any]:
    """``materialize`` vs a raw pool of ``get_object`` writing the same (needed) files,
    and vs the same raw pool also computing each file's SHA-256 (the verification restore
    must do; ``raw_sha256``): the first ratio is what restore costs over a plain download,
    the second what its own code adds beyond the hash. The raw client is boto3's default
    (it validates the CRC32 S3 stores with an object).

    ``key_prefix``: the storage's own prefix in the bucket (``<prefix>/``), for the raw
    client. With ``keep``, one materialised copy is moved there.
    """
    from airflow_ckpt.runtime.checkpoint.metadata import FileEntry
    from airflow_ckpt.runtime.restore.materialize import materialize
    from airflow_ckpt.runtime.restore.state_files import needed_state_files

    client = endpoint.client()
    entries = needed_state_files(manifest.files, manifest.batch_id + 1)
    total = sum(e.size for e in entries)

    def dest(name: str, r: int) -> Path:
        return work / f"download-{name}-{r}"

    def ours(r: int) -> None:
        materialize(storage, manifest, root_key, dest("ours", r), max_workers=DOWNLOAD_THREADS)

    # The same requests restore makes: a GET per file of its own, one ranged GET per
    # merged object over the span of its needed segments.
    groups: dict[tuple[str, str], list[FileEntry]] = {}
    for e in entries:
        groups.setdefault((e.key, "" if e.merged else e.path), []).append(e)

    def raw(r: int, name: str = "raw") -> None:
        hashing = name == "raw_sha256"

        def one(group: list[FileEntry]) -> None:
            group = sorted(group, key=lambda e: e.offset or 0)
            start = group[0].offset or 0
            params: dict[str, Any] = {"Bucket": BUCKET, "Key": key_prefix + root_key + group[0].key}
            if group[0].merged:
                end = max((e.offset or 0) + e.size for e in group)
                params["Range"] = f"bytes={start}-{end - 1}"
            body = client.get_object(**params)["Body"]
            if not group[0].merged:
                target = dest(name, r) / group[0].path
                target.parent.mkdir(parents=True, exist_ok=True)
                digest = hashlib.sha256()
                with target.open("wb") as out:
                    while chunk := body.read(MiB):
                        if hashing:
                            digest.update(chunk)
                        out.write(chunk)
                return
            data = memoryview(body.read())  # a merged object's span: <= max-file-size
            for entry in group:
                target = dest(name, r) / entry.path
                target.parent.mkdir(parents=True, exist_ok=True)
                at = (entry.offset or 0) - start
                segment = data[at:at + entry.size]
                if hashing:
                    hashlib.sha256(segment)
                target.write_bytes(segment)
        with ThreadPoolExecutor(DOWNLOAD_THREADS) as pool:
            list(pool.map(one, groups.values()))

    def after(name: str, r: int) -> None:
        d = dest(name, r)
        got = sum(p.stat().st_size for p in d.rglob("*") if p.is_file())
        if got != total:
            raise RuntimeError(f"download {name}: {got} bytes, expected {total}")
        if keep is not None and name == "ours" and not keep.exists():
            d.rename(keep)
        else:
            shutil.rmtree(d)

    times = alternate({"ours": ours, "raw": raw,
                       "raw_sha256": lambda r: raw(r, "raw_sha256")}, repeats, after)
    client.close()
    ours_s, raw_s = _median(times["ours"]), _median(times["raw"])
    raw_sha_s = _median(times["raw_sha256"])
    return {"files": len(entries), "bytes": total, "ours_s": ours_s, "raw_s": raw_s,
            "raw_sha256_s": raw_sha_s, "ratio": ours_s / raw_s,
            "ratio_to_raw_sha256": ours_s / raw_sha_s, "runs": times}


def compare_upload(endpoint: S3Endpoint, source: Path, repeats: int) -> dict[str, Any]:
    """The runtime's upload path (``upload_snapshot``, fresh digests, every file new) vs
    a raw pool of ``put_object``, same files, same threads: incremental (``ours``: the
    content key needs the SHA-256 before the PUT) and full (``ours_full``: the key is the
    path, the SHA-256 is computed as the PUT reads the file)."""
    from airflow_ckpt.runtime.checkpoint.digests import DigestCache
    from airflow_ckpt.runtime.checkpoint.snapshot import CapturedFile, CapturedSnapshot
    from airflow_ckpt.runtime.checkpoint.store import SharedFileRegistry
    from airflow_ckpt.runtime.checkpoint.upload import UploadTarget, upload_snapshot
    from airflow_ckpt.runtime.storage.layout import JobLayout

    files = sorted(p for p in source.rglob("*") if p.is_file())
    rels = [p.relative_to(source).as_posix() for p in files]
    captured = tuple(CapturedFile(rel, path, path.stat().st_size, rel.split("/")[0], True)
                     for rel, path in zip(rels, files, strict=True))
    snapshot = CapturedSnapshot(0, captured, (), [], tuple({c.subtask for c in captured}),
                                source)
    client = endpoint.client()
    total = sum(c.size for c in captured)

    def ours(r: int, name: str = "ours", incremental: bool = True) -> None:
        storage = endpoint.storage(f"s3://{BUCKET}/upload-{name}-{r}")
        with ThreadPoolExecutor(UPLOAD_THREADS) as pool:
            result = upload_snapshot(
                storage, JobLayout("up"), snapshot, UploadTarget(1, "chk-1/", incremental),
                executor=pool, digests=DigestCache(), shared=SharedFileRegistry(),
                deadline=time.monotonic() + 3600, on_ack=lambda _s: None,
                cancelled=threading.Event())
        storage.close()
        if result.checkpointed_size != total:
            raise RuntimeError(f"upload ours: {result.checkpointed_size} of {total} bytes")

    def raw(r: int) -> None:
        def one(item: tuple[str, Path]) -> None:
            rel, path = item
            with path.open("rb") as body:
                client.put_object(Bucket=BUCKET, Key=f"upload-raw-{r}/{rel}", Body=body)
        with ThreadPoolExecutor(UPLOAD_THREADS) as pool:
            list(pool.map(one, zip(rels, files, strict=True)))

    def clean(name: str, r: int) -> None:  # untimed: the server's memory stays bounded
        prefix = f"upload-{'full' if name == 'ours_full' else name}-{r}/"
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET,
                                                                     Prefix=prefix):
            keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
            if keys:
                client.delete_objects(Bucket=BUCKET, Delete={"Objects": keys})

    reads: dict[str, list[float]] = {}

    def reading(name: str, fn: Callable[[int], None]) -> Callable[[int], None]:
        def timed(r: int) -> None:  # the bytes this process read, per byte uploaded
            before = _bytes_read()
            fn(r)
            reads.setdefault(name, []).append(round((_bytes_read() - before) / total, 2))
        return timed

    variants = {"ours": ours, "raw": raw,
                "ours_full": lambda r: ours(r, "full", incremental=False)}
    times = alternate({name: reading(name, fn) for name, fn in variants.items()}, repeats,
                      after=clean)
    client.close()
    ours_s, raw_s = _median(times["ours"]), _median(times["raw"])
    full_s = _median(times["ours_full"])
    return {"files": len(files), "bytes": total, "ours_s": ours_s, "raw_s": raw_s,
            "ratio": ours_s / raw_s, "full_s": full_s, "full_ratio": full_s / raw_s,
            "runs": times, "read_per_byte": reads}


def _bytes_read() -> int:
    """Bytes this process has read so far (files, page cache included, and sockets:
    Linux's ``rchar``); 0 where ``/proc/self/io`` is missing."""
    try:
        with open("/proc/self/io") as io:
            return next(int(line.split()[1]) for line in io if line.startswith("rchar:"))
    except OSError:
        return 0


# ----------------------------------------------------------------------------- figures


def _pct(values: Sequence[float], q: float) -> float:
    import numpy as np

    return float(np.percentile(np.asarray(values, dtype=float), q)) if values else 0.0


def figures(runs: Sequence[Run]) -> dict[str, Any]:
    """The ratios of benchmarks a, b and e from the measured runs."""
    by: dict[str, list[Run]] = {}
    for r in runs:
        by.setdefault(r.variant, []).append(r)
    plain, incr = by["plain"], by["incremental"]

    def ms(rs: Sequence[Run]) -> list[float]:
        return [float(p["ms"]) for r in rs for p in r.steady]

    def throughput(rs: Sequence[Run]) -> float:
        return _median(r.steady_rows / r.steady_window_s for r in rs)

    pairs = {r.repeat: r for r in plain}
    out: dict[str, Any] = {
        "a_steady_state": {
            "plain_rows_per_s": throughput(plain), "ckpt_rows_per_s": throughput(incr),
            "throughput_ratio": throughput(incr) / throughput(plain),
            "paired_throughput_ratios": [
                round((r.steady_rows / r.steady_window_s)
                      / (pairs[r.repeat].steady_rows / pairs[r.repeat].steady_window_s), 3)
                for r in incr if r.repeat in pairs],
            "plain_p50_ms": _pct(ms(plain), 50), "ckpt_p50_ms": _pct(ms(incr), 50),
            "plain_p99_ms": _pct(ms(plain), 99), "ckpt_p99_ms": _pct(ms(incr), 99),
            "plain_wall_s": _median(r.wall_s for r in plain),
            "ckpt_wall_s": _median(r.wall_s for r in incr),
            "plain_cpu_s": {part: _median(r.steady_cpu_s(part) for r in plain)
                            for part in CPU_PARTS},
            "ckpt_cpu_s": {part: _median(r.steady_cpu_s(part) for r in incr)
                           for part in CPU_PARTS},
            # the noise floor: the same plain run's CPU seconds, repeat by repeat
            "plain_cpu_s_by_repeat": [round(sum(r.steady_cpu_s(part) for part in CPU_PARTS), 2)
                                      for r in plain],
            "steady_batches_per_run": len(plain[0].steady),
            "checkpoints_per_run": _median(len(r.manifests) for r in incr),
        },
    }
    a = out["a_steady_state"]
    a["p50_ratio"] = a["ckpt_p50_ms"] / a["plain_p50_ms"]
    a["p99_ratio"] = a["ckpt_p99_ms"] / a["plain_p99_ms"]
    a["wall_ratio"] = a["ckpt_wall_s"] / a["plain_wall_s"]
    b: dict[str, Any] = {}
    for variant in ("incremental", "full"):
        ms_ = [m for r in by.get(variant, []) for m in r.manifests if m["trigger"] != "final"]
        if not ms_:
            continue
        b[variant] = {
            "checkpoints": len(ms_),
            "uploaded_mb_median": _median(m["checkpointed_size"] / MiB for m in ms_),
            "state_mb_median": _median(m["state_size"] / MiB for m in ms_),
            "uploaded_fraction_median": _median(m["checkpointed_size"] / m["state_size"]
                                                for m in ms_),
            "uploaded_fraction_max": max(m["checkpointed_size"] / m["state_size"] for m in ms_),
            "async_ms_median": _median(m["async_ms"] for m in ms_),
            "wall_s": _median(r.wall_s for r in by[variant]),
        }
    out["b_incremental_vs_full"] = b
    fresh = by["fresh"]
    out["e_first_batch"] = {
        "fresh_s": _median(r.first_batch_s for r in fresh),
        "restored_s": _median(r.first_batch_s for r in incr),
        "plain_local_s": _median(r.first_batch_s for r in plain),
        "parts": {variant: {part: _median(r.startup[part] for r in by[variant])
                            for part in ("spark_up_s", "to_first_trigger_s", "first_batch_s")}
                  for variant in ("fresh", "incremental", "plain")},
    }
    e = out["e_first_batch"]
    e["ratio"] = e["restored_s"] / e["fresh_s"]
    return out


if __name__ == "__main__":
    child(sys.argv[1])
