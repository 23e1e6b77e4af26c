"""docker-compose.yaml is coherent (parsed with PyYAML; no Docker engine needed).

Checks what ``docker compose config`` would catch and a few things it would not: every
``depends_on`` names a defined service (and there is no cycle), named volumes are
declared and used, bind-mounted paths and the Airflow image's build inputs exist in the
repository, the Airflow storage connection points at the MinIO service's S3 port with its
credentials and bucket, the Spark connection at the standalone master, and the Spark
image is of the pyspark version the project pins.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml

from airflow_ckpt.runtime.storage.factory import parse_storage_uri

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "docker-compose.yaml"
AIRFLOW = ("airflow-apiserver", "airflow-scheduler", "airflow-dag-processor",
           "airflow-triggerer")
REQUIRED = (*AIRFLOW, "airflow-init", "postgres", "spark-master", "spark-worker", "minio",
            "minio-init", "kafka")
_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}")


def interpolate(value: Any) -> Any:
    """Compose's interpolation with every variable unset: ``${X:-d}`` -> ``d``, ``$$`` -> ``$``."""
    if isinstance(value, str):
        text = _VARIABLE.sub(lambda m: m.group(2) or "", value.replace("$$", "\0"))
        return text.replace("\0", "$")
    if isinstance(value, list):
        return [interpolate(v) for v in value]
    if isinstance(value, dict):
        return {k: interpolate(v) for k, v in value.items()}
    return value


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict)
    result: dict[str, Any] = interpolate(data)
    return result


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    result: dict[str, dict[str, Any]] = compose["services"]
    return result


def env(service: dict[str, Any]) -> dict[str, str]:
    raw = service.get("environment") or {}
    if isinstance(raw, list):
        raw = dict(item.split("=", 1) if "=" in item else (item, "") for item in raw)
    return {str(k): str(v) for k, v in raw.items()}


def dependencies(service: dict[str, Any]) -> list[str]:
    raw = service.get("depends_on") or []
    return list(raw) if isinstance(raw, list | dict) else [raw]


def mounts(service: dict[str, Any]) -> list[tuple[str, str]]:
    """``(source, target)`` of every volume entry (short or long syntax)."""
    out = []
    for entry in service.get("volumes") or []:
        if isinstance(entry, dict):
            out.append((str(entry.get("source", "")), str(entry["target"])))
        else:
            parts = str(entry).split(":")
            out.append((parts[0], parts[1]) if len(parts) > 1 else ("", parts[0]))
    return out


def is_bind(source: str) -> bool:
    return source.startswith((".", "/", "~"))


def command(service: dict[str, Any]) -> list[str]:
    raw = service.get("command") or []
    return raw.split() if isinstance(raw, str) else [str(c) for c in raw]


def option(args: list[str], name: str) -> str:
    assert name in args, f"{name} missing from {args}"
    return args[args.index(name) + 1]


def test_required_services_exist(services: dict[str, dict[str, Any]]) -> None:
    missing = [name for name in REQUIRED if name not in services]
    assert not missing, f"services missing from docker-compose.yaml: {missing}"
    for name, service in services.items():
        assert "image" in service or "build" in service, f"{name} has neither image nor build"


def test_depends_on_names_defined_services_without_cycles(
    services: dict[str, dict[str, Any]],
) -> None:
    for name, service in services.items():
        for dep in dependencies(service):
            assert dep in services, f"{name} depends on undefined service {dep!r}"
            assert dep != name, f"{name} depends on itself"
        raw = service.get("depends_on")
        if isinstance(raw, dict):
            for dep, spec in raw.items():
                assert spec.get("condition") in (
                    "service_started", "service_healthy", "service_completed_successfully"
                ), f"{name} -> {dep}: bad condition {spec!r}"
                if spec.get("condition") == "service_healthy":
                    assert "healthcheck" in services[dep], f"{dep} has no healthcheck"
    # Compose refuses cycles: a topological order must exist.
    remaining = {name: set(dependencies(s)) for name, s in services.items()}
    while remaining:
        ready = [n for n, deps in remaining.items() if not deps & remaining.keys()]
        assert ready, f"depends_on cycle among {sorted(remaining)}"
        for n in ready:
            del remaining[n]


def test_named_volumes_are_declared_and_used(compose: dict[str, Any],
                                             services: dict[str, dict[str, Any]]) -> None:
    declared = set(compose.get("volumes") or {})
    used = set()
    for name, service in services.items():
        for source, target in mounts(service):
            assert target.startswith("/"), f"{name}: mount target {target!r} is not absolute"
            if source and not is_bind(source):
                assert source in declared, f"{name} mounts undeclared volume {source!r}"
                used.add(source)
    assert declared == used, f"declared but unused volumes: {sorted(declared - used)}"


def test_bind_mounts_exist_in_the_repo(services: dict[str, dict[str, Any]]) -> None:
    for name, service in services.items():
        for source, _ in mounts(service):
            if is_bind(source):
                assert source.startswith("./"), f"{name}: bind mount {source!r} outside the repo"
                assert (REPO / source).exists(), f"{name} mounts missing path {source!r}"
    scheduler = dict((target, source) for source, target in mounts(services["airflow-scheduler"]))
    assert scheduler["/opt/airflow/dags"] == "./dags"
    jobs_dir = env(services["airflow-scheduler"])["AIRFLOW_CKPT_JOBS_DIR"]
    assert scheduler[jobs_dir] == "./spark_jobs"
    assert (REPO / "dags" / "checkpointed_streaming_job.py").is_file()
    assert (REPO / "spark_jobs" / "odd_even_sums.py").is_file()


def test_airflow_image_build_inputs_exist(services: dict[str, dict[str, Any]]) -> None:
    build = services["airflow-scheduler"]["build"]
    context = REPO / build["context"]
    dockerfile = context / build["dockerfile"]
    assert dockerfile.is_file()
    text = dockerfile.read_text()
    copies = [line.split()[1:-1] for line in text.splitlines()
              if line.startswith("COPY") and "--from=" not in line]
    assert copies, "the Dockerfile copies nothing from the build context"
    for sources in copies:
        for source in (s for s in sources if not s.startswith("--")):
            assert (context / source).exists(), f"Dockerfile copies missing {source!r}"
    assert "pip install" in text and "/opt/airflow-ckpt" in text
    assert "JAVA_HOME" in text, "the Spark driver runs in Airflow: it needs a JRE"
    ignored = (context / ".dockerignore").read_text().split()
    assert ".venv" in ignored and ".git" in ignored


def test_airflow_components_share_image_env_and_init(
    services: dict[str, dict[str, Any]],
) -> None:
    expected = {
        "airflow-apiserver": "api-server", "airflow-scheduler": "scheduler",
        "airflow-dag-processor": "dag-processor", "airflow-triggerer": "triggerer",
    }
    images = {services[name]["image"] for name in (*AIRFLOW, "airflow-init")}
    assert len(images) == 1, f"Airflow services use different images: {images}"
    for name, cmd in expected.items():
        service = services[name]
        assert command(service) == [cmd]
        assert service["depends_on"]["airflow-init"]["condition"] == (
            "service_completed_successfully")
        variables = env(service)
        assert variables["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"].startswith(
            "http://airflow-apiserver:8080/")
        for key in ("AIRFLOW_CKPT_STORAGE", "AIRFLOW_CONN_AWS_DEFAULT",
                    "AIRFLOW_CONN_SPARK_DEFAULT", "AIRFLOW__API_AUTH__JWT_SECRET"):
            assert variables.get(key), f"{name} lacks {key}"
    secrets = {env(services[name])["AIRFLOW__API_AUTH__JWT_SECRET"] for name in AIRFLOW}
    assert len(secrets) == 1, "components must share the JWT secret"
    assert env(services["airflow-init"]).get("_AIRFLOW_DB_MIGRATE") == "true"
    assert "8080:8080" in services["airflow-apiserver"]["ports"]


def test_storage_connection_points_at_minio(services: dict[str, dict[str, Any]]) -> None:
    variables = env(services["airflow-scheduler"])
    conn = json.loads(variables["AIRFLOW_CONN_AWS_DEFAULT"])
    assert conn["conn_type"] == "aws"
    endpoint = urlparse(conn["extra"]["endpoint_url"])
    assert endpoint.hostname in services, f"{endpoint.hostname!r} is not a service"
    minio = services[endpoint.hostname]
    assert "minio" in minio["image"]
    api_port = option(command(minio), "--address").rsplit(":", 1)[1]
    assert str(endpoint.port) == api_port, "the connection's port is not MinIO's S3 port"
    minio_env = env(minio)
    assert conn["login"] == minio_env["MINIO_ROOT_USER"]
    assert conn["password"] == minio_env["MINIO_ROOT_PASSWORD"]
    # The bucket the checkpoints go to is the one minio-init creates, at the same endpoint.
    storage = parse_storage_uri(variables["AIRFLOW_CKPT_STORAGE"])
    init = services["minio-init"]
    assert storage.scheme == "s3" and storage.bucket == env(init)["CKPT_BUCKET"]
    script = "\n".join(command(init))
    assert f"mc alias set local {conn['extra']['endpoint_url']} " in script
    assert "mc mb --ignore-existing" in script
    assert init["depends_on"]["minio"]["condition"] == "service_healthy"
    for name in AIRFLOW:
        assert services[name]["depends_on"]["minio-init"]["condition"] == (
            "service_completed_successfully")


def test_spark_connection_points_at_the_master(services: dict[str, dict[str, Any]]) -> None:
    conn = json.loads(env(services["airflow-scheduler"])["AIRFLOW_CONN_SPARK_DEFAULT"])
    assert conn["conn_type"] == "spark"
    # SparkSubmitHook: a "spark" connection whose host has a scheme -> host:port.
    master_url = f"{conn['host']}:{conn['port']}"
    parsed = urlparse(master_url)
    assert parsed.scheme == "spark" and parsed.hostname in services
    master = command(services[parsed.hostname])
    assert "org.apache.spark.deploy.master.Master" in master
    assert option(master, "--host") == parsed.hostname
    assert option(master, "--port") == str(parsed.port)
    worker = command(services["spark-worker"])
    assert "org.apache.spark.deploy.worker.Worker" in worker and master_url in worker
    assert conn["extra"]["deploy-mode"] == "client"


def test_spark_image_matches_the_pinned_pyspark(services: dict[str, dict[str, Any]]) -> None:
    version = importlib.metadata.version("pyspark")
    for name in ("spark-master", "spark-worker"):
        image = services[name]["image"]
        repo, _, tag = image.partition(":")
        assert repo == "apache/spark", image
        assert tag.split("-")[0] == version, f"{name}: Spark {tag} but pyspark {version}"


def test_driver_and_executors_share_input_and_working_directories(
    services: dict[str, dict[str, Any]],
) -> None:
    def named(service: dict[str, Any]) -> set[tuple[str, str]]:
        return {(s, t) for s, t in mounts(service) if s and not is_bind(s)}

    worker = named(services["spark-worker"])
    assert {t for _, t in worker} >= {"/tmp/airflow-ckpt", "/tmp/airflow_ckpt"}
    assert worker <= named(services["airflow-scheduler"]), (
        "the driver (airflow-scheduler) and the executors (spark-worker) must see the "
        "input and the working directories at the same paths"
    )
    scheduler = services["airflow-scheduler"]
    assert env(scheduler)["SPARK_LOCAL_HOSTNAME"] == scheduler["hostname"]


def test_host_ports_are_unique(services: dict[str, dict[str, Any]]) -> None:
    published: dict[str, str] = {}
    for name, service in services.items():
        for port in service.get("ports") or []:
            host = str(port).split(":")[0]
            assert host not in published, f"host port {host}: {published.get(host)} and {name}"
            published[host] = name


def test_every_image_is_pinned(services: dict[str, dict[str, Any]]) -> None:
    """No ``:latest`` and no untagged image: MinIO releases differ in what they honour
    (conditional writes), so the compose file names the release it was checked with."""
    for name, service in services.items():
        image = service.get("image", "")
        if not image or name.startswith("airflow"):  # built locally
            continue
        repo, _, tag = image.rpartition(":")
        assert repo and tag and tag != "latest", f"{name}: image {image!r} is not pinned"
    assert services["minio"]["image"].startswith("minio/minio:RELEASE.")
    assert services["minio-init"]["image"].startswith("minio/mc:RELEASE.")


def test_airflow_image_installs_the_extras_without_a_reinstall_step() -> None:
    text = (REPO / "docker/airflow/Dockerfile").read_text()
    assert "[spark,amazon]" in text
    assert "--force-reinstall" not in text


def test_deployment_defers_by_default(services: dict[str, dict[str, Any]]) -> None:
    for name in AIRFLOW:
        assert env(services[name])["AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE"] == "true"


def test_the_kafka_example_reads_the_kafka_service(services: dict[str, dict[str, Any]]) -> None:
    """The Kafka example DAG's broker (AIRFLOW_CKPT_KAFKA) is the kafka service's
    advertised listener, a single-node KRaft broker and controller."""
    kafka = services["kafka"]["environment"]
    assert kafka["KAFKA_PROCESS_ROLES"] == "broker,controller"
    advertised = kafka["KAFKA_ADVERTISED_LISTENERS"].removeprefix("PLAINTEXT://")
    for name in AIRFLOW:
        assert services[name]["environment"]["AIRFLOW_CKPT_KAFKA"] == advertised
