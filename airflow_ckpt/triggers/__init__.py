"""Deferrable triggers: ``CheckpointTrigger`` (deferred tasks) and ``CheckpointEventTrigger``
(``AssetWatcher``). Import them from :mod:`airflow_ckpt.triggers.checkpoint`.

:mod:`airflow_ckpt.triggers.matching` (the shared condition logic) imports no Airflow,
so this package's ``__init__`` imports nothing either.
"""
