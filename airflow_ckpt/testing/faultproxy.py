"""A fault-injecting HTTP proxy for an S3 endpoint: what an operator's network does.

:class:`FaultProxy` listens on ``127.0.0.1`` and forwards every request to an upstream
S3 server (the moto server of :mod:`airflow_ckpt.testing.s3_server`), one upstream
connection per request. Clients talk to it as to any endpoint (real botocore: point
``endpoint_url`` / ``AWS_ENDPOINT_URL`` at :attr:`FaultProxy.url`). On the way it
injects the faults a real S3 path has (:class:`FaultKind`):

* ``slow_down``: 503 SlowDown, the request not forwarded (not applied);
* ``error_before``: 500 InternalError, not forwarded (not applied);
* ``error_after``: forwarded (applied), then 500 InternalError instead of the answer;
* ``reset_before``: the connection reset, nothing forwarded (not applied);
* ``reset_after``: forwarded (applied), then the connection reset (answer lost);
* ``cut_body``: forwarded, the answer's headers and only part of its body sent, then
  the connection reset (a body cut short; an answer without a body breaks off in its
  status line);
* ``latency``: forwarded after a delay (2-8 s by default).

Faults come from two sources, checked in this order:

1. **scripted** faults (:meth:`FaultProxy.script`): "the next PUT whose target matches
   X: apply it, then reset the connection" -- one-shot rules for exact test cases;
2. a **seeded schedule** (:class:`FaultSchedule`): a rate per fault kind, for requests
   whose method and target match; the draws come from one ``random.Random(seed)``
   taken under a lock, so a sequential client meets the same faults on every run.

:meth:`FaultProxy.outage` refuses every request (connection reset before anything is
read) until the block ends: an endpoint that is down. Every injected fault is recorded
(:attr:`FaultProxy.injected`).
"""

from __future__ import annotations

import contextlib
import http.client
import random
import re
import socket
import struct
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit


class FaultKind(str, Enum):
    """One kind of fault the proxy injects (see the module docstring)."""

    SLOW_DOWN = "slow_down"
    ERROR_BEFORE = "error_before"
    ERROR_AFTER = "error_after"
    RESET_BEFORE = "reset_before"
    RESET_AFTER = "reset_after"
    CUT_BODY = "cut_body"
    LATENCY = "latency"

    @property
    def applied(self) -> bool | None:
        """Whether the request reached the server: True, False, or None for a cut body
        and latency (forwarded, the answer arrives or is cut)."""
        if self in (FaultKind.SLOW_DOWN, FaultKind.ERROR_BEFORE, FaultKind.RESET_BEFORE):
            return False
        if self in (FaultKind.ERROR_AFTER, FaultKind.RESET_AFTER):
            return True
        return None


#: the kinds whose answer is lost or cut short although the server applied the request
LOST_ANSWER = frozenset({FaultKind.ERROR_AFTER, FaultKind.RESET_AFTER, FaultKind.CUT_BODY})

_HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
    "trailers", "transfer-encoding", "upgrade", "expect", "content-length",
})


@dataclass(frozen=True, slots=True)
class Fault:
    """A scripted fault: the next ``count`` requests whose method is ``method`` (any
    when None) and whose target (``/bucket/key?query``, unquoted) matches the regular
    expression ``target`` (searched) get ``kind``.

    :param cut_after: for ``cut_body``, the body bytes sent before the reset
    :param latency_s: for ``latency``, the delay before forwarding
    """

    kind: FaultKind
    method: str | None = None
    target: str = ""
    count: int = 1
    cut_after: int = 0
    latency_s: float = 2.0

    def matches(self, method: str, target: str) -> bool:
        """Whether this rule applies to a request."""
        return (self.method is None or self.method == method) and bool(
            re.search(self.target, target))


@dataclass(frozen=True, slots=True)
class FaultSchedule:
    """Random faults at a rate per kind, drawn from ``random.Random(seed)``.

    :param rates: probability per request of each kind (their sum at most 1)
    :param method: only requests of this method (any when None)
    :param target: only requests whose target matches this regular expression
    :param latency_s: the range a ``latency`` fault's delay is drawn from
    """

    rates: Mapping[FaultKind, float]
    seed: int = 0
    method: str | None = None
    target: str = ""
    latency_s: tuple[float, float] = (2.0, 8.0)

    def __post_init__(self) -> None:
        if sum(self.rates.values()) > 1 or any(r < 0 for r in self.rates.values()):
            raise ValueError(f"fault rates must be >= 0 and sum to at most 1: {self.rates}")

    @classmethod
    def uniform(cls, rate: float, seed: int = 0, *, latency_share: float = 0.1,
                **kwargs: Any) -> FaultSchedule:
        """``rate`` of all requests get a fault: ``latency_share`` of those a delay, the
        rest split evenly over the other kinds."""
        others = [k for k in FaultKind if k is not FaultKind.LATENCY]
        rates: dict[FaultKind, float] = {
            k: rate * (1 - latency_share) / len(others) for k in others}
        rates[FaultKind.LATENCY] = rate * latency_share
        return cls(rates=rates, seed=seed, **kwargs)


@dataclass(frozen=True, slots=True)
class Injected:
    """One injected fault, as recorded by the proxy."""

    method: str
    target: str
    kind: FaultKind


@dataclass(slots=True)
class _Decision:
    kind: FaultKind
    cut_after: int = 0
    latency_s: float = 0.0


@dataclass
class _State:
    schedule: FaultSchedule | None = None
    rng: random.Random = field(default_factory=random.Random)
    scripted: list[list[Any]] = field(default_factory=list)  # [Fault, remaining]
    outage: bool = False


class FaultProxy:
    """A threaded HTTP proxy on ``127.0.0.1`` in front of ``upstream`` (see the module
    docstring). Use as a context manager, or :meth:`start` / :meth:`stop`."""

    def __init__(self, upstream: str, schedule: FaultSchedule | None = None,
                 port: int = 0) -> None:
        parts = urlsplit(upstream)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"upstream must be an http:// URL: {upstream!r}")
        self.upstream_host = parts.hostname
        self.upstream_port = parts.port or 80
        self._lock = threading.Lock()
        self._state = _State()
        self.injected: list[Injected] = []
        self.requests = 0
        #: connections refused because of an outage (not in ``requests``: nothing was read)
        self.refused = 0
        self.set_schedule(schedule)
        self._server = _Server(("127.0.0.1", port), _Handler, self)
        self.url = f"http://127.0.0.1:{self._server.server_port}"
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------ control

    def start(self) -> FaultProxy:
        """Serve in a daemon thread."""
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name=f"fault-proxy-{self._server.server_port}",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the listening socket."""
        self._server.shutdown()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._server.server_close()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def set_schedule(self, schedule: FaultSchedule | None) -> None:
        """Replace the random schedule (None: no random faults); reseeds."""
        with self._lock:
            self._state.schedule = schedule
            self._state.rng = random.Random(schedule.seed if schedule else 0)

    def script(self, *faults: Fault) -> None:
        """Queue one-shot faults; each applies to its next ``count`` matching requests,
        ahead of the schedule (the first matching rule wins)."""
        with self._lock:
            self._state.scripted.extend([f, f.count] for f in faults)

    def pending_scripted(self) -> list[Fault]:
        """The scripted faults not used up yet."""
        with self._lock:
            return [f for f, left in self._state.scripted if left > 0]

    @contextlib.contextmanager
    def outage(self) -> Iterator[None]:
        """Refuse every request (reset at once) while the block runs."""
        self.set_outage(True)
        try:
            yield
        finally:
            self.set_outage(False)

    def set_outage(self, down: bool) -> None:
        """Start (True) or end (False) an outage (see :meth:`outage`)."""
        with self._lock:
            self._state.outage = down

    def counts(self) -> dict[FaultKind, int]:
        """Injected faults per kind so far."""
        with self._lock:
            out = dict.fromkeys(FaultKind, 0)
            for item in self.injected:
                out[item.kind] += 1
            return out

    # ------------------------------------------------------------ decisions

    def _in_outage(self) -> bool:
        """Whether the endpoint is down now; a request refused for it is counted in
        :attr:`refused`."""
        with self._lock:
            self.refused += self._state.outage
            return self._state.outage

    def _decide(self, method: str, target: str) -> _Decision | None:
        with self._lock:
            self.requests += 1
            decision = self._scripted(method, target) or self._scheduled(method, target)
            if decision is not None:
                self.injected.append(Injected(method, target, decision.kind))
            return decision

    def _scripted(self, method: str, target: str) -> _Decision | None:
        for rule in self._state.scripted:
            fault, left = rule
            if left > 0 and fault.matches(method, target):
                rule[1] = left - 1
                return _Decision(fault.kind, fault.cut_after, fault.latency_s)
        return None

    def _scheduled(self, method: str, target: str) -> _Decision | None:
        schedule, rng = self._state.schedule, self._state.rng
        if schedule is None:
            return None
        if (schedule.method is not None and schedule.method != method) or not re.search(
                schedule.target, target):
            return None
        draw = rng.random()
        for kind, rate in schedule.rates.items():
            if draw < rate:
                low, high = schedule.latency_s
                return _Decision(kind, cut_after=rng.randrange(0, 64),
                                 latency_s=rng.uniform(low, high))
            draw -= rate
        return None


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler],
                 proxy: FaultProxy) -> None:
        super().__init__(address, handler)
        self.proxy = proxy

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Connections reset on purpose raise in their threads: not worth a traceback."""


def _error_body(code: str, message: str) -> bytes:
    return (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
            f"<Message>{message}</Message><RequestId>fault-proxy</RequestId></Error>"
            ).encode()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the proxy records faults in :attr:`FaultProxy.injected`."""

    def do_GET(self) -> None:
        self._proxy()

    do_PUT = do_POST = do_DELETE = do_HEAD = do_GET

    def _proxy(self) -> None:
        proxy = self.server.proxy
        if proxy._in_outage():
            self._reset()
            return
        body = self._read_body()
        target = unquote(self.path)
        decision = proxy._decide(self.command, target)
        kind = decision.kind if decision else None
        if kind is FaultKind.RESET_BEFORE:
            self._reset()
            return
        if kind is FaultKind.SLOW_DOWN:
            self._answer_error(503, "SlowDown", "Please reduce your request rate.")
            return
        if kind is FaultKind.ERROR_BEFORE:
            self._answer_error(500, "InternalError", "injected before the request")
            return
        if decision is not None and kind is FaultKind.LATENCY:
            time.sleep(decision.latency_s)
        try:
            status, reason, headers, payload = self._forward(body)
        except OSError:
            self._reset()  # the upstream is gone: the client sees a broken connection
            return
        if kind is FaultKind.RESET_AFTER:
            self._reset()
            return
        if kind is FaultKind.ERROR_AFTER:
            self._answer_error(500, "InternalError", "injected after the request")
            return
        cut = decision.cut_after if decision is not None and kind is FaultKind.CUT_BODY \
            else None
        if cut is not None and (self.command == "HEAD" or not payload):
            # nothing to cut in a body-less answer: it breaks off in its status line
            self.wfile.write(f"HTTP/1.1 {status} ".encode())
            self._reset()
            return
        self.send_response_only(status, reason)
        for name, value in headers:
            self.send_header(name, value)
        if self.command != "HEAD":
            self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if self.command == "HEAD":
            return
        if cut is not None:
            self.wfile.write(payload[:min(cut, len(payload) - 1)])
            self._reset()
            return
        self.wfile.write(payload)

    def _read_body(self) -> bytes:
        length = self.headers.get("Content-Length")
        if length is not None:
            return self.rfile.read(int(length))
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            chunks: list[bytes] = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        return b""

    def _forward(self, body: bytes) -> tuple[int, str, list[tuple[str, str]], bytes]:
        proxy = self.server.proxy
        conn = http.client.HTTPConnection(proxy.upstream_host, proxy.upstream_port,
                                          timeout=120)
        try:
            headers = {k: v for k, v in self.headers.items()
                       if k.lower() not in _HOP_BY_HOP}
            if body or self.command in ("PUT", "POST"):
                headers["Content-Length"] = str(len(body))
            conn.request(self.command, self.path, body=body, headers=headers)
            response = conn.getresponse()
            payload = response.read()
            kept = [(k, v) for k, v in response.getheaders() if k.lower() not in _HOP_BY_HOP]
            if self.command == "HEAD":  # no body, but the object's length
                kept.append(("Content-Length", response.getheader("Content-Length") or "0"))
            return response.status, response.reason, kept, payload
        finally:
            conn.close()

    def _answer_error(self, status: int, code: str, message: str) -> None:
        body = b"" if self.command == "HEAD" else _error_body(code, message)
        self.send_response_only(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _reset(self) -> None:
        """Abort the connection with a TCP reset (SO_LINGER 0), not a clean close."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                       struct.pack("ii", 1, 0))
            self.connection.close()
