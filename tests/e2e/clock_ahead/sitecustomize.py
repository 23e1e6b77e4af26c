"""Test-only: the wall clock of a Python process started with this directory on its
``PYTHONPATH`` runs ``AIRFLOW_CKPT_E2E_CLOCK_OFFSET_S`` seconds off the machine's.

The deferred-supervision e2e (tests/e2e/test_real_supervision.py) starts the Spark driver
with it, so the driver behaves as if its host's clock were an hour ahead of the Airflow
processes': every timestamp the runtime writes (history ``ts``, lease heartbeats, manifest
timings, control answers) is skewed, and nothing the supervision decides may depend on it.
Only ``time.time``/``time.time_ns`` move; monotonic clocks (which the runtime uses for
every duration) do not.
"""

from __future__ import annotations

import os
import time

_OFFSET_S = float(os.environ.get("AIRFLOW_CKPT_E2E_CLOCK_OFFSET_S") or 0)

if _OFFSET_S:
    _real_time, _real_time_ns = time.time, time.time_ns
    time.time = lambda: _real_time() + _OFFSET_S
    time.time_ns = lambda: _real_time_ns() + int(_OFFSET_S * 1e9)
