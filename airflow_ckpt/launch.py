"""``python -m airflow_ckpt.launch <exit-file> -- <command...>``: run a detached driver.

Started by :meth:`~airflow_ckpt.hooks.spark_submit.CheckpointedSparkSubmitHook.submit_detached`
in its own session (so restarting the Airflow worker does not kill the driver). Runs the
command, then writes its exit code to ``<exit-file>`` (atomically), so a supervisor on
the same host learns how the submission ended. SIGTERM is forwarded to the command.
No Airflow import.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m airflow_ckpt.launch <exit-file> -- <command...>",
              file=sys.stderr)
        return 2
    exit_path, command = argv[0], argv[2:]
    child = subprocess.Popen(command)
    signal.signal(signal.SIGTERM, lambda *_: child.send_signal(signal.SIGTERM))
    code = child.wait()
    tmp = f"{exit_path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="ascii") as fh:
        fh.write(f"{code}\n")
    os.replace(tmp, exit_path)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
