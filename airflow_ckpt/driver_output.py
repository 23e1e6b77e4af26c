"""The driver's last error, extracted from spark-submit / driver log output (no Airflow).

Used by the supervisor for the blocking path (spark-submit's output tail) and the
deferrable path (the detached driver's log file).
"""

from __future__ import annotations

import re
import signal
from collections.abc import Sequence
from typing import Any

#: error lines recorded in a FAILURE event / the task's error message
ERROR_LINES = 40

_TRACEBACK = "Traceback (most recent call last):"
_ERROR_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)(:.*)?$")
_JVM_EXCEPTION = re.compile(r'Exception in thread "[^"]*"')
_SPARK_LOG_LINE = re.compile(r"^\d\d/\d\d/\d\d \d\d:\d\d:\d\d (TRACE|DEBUG|INFO|WARN|ERROR) ")
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Exit): .+")
#: a log line's level: Spark's ``25/01/01 10:00:00 INFO ...``, Python logging's
#: ``2025-01-01 10:00:00,123 INFO ...`` (and ``[...]`` / ``-`` decorated variants)
_LOG_LEVEL = re.compile(
    r"^[\[(]?\d[\d/:.,\-TZ ]*[\])]?\s*[-|]?\s*\[?"
    r"(TRACE|DEBUG|INFO|WARN|WARNING|ERROR|FATAL|CRITICAL)\b"
)
_QUIET_LEVELS = frozenset({"TRACE", "DEBUG", "INFO"})
#: exit codes above this are ``128 + signal`` by the shell's (and the JVM's) convention
_SIGNAL_BASE = 128


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


#: exception classes of the JVM side (and py4j's wrapper of them): never "the Python error"
_JVM_PREFIXES = ("java.", "javax.", "org.", "scala.", "com.", "io.", "py4j.")


def python_error(lines: Sequence[str], limit: int = 500) -> str | None:
    """The Python exception a failure comes down to, from its recorded text: the last
    ``SomeError: message`` line whose class is not a JVM (or py4j) one, e.g.
    ``RuntimeError: injected`` inside a ``StreamingQueryException`` and its py4j
    frames; ``Traceback`` headers, frames and log lines never count. None if there is
    no such line (a killed driver, a JVM-only error)."""
    found = None
    for raw in lines:
        for line in str(raw).splitlines():
            line = line.strip().removeprefix(": ")
            if _EXCEPTION_LINE.match(line) and not line.startswith(_JVM_PREFIXES):
                found = line
    return None if found is None else found[:limit]


def _last_index(lines: Sequence[str], match: Any) -> int | None:
    found = [i for i, line in enumerate(lines) if match(line)]
    return found[-1] if found else None


def killed_by(exit_code: int | None) -> signal.Signals | None:
    """The signal that ended the driver, if ``exit_code`` says one did.

    Python's ``Popen.returncode`` is ``-N`` for a child killed by signal ``N``; a shell,
    ``spark-submit``'s JVM (for its Python driver) and the detached launcher report
    ``128 + N`` instead.
    """
    if exit_code is None or exit_code == 0:
        return None
    number = -exit_code if exit_code < 0 else exit_code - _SIGNAL_BASE
    try:
        return signal.Signals(number) if number > 0 else None
    except ValueError:
        return None


def exit_cause(exit_code: int | None) -> str:
    """How the driver ended, when its output names no error: ``driver killed by SIGKILL
    (exit code 137)``, ``driver exited with code 17``, or ``driver failed`` (unknown)."""
    if exit_code is None:
        return "driver failed"
    signal_ = killed_by(exit_code)
    if signal_ is not None:
        return f"driver killed by {signal_.name} (exit code {exit_code})"
    return f"driver exited with code {exit_code}"


def log_level(line: str) -> str | None:
    """The level of a Spark or Python logging line (``WARNING`` as ``WARN``), else None."""
    match = _LOG_LEVEL.match(line)
    if match is None:
        return None
    level = match.group(1)
    return "WARN" if level == "WARNING" else level


def _warnings_and_errors(lines: Sequence[str]) -> list[str]:
    """The log lines of level WARN and above, and exception lines, in order."""
    return [line for line in lines
            if log_level(line) not in (None, *_QUIET_LEVELS) or _EXCEPTION_LINE.match(line)]


def summarize_driver_output(lines: Sequence[str], exit_code: int | None) -> tuple[str, list[str]]:
    """The driver's last error from spark-submit output: (one-line cause, error lines).

    Takes the last Python traceback (or else the last JVM ``Exception in thread``) up
    to its final ``SomeError: message`` line plus the message's continuation lines.
    Without either, the error lines are never INFO/DEBUG/TRACE log lines: for a driver
    killed by a signal (``kill -9``: exit code 137 or -9) or whose exit code is unknown
    (its whole process group was killed) only its last WARN/ERROR log lines and
    exception lines (possibly none: what it printed did not explain its end), for other
    exits the last lines of output other than those quiet log lines (a
    ``sys.exit("message")`` prints its message unformatted). The cause is the final
    error line, or "driver killed by SIGKILL (exit code 137)" for a signal, or "driver
    exited with code N" when the driver died without one (e.g. ``os._exit``).
    """
    stripped = [line.strip() for line in lines]
    start = _last_index(stripped, lambda line: line == _TRACEBACK)
    if start is None:
        start = _last_index(stripped, lambda line: bool(_JVM_EXCEPTION.search(line)))
    cause = None
    if start is None:
        if exit_code is not None and killed_by(exit_code) is None:  # it exited by itself
            block = [line for line in stripped
                     if line and log_level(line) not in _QUIET_LEVELS][-20:]
        else:  # killed, or vanished (its exit code unknown): what it printed is no cause
            block = _warnings_and_errors(stripped)[-20:]
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
        cause = exit_cause(exit_code)
    elif exit_code is not None:
        cause = f"{cause} (exit code {exit_code})"
    return cause[:1000], [line[:500] for line in block]
