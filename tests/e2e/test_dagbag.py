"""The example DAGs import cleanly and parse fast.

Each file is parsed in its own fresh interpreter (with its own ``AIRFLOW_HOME``) that
has imported Airflow but none of the DAG's own modules - the situation of Airflow's DAG
processor, which parses each file in a new process - and only the parse is timed, in CPU
seconds of that interpreter. The bound of 1 s is generous: a correctness guard against
heavy top-level work, not a benchmark. CPU time and not wall time, because the suite runs
in two workers on a machine that may be busy with other work (at load average 20 one
file's parse took 1.7 s of wall time, its neighbours' 0.5 s: no defect of the DAG file).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

DAGS = Path(__file__).resolve().parents[2] / "dags"
MAX_PARSE_S = 1.0

PROBE = """
import json, sys, time
from airflow.dag_processing.dagbag import DagBag

out = {}
for path in sys.argv[1:]:
    started, started_cpu = time.perf_counter(), time.process_time()
    bag = DagBag(dag_folder=path, safe_mode=False)
    out[path] = {
        "cpu_seconds": time.process_time() - started_cpu,
        "wall_seconds": time.perf_counter() - started,
        "dag_ids": sorted(bag.dag_ids),
        "errors": {k: str(v) for k, v in bag.import_errors.items()},
    }
print("RESULT" + json.dumps(out))
"""


@pytest.fixture(scope="module")
def parsed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    files = sorted(str(p) for p in DAGS.glob("*.py"))
    assert files, f"no DAG files in {DAGS}"
    home = tmp_path_factory.mktemp("dagbag_home")
    env = {**os.environ, "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
           "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS)}
    result: dict[str, dict] = {}
    for path in files:
        proc = subprocess.run([sys.executable, "-c", PROBE, path], env=env,
                              capture_output=True, text=True, timeout=300, check=False)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT")]
        assert proc.returncode == 0 and lines, proc.stdout + proc.stderr
        result.update(json.loads(lines[-1][len("RESULT"):]))
    return result


def test_no_import_errors(parsed: dict[str, dict]) -> None:
    for path, info in parsed.items():
        assert info["errors"] == {}, f"{path}: {info['errors']}"
        assert info["dag_ids"], f"{path} defines no DAG"
    assert any("checkpointed_streaming_job" in info["dag_ids"] for info in parsed.values())


def test_every_dag_file_parses_in_well_under_a_second(parsed: dict[str, dict]) -> None:
    slow = {path: (round(info["cpu_seconds"], 3), round(info["wall_seconds"], 3))
            for path, info in parsed.items() if info["cpu_seconds"] >= MAX_PARSE_S}
    assert not slow, f"DAG files parsing in >= {MAX_PARSE_S} s of CPU (CPU s, wall s): {slow}"
