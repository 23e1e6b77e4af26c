"""The driver's last error, extracted from spark-submit / driver log output (no Airflow).

Used by the supervisor for the blocking path (spark-submit's output tail) and the
deferrable path (the detached driver's log file).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

#: error lines recorded in a FAILURE event / the task's error message
ERROR_LINES = 40

_TRACEBACK = "Traceback (most recent call last):"
_ERROR_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)(:.*)?$")
_JVM_EXCEPTION = re.compile(r'Exception in thread "[^"]*"')
_SPARK_LOG_LINE = re.compile(r"^\d\d/\d\d/\d\d \d\d:\d\d:\d\d (TRACE|DEBUG|INFO|WARN|ERROR) ")
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Exit): .+")


def root_cause(failure: BaseException, limit: int = 500) -> str:
    """One line naming what went wrong in an exception raised in this process.

    A py4j-wrapped Spark error's text embeds the JVM's stack and the Python worker's
    traceback ("An error occurred while calling o54..."); the line wanted is the
    innermost ``SomeError: message``, else a Spark error-class line
    (``[STATE_STORE_X] ...``), else the exception's type and first line.
    """
    lines = [line.strip().removeprefix(": ") for line in str(failure).splitlines()]
    lines = [line for line in lines if line]
    inner = [line for line in lines if _EXCEPTION_LINE.match(line)]
    if inner:
        return inner[-1][:limit]
    classed = [line for line in lines if line.startswith("[")]
    if classed:
        return classed[0][:limit]
    return f"{type(failure).__name__}: {(lines or [''])[0]}"[:limit]


def _last_index(lines: Sequence[str], match: Any) -> int | None:
    found = [i for i, line in enumerate(lines) if match(line)]
    return found[-1] if found else None


def summarize_driver_output(lines: Sequence[str], exit_code: int | None) -> tuple[str, list[str]]:
    """The driver's last error from spark-submit output: (one-line cause, error lines).

    Takes the last Python traceback (or else the last JVM ``Exception in thread``) up
    to its final ``SomeError: message`` line plus the message's continuation lines;
    without either, the last lines of output. The cause is that final error line, or
    "driver exited with code N" when the driver died without one (e.g. ``os._exit``
    or a kill).
    """
    stripped = [line.strip() for line in lines]
    start = _last_index(stripped, lambda line: line == _TRACEBACK)
    if start is None:
        start = _last_index(stripped, lambda line: bool(_JVM_EXCEPTION.search(line)))
    cause = None
    if start is None:
        block = stripped[-20:]
    else:
        rest = stripped[start:]
        error_at = _last_index(rest, lambda line: bool(_ERROR_LINE.match(line)))
        if error_at is None:
            block = rest[:ERROR_LINES]
        else:
            cause = rest[error_at]
            end = error_at + 1
            while end < len(rest) and end - error_at <= 15 and rest[end] \
                    and not _SPARK_LOG_LINE.match(rest[end]):
                end += 1
            block = rest[:end]
    if len(block) > ERROR_LINES:
        block = [*block[:10], "...", *block[-(ERROR_LINES - 11):]]
    if cause is None:
        cause = "driver failed" if exit_code is None else f"driver exited with code {exit_code}"
    elif exit_code is not None:
        cause = f"{cause} (exit code {exit_code})"
    return cause[:1000], [line[:500] for line in block]
