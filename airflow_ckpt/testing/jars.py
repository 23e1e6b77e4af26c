"""The jars the Kafka tests, ``make kafka`` and the Kafka example need, fetched once.

Two closures from Maven Central, each cached under
``~/.cache/airflow-ckpt/jars/<artifact>/<version>/`` (``$AIRFLOW_CKPT_CACHE`` moves the
root) and used offline afterwards:

* :data:`BROKER`: ``org.apache.kafka:kafka_2.13`` and its runtime jars (a KRaft broker
  started with ``java -cp 'dir/*' kafka.Kafka``; ~43 MB);
* :func:`connector`: ``org.apache.spark:spark-sql-kafka-0-10_2.13`` at the installed
  pyspark's version, with what it needs beyond the jars pyspark ships (the token
  provider, ``kafka-clients``, ``commons-pool2``; ~7 MB), for ``spark.jars``;
* :func:`hadoop_aws`: ``org.apache.hadoop:hadoop-aws`` at the Hadoop version pyspark
  ships, with the AWS SDK v2 ``bundle`` it is built against (~690 MB: only for
  ``make bench-s3a``, never fetched by ``make venv`` or the tests).

Versions are pinned here and nowhere else; the connector's follows pyspark, because a
connector of another Spark version fails at run time with linkage errors. Fetching runs
``mvn dependency:copy-dependencies`` against a generated POM into a temporary directory
renamed into place when complete, so an interrupted fetch leaves nothing half-made.

``python -m airflow_ckpt.testing.jars`` (``scripts/fetch_jars.sh``, called by
``make venv``) fetches the first two and prints their directories; ``--s3a`` fetches
:func:`hadoop_aws` instead.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from airflow_ckpt.errors import AirflowCkptError

#: the Kafka broker the tests and ``make kafka`` run (KRaft; 4.x has no ZooKeeper mode)
KAFKA_VERSION = "4.4.0"
SCALA = "2.13"


class JarFetchError(AirflowCkptError):
    """The jars are not cached and could not be fetched from Maven Central."""


@dataclass(frozen=True, slots=True)
class Closure:
    """One Maven artifact and the jars of its runtime closure that are copied."""

    group: str
    artifact: str
    version: str
    #: leave out the jars whose artifact pyspark's ``jars/`` already holds (at its own
    #: version: two versions of one class on Spark's class path is a linkage error)
    beside_pyspark: bool = False

    @property
    def coordinate(self) -> str:
        return f"{self.group}:{self.artifact}:{self.version}"

    def directory(self, root: Path | None = None) -> Path:
        return (root or cache_root()) / self.artifact / self.version

    def classpath(self, root: Path | None = None) -> list[Path]:
        """The cached jars, fetched first if needed."""
        directory = fetch(self, root)
        return sorted(directory.glob("*.jar"))


BROKER = Closure("org.apache.kafka", f"kafka_{SCALA}", KAFKA_VERSION)


def connector(spark_version: str | None = None) -> Closure:
    """The Kafka connector matching ``spark_version`` (default: the installed pyspark)."""
    if spark_version is None:
        from pyspark import __version__

        spark_version = str(__version__)
    return Closure("org.apache.spark", f"spark-sql-kafka-0-10_{SCALA}", spark_version,
                   beside_pyspark=True)


def hadoop_aws(hadoop_version: str | None = None) -> Closure:
    """S3A (``hadoop-aws``) matching ``hadoop_version`` (default: the Hadoop pyspark
    ships) with its runtime closure: the AWS SDK v2 ``bundle``, the analytics
    accelerator and wildfly-openssl. Its version follows Hadoop's, because S3A of another
    release fails at run time with linkage errors against ``hadoop-client-api``."""
    return Closure("org.apache.hadoop", "hadoop-aws", hadoop_version or pyspark_hadoop(),
                   beside_pyspark=True)


def pyspark_hadoop() -> str:
    """The Hadoop version of the ``hadoop-client-api`` jar pyspark ships (``3.5.0``)."""
    import pyspark

    jars = (Path(pyspark.__file__).parent / "jars").glob("hadoop-client-api-*.jar")
    for jar in jars:
        return jar.name.removeprefix("hadoop-client-api-").removesuffix(".jar")
    raise JarFetchError("pyspark ships no hadoop-client-api jar: cannot tell which "
                        "hadoop-aws matches it")


def artifact_id(jar: str) -> str:
    """``"zstd-jni-1.5.7-7.jar"`` -> ``"zstd-jni"`` (the name up to its version)."""
    match = re.match(r"(.+?)-\d[^-]*(?:-.*)?\.jar$", jar)
    return match[1] if match else jar


def _pyspark_artifacts() -> set[str]:
    import pyspark

    return {artifact_id(p.name) for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}


def cache_root() -> Path:
    base = os.environ.get("AIRFLOW_CKPT_CACHE") or str(Path.home() / ".cache" / "airflow-ckpt")
    return Path(base) / "jars"


_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>airflow-ckpt.local</groupId><artifactId>fetch</artifactId><version>0</version>
  <dependencies><dependency>
    <groupId>{group}</groupId><artifactId>{artifact}</artifactId><version>{version}</version>
  </dependency></dependencies>
</project>
"""


def fetch(closure: Closure, root: Path | None = None) -> Path:
    """The directory holding ``closure``'s jars, fetched with Maven if not cached.

    Durable on return: the directory is complete (it appears by one rename). Raises
    :class:`JarFetchError` naming the artifact, the cache directory and Maven's last
    lines when Maven is missing or cannot fetch.
    """
    target = closure.directory(root)
    if target.is_dir():
        return target
    mvn = shutil.which("mvn")
    if mvn is None:
        raise JarFetchError(
            f"{closure.coordinate} is not in {target} and Maven ('mvn') is not installed "
            "to fetch it (Debian/Ubuntu: apt-get install maven; or put the jars there by "
            "hand)")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".fetch-") as tmp:
        work = Path(tmp)
        (work / "pom.xml").write_text(_POM.format(
            group=closure.group, artifact=closure.artifact, version=closure.version))
        out = work / "jars"
        argv = [mvn, "-B", "-q", "-f", str(work / "pom.xml"),
                "dependency:copy-dependencies", "-DincludeScope=runtime",
                f"-DoutputDirectory={out}"]
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode != 0 or not any(out.glob("*.jar")):
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
            raise JarFetchError(
                f"could not fetch {closure.coordinate} into {target} with Maven (exit "
                f"{done.returncode}); Maven Central must be reachable the first time, "
                f"offline afterwards. Maven said:\n{tail}")
        if closure.beside_pyspark:
            shipped = _pyspark_artifacts()
            for jar in out.glob("*.jar"):
                if artifact_id(jar.name) in shipped:
                    jar.unlink()
        out.rename(target)
    return target


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    closures = (hadoop_aws(),) if "--s3a" in args else (BROKER, connector())
    for closure in closures:
        cached = closure.directory().is_dir()
        started = time.monotonic()
        try:
            directory = fetch(closure)
        except JarFetchError as exc:
            print(f"ERROR: {exc}", file=sys.stderr)
            return 1
        size = sum(p.stat().st_size for p in directory.glob("*.jar")) / 1e6
        how = "cached" if cached else f"fetched in {time.monotonic() - started:.1f} s"
        print(f"{closure.coordinate}: {directory} ({size:.1f} MB, {how})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
