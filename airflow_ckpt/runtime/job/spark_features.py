"""Which Spark the driver really has, and whether it can do what a job asks.

The runtime supports Spark 4.0 to 4.2 (:data:`SUPPORTED`). Features newer than 4.0 are
detected at run time, not assumed from a version pin, and a missing one is an error that
names the feature, the Spark version found and what to do:

* offline state repartitioning (``StreamingCheckpointManager.repartition``, Spark 4.2+),
  used to restore a savepoint with a different number of state partitions
  (``state_partitions``): :func:`require_offline_repartition`.

:func:`pyspark_install_problems` checks that the installed ``pyspark`` tree is the one its
jars belong to. ``pyspark`` and ``pyspark-client`` (a dependency of the Airflow Spark
provider) install the same ``pyspark`` package; at the same version the client's files are
byte-identical to the full package's, at different versions the one installed last
overwrites the other's Python files and Python and JVM disagree.

No Airflow import; pyspark is imported only when a function needs it.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import re
from pathlib import Path
from typing import Any

from airflow_ckpt.errors import SparkSetupError

#: Spark versions the runtime runs on (the ``pyspark`` requirement it is tested with is
#: the ``spark`` extra's pin).
SUPPORTED = (4, 0), (4, 3)  # [from, to)


def parse_version(text: str) -> tuple[int, int, int]:
    """``"4.2.0"`` / ``"4.2.0-SNAPSHOT"`` -> ``(4, 2, 0)``."""
    match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    if not match:
        raise ValueError(f"not a Spark version: {text!r}")
    return int(match[1]), int(match[2]), int(match[3] or 0)


def spark_version(spark: Any = None) -> str:
    """The running session's Spark version, else the installed pyspark's."""
    if spark is not None:
        return str(spark.version)
    from pyspark import __version__

    return str(__version__)


def check_supported(version: str) -> None:
    """Raise :class:`SparkSetupError` for a Spark outside :data:`SUPPORTED`."""
    low, high = SUPPORTED
    if not low <= parse_version(version)[:2] < high:
        raise SparkSetupError(
            f"Spark {version} is not supported by airflow-ckpt: it runs on Spark "
            f"{low[0]}.{low[1]} to {high[0]}.{high[1] - 1}"
        )


def offline_repartition_available(spark: Any) -> bool:
    """Whether this session has Spark 4.2's offline state repartitioning."""
    try:
        return hasattr(type(spark), "_streamingCheckpointManager")
    except Exception:  # pragma: no cover - defensive: a broken session object
        return False


def require_offline_repartition(spark: Any) -> Any:
    """The session's ``StreamingCheckpointManager``; a clear error without one.

    ``CheckpointedJob._rescale`` calls ``require_offline_repartition(self.spark)
    .repartition(...)`` instead of reaching for the private attribute directly.
    """
    if not offline_repartition_available(spark):
        raise SparkSetupError(
            "restoring with a different number of state partitions (state_partitions) "
            "needs Spark 4.2 or later (offline state repartitioning, "
            f"StreamingCheckpointManager.repartition); this driver runs Spark "
            f"{spark_version(spark)}. Restore with the savepoint's own partition count, "
            "or run the job on Spark 4.2+."
        )
    return spark._streamingCheckpointManager


def _record_hash(path: Path) -> str:
    digest = hashlib.sha256(path.read_bytes()).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def pyspark_install_problems() -> list[str]:
    """What is wrong with the installed pyspark (empty: consistent).

    Checks that the full ``pyspark`` distribution is installed (not only
    ``pyspark-client``, which has no jars and no ``spark-submit``), that its jars are of its
    version, and that none of its Python files were overwritten by a ``pyspark-client`` of
    another version. Reads the distribution's RECORD; costs ~0.1 s.
    """
    try:
        dist = importlib.metadata.distribution("pyspark")
    except importlib.metadata.PackageNotFoundError:
        client = _version_or_none("pyspark-client")
        hint = (f" (only pyspark-client {client}, the Spark Connect client, is installed)"
                if client else "")
        return [f"the full pyspark is not installed{hint}: pip install 'airflow-ckpt[spark]'"]
    version = dist.version
    problems = []
    package = Path(str(dist.locate_file("pyspark")))
    jars = sorted((package / "jars").glob("spark-core_*.jar"))
    if not jars:
        problems.append(f"pyspark {version} has no jars under {package / 'jars'}")
    elif not jars[0].name.endswith(f"-{version}.jar"):
        problems.append(f"pyspark {version}'s jars are of another version ({jars[0].name})")
    changed = []
    for entry in dist.files or ():
        if entry.hash is None or not str(entry).endswith(".py"):
            continue
        path = Path(str(dist.locate_file(entry)))
        if not path.exists() or _record_hash(path) != f"{entry.hash.mode}={entry.hash.value}":
            changed.append(str(entry))
    if changed:
        client = _version_or_none("pyspark-client")
        culprit = f"pyspark-client {client}" if client else "another installation"
        problems.append(
            f"{len(changed)} Python files of pyspark {version} were overwritten by {culprit} "
            f"(e.g. {', '.join(sorted(changed)[:3])}): install the same version of both, "
            f"e.g. pip install 'pyspark=={client or version}' 'pyspark-client=={client or version}'"
            f", or restore pyspark with pip install --force-reinstall --no-deps "
            f"'pyspark=={version}'"
        )
    return problems


def check_pyspark_install() -> None:
    """Raise :class:`SparkSetupError` listing :func:`pyspark_install_problems`."""
    problems = pyspark_install_problems()
    if problems:
        raise SparkSetupError("pyspark is not installed correctly:\n  - " + "\n  - ".join(problems))


def _version_or_none(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None
