"""The runtime runs inside Spark drivers that have no Airflow: prove it imports without."""

from __future__ import annotations

import subprocess
import sys

BLOCKER = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "airflow" or name.startswith("airflow."):
            raise ImportError("airflow is blocked in this test: " + name)
        return None
sys.meta_path.insert(0, Block())
import pkgutil, importlib, airflow_ckpt.runtime, airflow_ckpt.restart
for pkg in (airflow_ckpt.runtime, airflow_ckpt.restart):
    for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
        importlib.import_module(info.name)
importlib.import_module("airflow_ckpt.testing.numbers")
print("ok", len([m for m in sys.modules if m.startswith("airflow_ckpt.runtime")]))
"""


def test_runtime_and_restart_import_with_airflow_blocked() -> None:
    result = subprocess.run([sys.executable, "-c", BLOCKER], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    modules = int(result.stdout.split()[1])
    assert modules > 15  # every runtime module was really imported


def test_the_blocker_really_blocks() -> None:
    result = subprocess.run(
        [sys.executable, "-c", BLOCKER.replace("import pkgutil", "import airflow\nimport pkgutil")],
        capture_output=True, text=True,
    )
    assert result.returncode != 0 and "airflow is blocked" in result.stderr
