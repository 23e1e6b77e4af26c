"""Ship the installed ``airflow_ckpt`` package to drivers and executors (``--py-files``)."""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading
import time
import zipfile
from pathlib import Path

import airflow_ckpt

_ZIP_LOCK = threading.Lock()


def runtime_py_files(cache_dir: Path | None = None) -> str:
    """Path of a zip of the installed ``airflow_ckpt`` package, for ``--py-files``.

    Why always ship it: in client mode the driver could import the installed package
    (same interpreter), but executors on other hosts, standalone/YARN/K8s cluster-mode
    drivers, and a driver started with another interpreter could not, or would import a
    different version. One zip works everywhere and pins the runtime to the operator's
    version. It is built once per content (version + every file's path, size and mtime,
    so an editable install's edits are picked up) into a cache directory and reused;
    the write is atomic, so concurrent tasks never see a half-written zip.
    """
    package_dir = Path(airflow_ckpt.__file__).resolve().parent
    files = sorted(
        p for p in package_dir.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix in (".py", ".typed")
    )
    digest = hashlib.sha256(airflow_ckpt.__version__.encode())
    for path in files:
        stat = path.stat()
        digest.update(f"{path.relative_to(package_dir)}\0{stat.st_size}\0{stat.st_mtime_ns}\n"
                      .encode())
    cache = cache_dir or Path(tempfile.gettempdir()) / "airflow-ckpt-py-files"
    target = cache / f"airflow_ckpt-{airflow_ckpt.__version__}-{digest.hexdigest()[:16]}.zip"
    with _ZIP_LOCK:
        if target.exists():
            return str(target)
        cache.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(f".{os.getpid()}.{time.monotonic_ns()}.tmp")
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as archive:
            for path in files:
                archive.write(path, Path("airflow_ckpt") / path.relative_to(package_dir))
        os.replace(tmp, target)
    return str(target)
