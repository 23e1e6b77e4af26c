"""A real S3 HTTP endpoint on 127.0.0.1 for tests and the demo: moto's server (the
default), SeaweedFS, or any endpoint named by environment (:func:`selected_s3_server`).

``local_s3_server()`` runs moto's WSGI application in a thread of this process, on
werkzeug's threaded server, exactly as ``moto.server.ThreadedMotoServer`` does, with
one addition: a lock around every mutating request (PUT/POST/DELETE).

Why the lock: moto checks ``If-None-Match: *`` and then stores the object in two
separate steps without a lock, so two concurrent create-only PUTs of the same key can
both succeed. We measured it (16 threads racing, ``sys.setswitchinterval(1e-6)``): two
winners in 3 of 100 races; with the default switch interval the window is small but
real. AWS S3 and MinIO decide conditional writes atomically; serialising mutations
makes moto do the same, so that tests of create-only races test our code, not moto's
race. Reads are not serialised.

moto keeps its state per process: every server started here (and any ``mock_aws``)
shares the same buckets.

:func:`seaweedfs_server` runs SeaweedFS's ``weed mini`` (a real S3-compatible server,
built once by ``scripts/build_seaweedfs.sh``) on 127.0.0.1 in a scratch directory.

``s3_server_process()`` runs the same server in a child process
(:func:`_serve`): what the benchmarks use, so that the
endpoint's CPU is its own (its own GIL, measurable per process) and not the client's.
With ``tls=True`` it serves HTTPS with a self-signed certificate made for the run
(:func:`self_signed_certificate`, in a scratch directory removed after): botocore over
HTTPS sends an unsigned payload with a trailing checksum, as against AWS S3.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from airflow_ckpt.runtime.storage.base import CheckpointStorage
from airflow_ckpt.runtime.storage.factory import open_storage

_MUTATING = frozenset({"PUT", "POST", "DELETE"})
#: where a server started with ``log_requests`` answers (and forgets) what it received
REQUEST_LOG_PATH = "/_airflow_ckpt/requests"


@dataclass(frozen=True, slots=True)
class LoggedRequest:
    """One request an endpoint received: its S3 operation
    (:func:`~airflow_ckpt.testing.request_count.operation_of`), its ``/bucket/key``
    path (a listing's: ``/bucket/<prefix>``) and the bytes of its body."""

    operation: str
    path: str
    body_bytes: int


@dataclass(frozen=True)
class S3Endpoint:
    """Where a local S3 server listens, and the (dummy) credentials it accepts."""

    url: str
    region_name: str = "us-east-1"
    access_key_id: str = "testing"
    secret_access_key: str = "testing"
    #: which server: ``moto``, ``seaweedfs`` or ``external`` (see :data:`SERVERS`)
    server: str = "moto"
    #: the server's version, for reports (``moto 5.x``, SeaweedFS's pseudo-version)
    version: str = ""

    def storage(self, uri: str, **options: Any) -> CheckpointStorage:
        """``open_storage(uri)`` against this endpoint; ``options`` override anything."""
        kwargs: dict[str, Any] = {
            "endpoint_url": self.url,
            "region_name": self.region_name,
            "aws_access_key_id": self.access_key_id,
            "aws_secret_access_key": self.secret_access_key,
        }
        kwargs.update(options)
        return open_storage(uri, **kwargs)

    def client(
        self,
        service: str = "s3",
        *,
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
    ) -> Any:
        """A plain boto3 client for this endpoint (path-style addressing)."""
        import boto3
        from botocore.config import Config

        return boto3.client(
            service,  # type: ignore[call-overload]
            endpoint_url=self.url,
            region_name=self.region_name,
            aws_access_key_id=access_key_id or self.access_key_id,
            aws_secret_access_key=secret_access_key or self.secret_access_key,
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 2}),
        )

    def create_bucket(self, name: str) -> None:
        """Create a bucket (an existing bucket of ours is fine)."""
        client = self.client()
        try:
            client.create_bucket(Bucket=name)
        except client.exceptions.BucketAlreadyOwnedByYou:
            pass
        finally:
            client.close()

    def delete_bucket(self, name: str) -> None:
        """Delete every object of a bucket, then the bucket (missing is fine)."""
        client = self.client()
        try:
            paginator = client.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=name):
                objects = [{"Key": item["Key"]} for item in page.get("Contents", [])]
                if objects:
                    client.delete_objects(Bucket=name, Delete={"Objects": objects})
            client.delete_bucket(Bucket=name)
        except client.exceptions.NoSuchBucket:
            pass
        finally:
            client.close()

    def env(self) -> dict[str, str]:
        """The ``AWS_*`` variables that point a subprocess (boto3, the CLI) here."""
        return {
            "AWS_ENDPOINT_URL": self.url,
            "AWS_ACCESS_KEY_ID": self.access_key_id,
            "AWS_SECRET_ACCESS_KEY": self.secret_access_key,
            "AWS_DEFAULT_REGION": self.region_name,
        }

    def s3a_conf(self) -> dict[str, str]:
        """Spark settings (``spark.hadoop.fs.s3a.*``) that point Hadoop's S3A at this
        endpoint, for ``s3a://`` paths: the endpoint URL (TLS as its scheme says), path-style
        addressing (no per-bucket host names on 127.0.0.1), a region for SigV4 signing,
        and these keys as static credentials. No output committer is set: Spark's
        ``checkpointLocation`` is written by its ``CheckpointFileManager``, not through
        a committer (a committer matters only for file sinks on ``s3a://``)."""
        conf = {
            "fs.s3a.endpoint": self.url,
            "fs.s3a.endpoint.region": self.region_name,
            "fs.s3a.path.style.access": "true",
            "fs.s3a.connection.ssl.enabled": str(self.url.startswith("https:")).lower(),
            "fs.s3a.aws.credentials.provider":
                "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
            "fs.s3a.access.key": self.access_key_id,
            "fs.s3a.secret.key": self.secret_access_key,
        }
        return {f"spark.hadoop.{k}": v for k, v in conf.items()}

    def airflow_connection(self) -> str:
        """This endpoint as an Airflow ``aws`` connection (the JSON form that
        ``AIRFLOW_CONN_<ID>`` environment variables take)."""
        return json.dumps({
            "conn_type": "aws", "login": self.access_key_id,
            "password": self.secret_access_key,
            "extra": {"endpoint_url": self.url, "region_name": self.region_name},
        })

    @property
    def is_moto(self) -> bool:
        """Whether this is moto's server (whose in-process models tests may reach)."""
        return self.server == "moto"

    # -- moto-specific: real credential checks -------------------------------------

    def create_iam_user(self, name: str, *, allow_s3: bool = True) -> tuple[str, str]:
        """Create an IAM user with an access key; return ``(key id, secret)``.

        With ``allow_s3`` the user gets an inline ``s3:*`` policy; without it, every S3
        request it signs is refused with ``AccessDenied`` while :meth:`iam_auth` is on.
        """
        iam = self.client("iam")
        try:
            iam.create_user(UserName=name)
            key = iam.create_access_key(UserName=name)["AccessKey"]
            if allow_s3:
                policy = {
                    "Version": "2012-10-17",
                    "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}],
                }
                iam.put_user_policy(
                    UserName=name, PolicyName="s3-all", PolicyDocument=json.dumps(policy)
                )
        finally:
            iam.close()
        return key["AccessKeyId"], key["SecretAccessKey"]

    @contextmanager
    def iam_auth(self) -> Iterator[None]:
        """Make the server verify signatures and IAM policies while the block runs.

        moto accepts any credentials by default. Inside this block only access keys of
        IAM users created on this server (:meth:`create_iam_user`) are accepted; the
        default ``testing`` keys are refused. The switch is process-wide in moto, so
        do not run other requests against the server concurrently.
        """
        self._set_auth_count("0")
        try:
            yield
        finally:
            self._set_auth_count("inf")

    def _set_auth_count(self, count: str) -> None:
        request = urllib.request.Request(
            self.url + "/moto-api/reset-auth",
            data=count.encode(),
            method="POST",
            headers={"Content-Type": "text/plain"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()


class _ConditionalWriteGuard:
    """WSGI middleware: serialise mutating requests; optionally drop If-None-Match."""

    def __init__(self, app: Any, *, serialize_writes: bool, honour_if_none_match: bool) -> None:
        self.app = app
        self.lock = threading.Lock() if serialize_writes else None
        self.honour_if_none_match = honour_if_none_match

    def __call__(
        self, environ: dict[str, Any], start_response: Callable[..., Any]
    ) -> Iterable[bytes]:
        if not self.honour_if_none_match:
            environ.pop("HTTP_IF_NONE_MATCH", None)
        if self.lock is None or environ.get("REQUEST_METHOD") not in _MUTATING:
            return self.app(environ, start_response)
        with self.lock:
            result = self.app(environ, start_response)
            try:
                body = b"".join(result)
            finally:
                close = getattr(result, "close", None)
                if close is not None:
                    close()
        return [body]


class _RequestLog:
    """WSGI middleware: note every request's operation, path and body size; answer
    ``GET`` :data:`REQUEST_LOG_PATH` with the notes so far (JSON rows) and forget them.
    Counting at the endpoint sees every client alike (a JVM's S3A, boto3)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.lock = threading.Lock()
        self.rows: list[tuple[str, str, int]] = []

    def __call__(
        self, environ: dict[str, Any], start_response: Callable[..., Any]
    ) -> Iterable[bytes]:
        from airflow_ckpt.testing.request_count import operation_of

        path = str(environ.get("PATH_INFO", ""))
        if path == REQUEST_LOG_PATH:
            with self.lock:
                rows, self.rows = self.rows, []
            body = json.dumps(rows).encode()
            start_response("200 OK", [("Content-Type", "application/json"),
                                      ("Content-Length", str(len(body)))])
            return [body]
        method = str(environ.get("REQUEST_METHOD", ""))
        query = str(environ.get("QUERY_STRING", ""))
        operation = operation_of(method, path, query,
                                 copy_source="HTTP_X_AMZ_COPY_SOURCE" in environ)
        listed = parse_qs(query).get("prefix")
        if operation.startswith("List") and listed:  # what a listing is about
            path = f"{path.rstrip('/')}/{listed[0]}"
        size = int(environ.get("HTTP_X_AMZ_DECODED_CONTENT_LENGTH")
                   or environ.get("CONTENT_LENGTH") or 0)
        with self.lock:
            self.rows.append((operation, path, size))
        return self.app(environ, start_response)


def drain_request_log(url: str) -> list[LoggedRequest]:
    """What the server at ``url`` (started with ``log_requests``) received since the
    last call."""
    with urllib.request.urlopen(url + REQUEST_LOG_PATH, timeout=30) as response:
        return [LoggedRequest(*row) for row in json.loads(response.read())]


@contextmanager
def local_s3_server(
    port: int = 0,
    *,
    serialize_writes: bool = True,
    honour_if_none_match: bool = True,
    quiet: bool = True,
    log_requests: bool = False,
    tls: tuple[Path, Path] | None = None,
) -> Iterator[S3Endpoint]:
    """Run moto's S3 server on ``127.0.0.1:<port>`` (0 = a free port) while in the block.

    :param serialize_writes: serialise PUT/POST/DELETE so that conditional writes are
        atomic, as on AWS S3 (see the module docstring)
    :param honour_if_none_match: ``False`` strips ``If-None-Match`` from requests, to
        imitate an S3-compatible server without conditional writes
    :param quiet: do not log every request to stderr
    :param log_requests: note every request for :func:`drain_request_log`
    :param tls: serve HTTPS with this (certificate, key) pair of PEM files (clients must
        trust the certificate: ``AWS_CA_BUNDLE``)
    """
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import make_server

    handler: type[MotoRequestHandler] = MotoRequestHandler
    if quiet:

        class _QuietHandler(MotoRequestHandler):
            def log_request(self, *args: Any, **kwargs: Any) -> None:
                pass

        handler = _QuietHandler

    app: Any = _ConditionalWriteGuard(
        DomainDispatcherApplication(create_backend_app),
        serialize_writes=serialize_writes,
        honour_if_none_match=honour_if_none_match,
    )
    if log_requests:
        app = _RequestLog(app)
    server = make_server("127.0.0.1", port, app, threaded=True, request_handler=handler,
                         ssl_context=(str(tls[0]), str(tls[1])) if tls else None)
    thread = threading.Thread(
        target=server.serve_forever, name=f"moto-s3-{server.server_port}", daemon=True
    )
    thread.start()
    try:
        yield S3Endpoint(url=f"{'https' if tls else 'http'}://127.0.0.1:{server.server_port}",
                         version=f"moto {_moto_version()}")
    finally:
        server.shutdown()
        thread.join(timeout=10)
        server.server_close()


def _moto_version() -> str:
    from importlib.metadata import version

    return version("moto")


#: the tests' S3 servers, chosen with ``AIRFLOW_CKPT_TEST_S3`` (default ``moto``)
SERVERS = ("moto", "seaweedfs", "external")
SERVER_ENV = "AIRFLOW_CKPT_TEST_S3"
#: ``external``: the endpoint, keys, region and (optional) bucket of a user's own store
EXTERNAL_ENV = {
    "url": "AIRFLOW_CKPT_TEST_S3_URL",
    "access_key_id": "AIRFLOW_CKPT_TEST_S3_ACCESS_KEY_ID",
    "secret_access_key": "AIRFLOW_CKPT_TEST_S3_SECRET_ACCESS_KEY",
    "region_name": "AIRFLOW_CKPT_TEST_S3_REGION",
}
#: ``external``: tests use fresh prefixes of this bucket instead of creating buckets
EXTERNAL_BUCKET_ENV = "AIRFLOW_CKPT_TEST_S3_BUCKET"
#: a prebuilt ``weed`` binary (default: the one ``scripts/build_seaweedfs.sh`` builds)
SEAWEEDFS_BINARY_ENV = "AIRFLOW_CKPT_SEAWEEDFS"
SEAWEEDFS_BUILD_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "build_seaweedfs.sh"


def selected_server(environ: dict[str, str] | None = None) -> str:
    """The server ``AIRFLOW_CKPT_TEST_S3`` names (``moto`` when unset)."""
    env = os.environ if environ is None else environ
    name = env.get(SERVER_ENV, "").strip().lower() or "moto"
    if name not in SERVERS:
        raise ValueError(f"{SERVER_ENV}={name!r}: expected one of {', '.join(SERVERS)}")
    return name


@contextmanager
def selected_s3_server() -> Iterator[S3Endpoint]:
    """The S3 server ``AIRFLOW_CKPT_TEST_S3`` selects, running while in the block:
    ``moto`` (:func:`local_s3_server`), ``seaweedfs`` (:func:`seaweedfs_server`) or
    ``external`` (the endpoint of ``AIRFLOW_CKPT_TEST_S3_URL`` and the keys and region
    of the other :data:`EXTERNAL_ENV` variables; nothing is started)."""
    name = selected_server()
    if name == "moto":
        with local_s3_server() as endpoint:
            yield endpoint
    elif name == "seaweedfs":
        with seaweedfs_server() as endpoint:
            yield endpoint
    else:
        missing = [v for v in EXTERNAL_ENV.values() if v != EXTERNAL_ENV["region_name"]
                   and not os.environ.get(v)]
        if missing:
            raise ValueError(f"{SERVER_ENV}=external needs {', '.join(missing)}")
        yield S3Endpoint(
            url=os.environ[EXTERNAL_ENV["url"]],
            access_key_id=os.environ[EXTERNAL_ENV["access_key_id"]],
            secret_access_key=os.environ[EXTERNAL_ENV["secret_access_key"]],
            region_name=os.environ.get(EXTERNAL_ENV["region_name"]) or "us-east-1",
            server="external",
        )


def seaweedfs_binary() -> Path:
    """The ``weed`` binary: ``$AIRFLOW_CKPT_SEAWEEDFS``, else the one
    ``scripts/build_seaweedfs.sh`` built (building it on first use: minutes)."""
    configured = os.environ.get(SEAWEEDFS_BINARY_ENV)
    if configured:
        return Path(configured)
    if not SEAWEEDFS_BUILD_SCRIPT.is_file():
        raise RuntimeError(f"set {SEAWEEDFS_BINARY_ENV} to a weed binary (no build script "
                           f"at {SEAWEEDFS_BUILD_SCRIPT})")
    done = subprocess.run(["bash", str(SEAWEEDFS_BUILD_SCRIPT)], check=True,
                          stdout=subprocess.PIPE, text=True)
    return Path(done.stdout.strip().splitlines()[-1])


def seaweedfs_version() -> str:
    """The pinned SeaweedFS version (``scripts/build_seaweedfs.sh --version``)."""
    done = subprocess.run(["bash", str(SEAWEEDFS_BUILD_SCRIPT), "--version"], check=True,
                          stdout=subprocess.PIPE, text=True)
    return done.stdout.strip()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def seaweedfs_server(binary: Path | None = None, *,
                     startup_timeout_s: float = 120.0) -> Iterator[S3Endpoint]:
    """Run ``weed mini`` on 127.0.0.1 (its S3 gateway and the master, volume and filer
    servers behind it, each on a free port) in a scratch directory while in the block.

    With no identities configured it accepts any keys. Startup takes about 10 s; the
    block begins once a ListBuckets is answered, and the directory is removed after.
    """
    weed = binary or seaweedfs_binary()
    work = Path(tempfile.mkdtemp(prefix="seaweedfs-"))
    port = _free_port()
    cmd = [str(weed), "mini", f"-dir={work / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
           f"-s3.port={port}", *_seaweedfs_port_flags()]
    (work / "data").mkdir()
    log = (work / "weed.log").open("wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        endpoint = S3Endpoint(url=f"http://127.0.0.1:{port}", server="seaweedfs",
                              version=f"SeaweedFS {_seaweedfs_version_of(weed)}")
        _wait_until_serving(endpoint, proc, work / "weed.log", startup_timeout_s)
        yield endpoint
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        shutil.rmtree(work, ignore_errors=True)


#: every listening port of ``weed mini`` besides S3's: each gets a free port (a gRPC
#: port would otherwise be its HTTP port + 10000, past 65535 for a high free port)
_SEAWEEDFS_PORT_FLAGS = (
    "master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port",
    "filer.port.grpc", "s3.port.grpc", "admin.port", "admin.port.grpc", "webdav.port",
    "debug.port",
)
#: servers the tests do not use, switched off
_SEAWEEDFS_OFF = ("-admin.port.legacy=0", "-s3.port.iceberg=0", "-s3.port.lance=0",
                  "-webdav=false", "-admin.ui=false", "-master.telemetry=false")


def _seaweedfs_port_flags() -> list[str]:
    """Free ports for the servers ``weed mini`` runs besides S3 (so that two test
    workers can each run one), and the unused ones switched off."""
    return [*(f"-{flag}={_free_port()}" for flag in _SEAWEEDFS_PORT_FLAGS), *_SEAWEEDFS_OFF]


def _seaweedfs_version_of(weed: Path) -> str:
    """``weed version``'s release (``4.53``), and the pinned pseudo-version when the
    binary is the build script's."""
    done = subprocess.run([str(weed), "version"], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, check=False)
    words = done.stdout.split()  # "version 30GB 4.53  linux amd64"
    release = words[2] if len(words) > 2 and words[0] == "version" else "unknown"
    pinned = weed.parent.name if weed.parent.name.startswith("v0.") else ""
    return f"{release} ({pinned})" if pinned else release


def _wait_until_serving(endpoint: S3Endpoint, proc: subprocess.Popen[bytes], log: Path,
                        timeout_s: float) -> None:
    """Poll ListBuckets until it is answered; raise with the server's log if the process
    exits or ``timeout_s`` passes first (startup only: nothing here rests on it)."""
    deadline = time.monotonic() + timeout_s
    client = endpoint.client()
    try:
        while True:
            try:
                client.list_buckets()
                return
            except Exception as exc:  # not up yet: refused, reset, 5xx
                if proc.poll() is not None or time.monotonic() > deadline:
                    tail = log.read_text(errors="replace")[-3000:]
                    raise RuntimeError(
                        f"SeaweedFS did not start at {endpoint.url} (exit {proc.poll()}, "
                        f"last error {exc}); its log ends:\n{tail}") from exc
                time.sleep(0.25)
    finally:
        client.close()


class S3ServerProcess:
    """A :func:`local_s3_server` running in a child process (see :func:`s3_server_process`)."""

    def __init__(self, proc: subprocess.Popen[str], url: str) -> None:
        self.proc = proc
        self.endpoint = S3Endpoint(url=url)

    @property
    def pid(self) -> int:
        """The server's process id (e.g. to read its CPU time)."""
        return self.proc.pid

    def bulk_load(self, bucket: str, objects: Sequence[tuple[str, bytes]]) -> float:
        """Store UTF-8 objects straight into the server's moto backend, without HTTP (what
        a PUT stores): for benchmarks that need more objects than PUTs could write in
        time. Returns objects/s."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        started = time.perf_counter()
        with tempfile.NamedTemporaryFile("w", suffix=f"-{uuid.uuid4().hex}.jsonl",
                                         delete=False) as f:
            for key, body in objects:
                f.write(json.dumps({"bucket": bucket, "key": key, "body": body.decode()}) + "\n")
        try:
            self.proc.stdin.write(f"{f.name}\n")
            self.proc.stdin.flush()
            stored = int(self.proc.stdout.readline())
        finally:
            Path(f.name).unlink()
        if stored != len(objects):
            raise RuntimeError(f"the S3 server stored {stored} of {len(objects)} objects")
        return len(objects) / (time.perf_counter() - started)


def self_signed_certificate(directory: Path, host: str = "127.0.0.1") -> tuple[Path, Path]:
    """A fresh self-signed certificate for ``host`` (an IP address) and its key, as PEM
    files ``cert.pem`` and ``key.pem`` in ``directory``: a local HTTPS endpoint's, valid
    for a day, trusted by a client that takes ``cert.pem`` as its CA bundle."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address(host))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


@contextmanager
def s3_server_process(*, serialize_writes: bool = True, log_requests: bool = False,
                      tls: bool = False) -> Iterator[S3ServerProcess]:
    """Run :func:`local_s3_server` in a child process while in the block.

    The child prints its URL, then serves until its stdin closes (the end of the block),
    bulk-loading the objects of every JSON-lines file named on a stdin line
    (:meth:`S3ServerProcess.bulk_load`). ``serialize_writes`` as in
    :func:`local_s3_server` (benchmarks with one writer per key may turn it off);
    ``log_requests``: the server notes every request (:func:`drain_request_log`);
    ``tls``: the server speaks HTTPS with a certificate made for the block
    (:func:`self_signed_certificate`), which this process trusts while in the block
    (``AWS_CA_BUNDLE``, read by every boto3 client and storage made meanwhile).
    """
    # -c, not -m: the package imports this module, which -m would then run a second time
    cmd = [sys.executable, "-c", "from airflow_ckpt.testing.s3_server import _serve; _serve()"]
    if not serialize_writes:
        cmd.append("--parallel-writes")
    if log_requests:
        cmd.append("--log-requests")
    with tempfile.TemporaryDirectory(prefix="airflow-ckpt-tls-") as tmp:
        bundle = os.environ.get("AWS_CA_BUNDLE")
        if tls:
            cert, key = self_signed_certificate(Path(tmp))
            cmd += ["--tls-cert", str(cert), "--tls-key", str(key)]
            os.environ["AWS_CA_BUNDLE"] = str(cert)
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None
            url = proc.stdout.readline().strip()
            if not url.startswith("http"):
                raise RuntimeError(f"the S3 server did not start (exit {proc.poll()})")
            yield S3ServerProcess(proc, url)
        finally:
            if proc.stdin:
                proc.stdin.close()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if tls and bundle is None:
                os.environ.pop("AWS_CA_BUNDLE", None)
            elif tls:
                os.environ["AWS_CA_BUNDLE"] = bundle  # type: ignore[assignment]


def _serve(argv: Sequence[str] | None = None) -> None:
    """The child of :func:`s3_server_process`."""
    p = argparse.ArgumentParser(prog="airflow_ckpt.testing.s3_server")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--parallel-writes", action="store_true",
                   help="do not serialise PUT/POST/DELETE (see the module docstring)")
    p.add_argument("--log-requests", action="store_true",
                   help=f"note every request; GET {REQUEST_LOG_PATH} drains the notes")
    p.add_argument("--tls-cert", type=Path, help="serve HTTPS with this PEM certificate")
    p.add_argument("--tls-key", type=Path, help="and this PEM key")
    args = p.parse_args(argv)
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends

    tls = (args.tls_cert, args.tls_key) if args.tls_cert and args.tls_key else None
    with local_s3_server(args.port, serialize_writes=not args.parallel_writes,
                         log_requests=args.log_requests, tls=tls) as endpoint:
        print(endpoint.url, flush=True)
        backend = s3_backends[DEFAULT_ACCOUNT_ID]["global"]
        for line in sys.stdin:  # until the parent closes our stdin
            n = 0
            with open(line.strip()) as objects:
                for row in objects:
                    o = json.loads(row)
                    backend.put_object(o["bucket"], o["key"], o["body"].encode())
                    n += 1
            print(n, flush=True)

