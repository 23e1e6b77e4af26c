"""A restored transaction whose attempt an earlier driver's recovery aborted, with
only the attempt's ``abort`` outcome stored (that driver lost its lease before its
record swap to ``aborted`` landed): the record still reads ``staged``, so only the
outcome object tells. Recovering a checkpoint that lists the batch must refuse the
restore (``SinkTransactionAbortedError``), never return with nothing published
(simulation seed 102443 of the sinks world)."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_ckpt.errors import SinkTransactionAbortedError
from airflow_ckpt.runtime.sinks import JsonLinesSink
from airflow_ckpt.runtime.sinks.transactions import AttemptOutcome
from airflow_ckpt.runtime.storage import open_storage


def test_recover_refuses_a_batch_whose_outcome_is_abort(tmp_path: Path) -> None:
    storage = open_storage(tmp_path.as_uri())
    JsonLinesSink(storage, "_out").pre_commit(0, [{"n": 0}])  # the run checkpoint 1 covers
    txns = JsonLinesSink(storage, "_out").transactions
    staged = txns.current(0)
    assert staged is not None and staged.state == "staged"
    # a restore=none run's recovery aborts batch 0: its outcome lands, its swap never does
    storage.put_bytes(txns.outcome_key(0, staged.attempt),
                      AttemptOutcome.ABORT.value.encode(), create_only=True)
    successor = JsonLinesSink(storage, "_out")  # restores checkpoint 1 (batch 0)
    with pytest.raises(SinkTransactionAbortedError):
        successor.recover([0])
    assert successor.committed_batches() == []
