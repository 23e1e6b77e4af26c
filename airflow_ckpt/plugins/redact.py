"""The one place driver error text passes through before the UI shows it.

Failure causes, driver error lines, checkpoint failure messages and restore-fallback
reasons are written by the driver and the supervisor and can quote anything the job
printed, credentials included. Every page and JSON route renders them through
:func:`driver_text`, so secret masking belongs here (and only here). HTML escaping is not
its job: Jinja's autoescape does that.
"""

from __future__ import annotations

from typing import Any


def driver_text(value: Any) -> str:
    """Driver-written error text as the UI may show it (today: as is, as a string)."""
    return "" if value is None else str(value)
