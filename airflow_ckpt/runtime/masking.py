"""Secret masking for text that leaves the process: history events, logs, UI pages.

Driver error lines end up in the job's history (``query_failure``/``restart`` causes,
``job_failed``), in task logs and on the plugin's pages. A py4j or botocore error can
quote a credential (a presigned URL's ``X-Amz-Security-Token``, an ``AWS_SESSION_TOKEN=``
echoed by a launcher script), so every such line goes through :func:`mask_secrets` first.

Two sources of secret values, both masked as ``***`` (Airflow's replacement string):

* the values registered with :func:`register_secrets` in this process (the Airflow side
  registers the storage connection's credentials when it resolves them);
* the values of the AWS credential variables in this process's environment
  (:data:`SECRET_ENV_VARS`): how a driver receives them.

Plus patterns that are secret whatever their value: ``X-Amz-Security-Token=``,
``X-Amz-Signature=`` query parameters and ``aws_secret_access_key`` /
``aws_session_token`` / ``AWS_SECRET_ACCESS_KEY`` / ``AWS_SESSION_TOKEN`` assignments.

No Airflow import: the runtime (driver) uses this module too.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterable, Mapping
from typing import Any

#: What a masked value is replaced with (the same as Airflow's secrets masker).
MASK = "***"

#: Values shorter than this are not masked (as Airflow's ``[logging]
#: min_length_masked_secret``): masking "a" or "1" would garble every line.
MIN_SECRET_LENGTH = 5

#: Environment variables whose values are secrets. ``AWS_ACCESS_KEY_ID`` is not secret by
#: itself but identifies the key; it is masked too.
SECRET_ENV_VARS: tuple[str, ...] = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
)

_ASSIGNMENT = re.compile(
    r"(?P<name>aws_secret_access_key|aws_session_token|aws_security_token"
    r"|X-Amz-Security-Token|X-Amz-Signature|X-Amz-Credential)"
    r"(?P<sep>['\"]?\s*[:=]\s*['\"]?)(?P<value>[^\s'\",&;]+)",
    re.IGNORECASE,
)

_lock = threading.Lock()
_registered: set[str] = set()


def register_secrets(values: Iterable[str | None]) -> None:
    """Mask these values from now on in this process (short and empty ones are ignored)."""
    with _lock:
        _registered.update(v for v in values if v and len(v) >= MIN_SECRET_LENGTH)


def secret_values(environ: Mapping[str, str] | None = None) -> list[str]:
    """The secret values known to this process, longest first (so that a secret that
    contains another is masked whole)."""
    env = os.environ if environ is None else environ
    with _lock:
        values = set(_registered)
    values.update(v for k in SECRET_ENV_VARS if len(v := env.get(k) or "") >= MIN_SECRET_LENGTH)
    return sorted(values, key=len, reverse=True)


def mask_secrets(text: str, secrets: Iterable[str | None] = (),
                 environ: Mapping[str, str] | None = None) -> str:
    """``text`` with every known secret value (and secret-looking assignment) replaced by
    ``***``: the given ``secrets``, the registered ones and the AWS credential variables of
    ``environ`` (default ``os.environ``)."""
    if not text:
        return text
    return _mask(text, _known(secrets, environ))


def mask_value(value: Any, secrets: Iterable[str | None] = (),
               environ: Mapping[str, str] | None = None) -> Any:
    """:func:`mask_secrets` applied to every string inside a JSON-like value (mappings
    become dicts, tuples lists)."""
    known = _known(secrets, environ)

    def walk(item: Any) -> Any:
        if isinstance(item, str):
            return _mask(item, known)
        if isinstance(item, Mapping):
            return {k: walk(v) for k, v in item.items()}
        if isinstance(item, list | tuple):
            return [walk(v) for v in item]
        return item

    return walk(value)


def _known(secrets: Iterable[str | None], environ: Mapping[str, str] | None) -> list[str]:
    extra = {s for s in secrets if s and len(s) >= MIN_SECRET_LENGTH}
    return sorted(extra.union(secret_values(environ)), key=len, reverse=True)


def _mask(text: str, known: list[str]) -> str:
    for value in known:
        text = text.replace(value, MASK)
    return _ASSIGNMENT.sub(lambda m: f"{m['name']}{m['sep']}{MASK}", text)
