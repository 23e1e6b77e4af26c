"""Import of a plain Spark checkpoint as a savepoint, and export back (no Spark: a
directory shaped like Spark's, file storage). The real-Spark round trip is
tests/integration/test_import_export.py."""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

import pytest

from airflow_ckpt.cli import main as cli_main
from airflow_ckpt.errors import (
    CorruptCheckpointError,
    NotASparkCheckpointError,
    SavepointError,
    SparkCheckpointError,
    SparkQueryRunningError,
)
from airflow_ckpt.plugins import overview
from airflow_ckpt.runtime import interleave
from airflow_ckpt.runtime.adopt.exporter import export_checkpoint
from airflow_ckpt.runtime.adopt.importer import import_spark_checkpoint
from airflow_ckpt.runtime.adopt.spark_dir import SparkCheckpoint, open_spark_checkpoint
from airflow_ckpt.runtime.checkpoint.catalog import CheckpointCatalog
from airflow_ckpt.runtime.history import events as ev
from airflow_ckpt.runtime.history.journal import JobHistory
from airflow_ckpt.runtime.restore.choose import restore
from airflow_ckpt.runtime.storage import CheckpointStorage
from airflow_ckpt.runtime.storage.delegating import DelegatingStorage
from airflow_ckpt.runtime.storage.layout import JobLayout
from tests.fixtures.snapshots import make_manifest, write_snapshot
from tests.unit.test_snapshot_capture import make_workdir

JOB = "adopter"


def files_of(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes()
            for p in root.rglob("*") if p.is_file()}


def test_the_last_committed_batch_becomes_a_savepoint_restored_as_it_was(
        file_storage: CheckpointStorage, tmp_path: Path) -> None:
    own = make_workdir(tmp_path, batches=4, running=False)
    done = import_spark_checkpoint(file_storage, JOB, SparkCheckpoint(own), "first")
    m = done.manifest
    assert (m.kind, m.batch_id, m.savepoint_id, m.query_id) == ("savepoint", 3, "first", "q1")
    assert m.source_offsets == [{"logOffset": 3}] and m.extra["imported_from"] == own.as_uri()
    assert all(not f.shared and f.key.startswith("savepoints/sp-first/import-")
               for f in m.files)
    assert CheckpointCatalog(file_storage, JOB).savepoint("first") == m
    assert not list(tmp_path.glob(".work.import-*"))  # the staging links are gone
    (event,) = JobHistory(file_storage, JOB).events([ev.SAVEPOINT_COMPLETED])
    assert event.data["imported_from"] == own.as_uri() and event.data["batch_id"] == 3
    stats = overview.checkpoint_stats(file_storage, JOB, overview.read_history(
        file_storage, JOB, 100))  # what the UI's job page shows
    (shown,) = [e for e in stats["history"] if e["savepoint_id"] == "first"]
    assert shown["imported_from"] == own.as_uri() and not shown["discarded"]
    # a job restores it: exactly Spark's files of batch 3 (state version 4)
    work = tmp_path / "restored"
    restored = restore(file_storage, JOB, "savepoints/sp-first", work, JobHistory(
        file_storage, JOB))
    assert restored.batch_id == 3
    assert files_of(work) == {k: v for k, v in files_of(own).items()
                              if not k.endswith((".crc", ".tmp"))}


def test_a_batch_planned_and_not_committed_is_refused_unless_told_it_is_stopped(
        file_storage: CheckpointStorage, tmp_path: Path) -> None:
    own = make_workdir(tmp_path, batches=3, running=True)  # offsets/3, no commits/3
    with pytest.raises(SparkQueryRunningError, match=r"batch 3 is planned .*\(last commit: "
                       r"batch 2\)"):
        import_spark_checkpoint(file_storage, JOB, SparkCheckpoint(own))
    assert file_storage.list(JOB + "/") == []  # nothing written
    done = import_spark_checkpoint(file_storage, JOB, SparkCheckpoint(own),
                                   allow_uncommitted=True)
    assert done.manifest.batch_id == 2 and done.manifest.savepoint_id == "spark-q1-b2"
    assert "offsets/3" not in {f.path for f in done.manifest.files}
    with pytest.raises(SavepointError, match="never replaced"):  # the default name again
        import_spark_checkpoint(file_storage, JOB, SparkCheckpoint(own),
                                allow_uncommitted=True)


def test_what_is_not_a_spark_checkpoint_is_refused(file_storage: CheckpointStorage,
                                                   tmp_path: Path) -> None:
    (tmp_path / "table").mkdir()
    (tmp_path / "table" / "part-0.parquet").write_text("x")
    with pytest.raises(NotASparkCheckpointError, match="metadata file with a query id"):
        import_spark_checkpoint(file_storage, JOB, SparkCheckpoint(tmp_path / "table"))
    with pytest.raises(NotASparkCheckpointError, match="not a directory"):
        import_spark_checkpoint(file_storage, JOB, SparkCheckpoint(tmp_path / "none"))
    fresh = tmp_path / "fresh"
    (fresh / "offsets").mkdir(parents=True)
    (fresh / "metadata").write_text('{"id":"q2"}')
    with pytest.raises(NotASparkCheckpointError, match="no batch was ever committed"):
        import_spark_checkpoint(file_storage, JOB, SparkCheckpoint(fresh))

    def no_spark() -> Any:
        raise AssertionError("a Spark session is started only for hdfs://")

    with pytest.raises(SparkCheckpointError, match=r"s3a:// is not a filesystem"):
        open_spark_checkpoint("s3a://bucket/ckpt", no_spark)
    local = open_spark_checkpoint((tmp_path / "x").as_uri(), no_spark)
    assert isinstance(local, SparkCheckpoint) and local.workdir == tmp_path / "x"


def test_a_savepoint_of_that_name_landing_first_wins_and_the_import_leaves_nothing(
        file_storage: CheckpointStorage, tmp_path: Path) -> None:
    own = make_workdir(tmp_path, batches=2, running=False)
    landed = []

    def land_first() -> None:  # another writer's marker, after our existence check
        landed.append(write_snapshot(file_storage, JOB, 99, savepoint_id="race"))

    with interleave.installed(interleave.COMPLETE_BEFORE_METADATA, land_first), \
            pytest.raises(SavepointError, match="never replaced"):
        import_spark_checkpoint(file_storage, JOB, SparkCheckpoint(own), "race")
    assert CheckpointCatalog(file_storage, JOB).savepoint("race") == landed[0]  # untouched
    layout = JobLayout(JOB)
    assert not [i.key for i in file_storage.list(layout.savepoint_dir("race"))
                if "/import-" in i.key]  # our files removed


class _Corrupting(DelegatingStorage):
    """Stores a wrong byte in the commit log entry of batch 1."""

    def upload_file(self, path: Path, key: str) -> None:
        super().upload_file(path, key)
        self._damage(key)

    def upload_file_hashed(self, path: Path, key: str) -> str:
        digest = super().upload_file_hashed(path, key)
        self._damage(key)
        return digest

    def _damage(self, key: str) -> None:
        if key.endswith("/commits/1"):
            self.inner.put_bytes(key, b"damaged")


def test_an_upload_that_does_not_read_back_is_never_named_by_a_marker(
        file_storage: CheckpointStorage, tmp_path: Path) -> None:
    own = make_workdir(tmp_path, batches=2, running=False)
    with pytest.raises(CorruptCheckpointError, match="commits/1"):
        import_spark_checkpoint(_Corrupting(file_storage), JOB, SparkCheckpoint(own), "x")
    assert file_storage.list(JOB + "/") == []  # nothing left, no marker


def test_export_writes_a_plain_spark_directory_and_refuses_a_used_target(
        file_storage: CheckpointStorage, tmp_path: Path) -> None:
    own = make_workdir(tmp_path, batches=3, running=False)
    m = import_spark_checkpoint(file_storage, JOB, SparkCheckpoint(own), "sp").manifest
    used = tmp_path / "used"
    used.mkdir()
    (used / "keep").write_text("mine")
    with pytest.raises(SparkCheckpointError, match="not an empty directory"):
        export_checkpoint(file_storage, m, used)
    assert files_of(used) == {"keep": b"mine"}
    (tmp_path / "empty").mkdir()
    for target in (tmp_path / "empty", tmp_path / "new" / "dir"):
        done = export_checkpoint(file_storage, m, target)
        assert done.batch_id == 2
        # what Spark needs to resume at batch 3: the logs, and state up to version 3
        assert files_of(target) == {k: v for k, v in files_of(own).items()
                                    if not k.endswith((".crc", ".tmp"))}
    assert not list(tmp_path.glob(".*.restore-*"))
    empty = make_manifest(JOB, 5, batch_id=-1, files=())
    with pytest.raises(SparkCheckpointError, match="covers no batch"):
        export_checkpoint(file_storage, empty, tmp_path / "nothing")
    assert not (tmp_path / "nothing").exists()


def test_the_cli_imports_describes_and_exports(file_storage: CheckpointStorage, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    own = make_workdir(tmp_path, batches=2, running=False)
    (tmp_path / "store").mkdir(exist_ok=True)  # file_storage's root: the CLI wants it

    def cli(*argv: str) -> tuple[int, str]:
        out = io.StringIO()
        code = cli_main(["--storage", file_storage.uri, *argv], out=out)
        return code, out.getvalue()

    code, out = cli("import", str(own), "--job", JOB)
    assert code == 0 and "imported batch 1" in out and "next batch is 2" in out
    code, out = cli("describe", f"{JOB}/sp-spark-q1-b1")
    assert code == 0 and re.search(rf"imported from +{own.as_uri()}\n", out)
    code, out = cli("history", JOB, "--type", ev.SAVEPOINT_COMPLETED)
    # the table wraps long details (at any width, inside a long word too)
    assert code == 0 and f'imported_from="{own.as_uri()}"' in re.sub(r"\s+", "", out)
    assert cli("import", str(own), "--job", JOB)[0] == 1
    assert "never replaced" in capsys.readouterr().err
    code, out = cli("export", f"{JOB}/sp-spark-q1-b1", str(tmp_path / "back"))
    assert code == 0 and "next batch is 2" in out
    assert cli("export", f"{JOB}/sp-spark-q1-b1", str(tmp_path / "back"))[0] == 1
    assert "not an empty directory" in capsys.readouterr().err
