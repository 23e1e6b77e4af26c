"""A real HDFS on this machine: Hadoop's mini cluster, one NameNode and one DataNode in
one JVM on 127.0.0.1 (``org.apache.hadoop.test.MiniDFSClusterManager``), for the tests
(tests/fixtures/hdfs.py) and the HDFS benchmark (``python -m bench.hdfs``).

The jars (``hadoop-client-minicluster`` matching the Hadoop that pyspark ships, plus the
JUnit jars its launcher needs) are fetched once by ``scripts/fetch_hadoop_jars.sh`` into
``~/.cache/airflow-ckpt/jars/hadoop-minicluster/<version>/``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FETCH_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "fetch_hadoop_jars.sh"
#: a cold NameNode + DataNode start on 2 busy cores (25-100 s measured)
STARTUP_S = 240


class HdfsUnavailable(RuntimeError):
    """The mini cluster's jars cannot be had (no Maven, offline): the reason."""


@dataclass(frozen=True)
class MiniHdfs:
    """A running mini cluster: ``uri`` is ``hdfs://127.0.0.1:<port>``."""

    port: int
    base_dir: Path  # its local data and log
    started_in_s: float

    @property
    def uri(self) -> str:
        return f"hdfs://127.0.0.1:{self.port}"


def minicluster_jars() -> Path:
    """The cached jar directory, fetched on first use; ``HdfsUnavailable`` if it
    cannot be."""
    done = subprocess.run(["bash", str(FETCH_SCRIPT)], capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        raise HdfsUnavailable(done.stderr.strip()[-600:])
    return Path(done.stdout.strip().splitlines()[-1])


def _details(path: Path) -> dict[str, Any] | None:
    try:
        parsed = json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # not written yet, or half written
    return parsed if isinstance(parsed, dict) and "namenode_port" in parsed else None


@contextlib.contextmanager
def running_hdfs(base_dir: Path) -> Iterator[MiniHdfs]:
    """Start a mini cluster with its data and log under ``base_dir``; yield it once the
    manager wrote its details file (after the NameNode and DataNode are up: ``-nnport
    0`` lets it pick a free port, which the file names); stop its process group on
    exit. Raises ``HdfsUnavailable`` without the jars, ``RuntimeError`` if it does not
    start (with its log's tail)."""
    jars = minicluster_jars()
    base_dir.mkdir(parents=True, exist_ok=True)
    details = base_dir / "nn.json"
    log = base_dir / "minicluster.log"
    started = time.monotonic()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            ["java", "-Xmx768m", f"-Dtest.build.data={base_dir / 'data'}",
             "-cp", f"{jars}/*", "org.apache.hadoop.test.MiniDFSClusterManager",
             "-format", "-nnport", "0", "-datanodes", "1", "-writeDetails", str(details)],
            cwd=base_dir, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        while (found := _details(details)) is None:
            if proc.poll() is not None or time.monotonic() - started > STARTUP_S:
                raise RuntimeError("the HDFS mini cluster did not start:\n"
                                   + log.read_text()[-5000:])
            time.sleep(0.2)
        yield MiniHdfs(int(found["namenode_port"]), base_dir,
                       round(time.monotonic() - started, 1))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)


def hadoop_fs(spark: Any, uri: str) -> tuple[Any, Any]:
    """The Hadoop ``FileSystem`` of ``uri`` in ``spark``'s JVM, and its ``Path`` class."""
    path = spark._jvm.org.apache.hadoop.fs.Path
    return path(uri).getFileSystem(spark._jsc.hadoopConfiguration()), path


def make_dir(spark: Any, uri: str, *, snapshots: bool) -> str:
    """Create ``uri`` on HDFS; ``snapshots``: allow snapshots on it (what an
    administrator's ``hdfs dfsadmin -allowSnapshot`` does). Returns ``uri``."""
    fs, path = hadoop_fs(spark, uri)
    fs.mkdirs(path(uri))
    if snapshots:
        fs.allowSnapshot(path(uri))
    return uri
