"""Spark feature detection and the pyspark install check (no JVM started)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from airflow_ckpt.errors import SparkSetupError
from airflow_ckpt.runtime.job import spark_features
from airflow_ckpt.runtime.job.spark_features import (
    check_supported,
    pyspark_install_problems,
    require_offline_repartition,
)


class Spark40Session:
    """A session object as pyspark 4.0/4.1 have it: no _streamingCheckpointManager."""

    version = "4.1.3"


class Spark42Session:
    version = "4.2.0"

    @property
    def _streamingCheckpointManager(self) -> str:
        return "manager"


def test_offline_repartition_detected_or_explained() -> None:
    assert require_offline_repartition(Spark42Session()) == "manager"
    with pytest.raises(SparkSetupError) as err:
        require_offline_repartition(Spark40Session())
    message = str(err.value)
    assert "Spark 4.2" in message and "4.1.3" in message and "state_partitions" in message


def test_the_installed_pyspark_has_the_feature_it_is_pinned_for() -> None:
    from pyspark.sql import SparkSession

    assert spark_features.offline_repartition_available(SparkSession.__new__(SparkSession))


@pytest.mark.parametrize(("version", "ok"), [
    ("4.0.0", True), ("4.2.1", True), ("3.5.6", False), ("4.3.0", False)])
def test_supported_versions(version: str, ok: bool) -> None:
    if ok:
        check_supported(version)
    else:
        with pytest.raises(SparkSetupError, match=r"4\.0 to 4\.2"):
            check_supported(version)


def test_this_venv_has_a_consistent_pyspark() -> None:
    """`make venv` installs the `spark` extra without a reinstall step: the tree is whole."""
    assert pyspark_install_problems() == []


def test_a_file_overwritten_by_another_pyspark_client_is_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Simulate pyspark-client X installed over pyspark Y: the real RECORD entry of
    ``pyspark/version.py``, a changed file under a fake site directory."""
    import importlib.metadata

    real = importlib.metadata.distribution("pyspark")
    entry = next(f for f in real.files or () if str(f) == "pyspark/version.py")
    site = tmp_path / "site"
    (site / "pyspark" / "jars").mkdir(parents=True)
    (site / "pyspark" / "version.py").write_text('__version__: str = "4.0.0"\n')
    (site / "pyspark" / "jars" / f"spark-core_2.13-{real.version}.jar").write_bytes(b"")

    class Fake:
        version = real.version
        files = [entry]

        def locate_file(self, path: object) -> Path:
            return site / str(path)

    monkeypatch.setattr(importlib.metadata, "distribution", lambda name: Fake())
    problems = pyspark_install_problems()
    assert len(problems) == 1 and "pyspark/version.py" in problems[0]
    assert "pip install" in problems[0]
    (site / "pyspark" / "version.py").write_bytes(Path(str(real.locate_file(entry))).read_bytes())
    assert pyspark_install_problems() == []


def test_only_the_client_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.metadata

    def distribution(name: str) -> Any:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", distribution)
    monkeypatch.setattr(spark_features, "_version_or_none", lambda name: "4.2.0")
    problems = pyspark_install_problems()
    assert "airflow-ckpt[spark]" in problems[0] and "pyspark-client 4.2.0" in problems[0]
    assert sys.modules["airflow_ckpt.runtime.job.spark_features"] is spark_features
