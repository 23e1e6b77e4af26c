"""Parts of the deterministic whole-system simulation (:mod:`airflow_ckpt.testing.simulation`).

* :mod:`.scheduler`: actors in threads that run one at a time (a baton handed at every
  storage call), seeded choices, per-host virtual clocks;
* :mod:`.storage`: an in-memory :class:`~airflow_ckpt.runtime.storage.base.CheckpointStorage`
  that enforces every condition and injects seeded faults;
* :mod:`.flink`: an independent reference model of Flink's restart strategies;
* :mod:`.outcome`: what one seed of one world produced (violations, trace);
* :mod:`.sinks`, :mod:`.savepoints`: the sink and savepoint worlds;
"""
