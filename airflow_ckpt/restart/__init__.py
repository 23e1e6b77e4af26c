"""Flink 2.x restart strategies, in pure Python (no Airflow, no Spark imports).

Usage::

    strategy = restart_strategy_from_params({"type": "fixed-delay",
                                             "fixed-delay.attempts": 3,
                                             "fixed-delay.delay": "10 s"})
    decision = strategy.on_failure(time.time())   # records the failure, decides
    if decision.restart:
        sleep(decision.delay_s); restart()
    save(strategy.state_dict())                   # continue later with state=...

Matched against Apache Flink 2.x (``master`` after the 2.0 package move, read for
the 2.0-2.3 line), files under
``flink-runtime/src/main/java/org/apache/flink/runtime/executiongraph/failover/``:
``ExponentialDelayRestartBackoffTimeStrategy.java`` and
``FixedDelayRestartBackoffTimeStrategy.java`` at commit bb437bd07f583ffa4c86bc525659abe477d6d051,
``FailureRateRestartBackoffTimeStrategy.java`` at e9529d4d7ec517412ed8c2534a17b4bcd5ff240f,
``NoRestartBackoffTimeStrategy.java`` at 47a02f63da293edfcace2996d2df33db2b888564,
``RestartBackoffTimeStrategyFactoryLoader.java`` at 27af78cd8d36b44ce405bab8aa9f910f1e8e3750
and ``ExecutionFailureHandler.java`` (call order) at 6113046f4659244842043d5854ba95b275b6ec55;
option names and defaults from ``flink-core/.../configuration/RestartStrategyOptions.java``
(the 2.x version with ``restart-strategy.type`` and
``exponential-delay.attempts-before-reset-backoff``). See docs/restart-strategies.md.
"""

from airflow_ckpt.restart.base import RestartDecision, RestartStrategy
from airflow_ckpt.restart.exponential_delay import ExponentialDelayRestartStrategy
from airflow_ckpt.restart.failure_rate import FailureRateRestartStrategy
from airflow_ckpt.restart.fixed_delay import FixedDelayRestartStrategy
from airflow_ckpt.restart.no_restart import NoRestartStrategy
from airflow_ckpt.restart.options import (
    ExponentialDelayOptions,
    FailureRateOptions,
    FixedDelayOptions,
    NoRestartOptions,
    StrategyOptions,
)
from airflow_ckpt.restart.params import (
    parse_restart_params,
    restart_strategy_from_params,
    strategy_from_options,
)
from airflow_ckpt.restart.schema import restart_params_json_schema

__all__ = [
    "ExponentialDelayOptions",
    "ExponentialDelayRestartStrategy",
    "FailureRateOptions",
    "FailureRateRestartStrategy",
    "FixedDelayOptions",
    "FixedDelayRestartStrategy",
    "NoRestartOptions",
    "NoRestartStrategy",
    "RestartDecision",
    "RestartStrategy",
    "StrategyOptions",
    "parse_restart_params",
    "restart_params_json_schema",
    "restart_strategy_from_params",
    "strategy_from_options",
]
