"""Which errors end a job for good: the type says it (``FinalError``, Flink's
``SuppressRestartsException``), and ``CheckpointedJob`` catches that type alone."""

from __future__ import annotations

import pytest

from airflow_ckpt import errors
from airflow_ckpt.errors import FinalError

FINAL = [
    errors.ConfigError, errors.JobSettingsError, errors.RestoreError, errors.NoCheckpointError,
    errors.CorruptCheckpointError, errors.IncompatibleStateError,
    errors.SinkReplayMismatchError, errors.ConcurrentDriverError, errors.SparkSetupError,
    errors.WorkdirNotSharedError,
]
#: a restart (in-process, or by a new driver) may succeed after these
RESTARTABLE = [
    errors.LeaseExpiredError, errors.OutcomeUnknownError, errors.StorageOutageError,
    errors.CheckpointFailureLimitError, errors.CheckpointDeclinedError, errors.StorageError,
    errors.MetadataError,
]


@pytest.mark.parametrize("error", FINAL, ids=lambda e: e.__name__)
def test_final_errors_are_final(error: type[Exception]) -> None:
    assert issubclass(error, FinalError)


@pytest.mark.parametrize("error", RESTARTABLE, ids=lambda e: e.__name__)
def test_restartable_errors_are_not_final(error: type[Exception]) -> None:
    assert not issubclass(error, FinalError)


def test_every_runtime_error_is_defined_in_errors_py() -> None:
    """One hierarchy: no error class of the runtime lives outside ``errors.py``."""
    import importlib
    import pkgutil

    import airflow_ckpt.runtime as runtime

    outside = []
    for info in pkgutil.walk_packages(runtime.__path__, "airflow_ckpt.runtime."):
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if (isinstance(obj, type) and issubclass(obj, BaseException)
                    and obj.__module__ == module.__name__ and not name.startswith("_")):
                outside.append(f"{module.__name__}.{name}")
    assert outside == []
