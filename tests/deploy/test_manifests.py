"""Every compose, Kubernetes and KEDA file parses, validates against its schema, and
agrees with the code: setting names, ports, health paths and metric names."""

from __future__ import annotations

import json
import re
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from shared import metric_names
from shared.sentinel import parse_sentinel_url
from shared.settings import Settings
from worker.metrics import WorkerMetrics

ROOT = Path(__file__).parents[2]
K8S = sorted((ROOT / "deploy" / "k8s").glob("*.yaml"))
K8S_VERSION = "1.31"
SETTING_NAMES = {f"TOKENQ_{name.upper()}" for name in Settings.model_fields}
METRIC_NAMES = {v for k, v in vars(metric_names).items() if k.isupper()}


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _compose() -> dict[str, Any]:
    return dict(yaml.safe_load((ROOT / "docker-compose.yml").read_text()))


def test_compose_matches_the_compose_spec() -> None:
    schema_file = resources.files("check_jsonschema") / "builtin_schemas/vendor/compose-spec.json"
    jsonschema.validate(_compose(), json.loads(schema_file.read_text()))


def test_compose_has_gpu_and_cpu_workers_and_a_monitoring_profile() -> None:
    services = _compose()["services"]
    devices = services["worker-gpu"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["capabilities"] == ["gpu"]
    assert services["worker-cpu"]["profiles"] == ["cpu"]
    assert {"prometheus", "grafana"} <= {
        n for n, s in services.items() if "monitoring" in s.get("profiles", [])
    }
    assert "--requirepass" in services["redis"]["command"]


def test_compose_mounts_files_that_exist() -> None:
    for service in _compose()["services"].values():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (ROOT / source).exists(), source
        build = service.get("build")
        if build:
            assert (ROOT / build["dockerfile"]).exists()


def _schema(name: str) -> dict[str, Any]:
    return dict(json.loads((Path(__file__).parent / name).read_text()))


@pytest.mark.parametrize("path", K8S, ids=lambda p: p.name)
def test_kubernetes_manifests_validate(path: Path) -> None:
    for doc in _docs(path):
        if doc["apiVersion"].startswith("keda.sh/"):
            jsonschema.validate(doc, _schema("keda_scaledobject.schema.json"))
        elif doc["apiVersion"].startswith("leaderworkerset.x-k8s.io/"):
            jsonschema.validate(doc, _schema("leaderworkerset.schema.json"))
            for role in ("leaderTemplate", "workerTemplate"):
                template = doc["spec"]["leaderWorkerTemplate"][role]
                pod_template: dict[str, Any] = {"apiVersion": "v1", "kind": "PodTemplate"}
                pod_template |= {"metadata": {"name": role.lower()}, "template": template}
                kubernetes_validate.validate(pod_template, K8S_VERSION, strict=True)
        else:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def _all_env_names() -> set[str]:
    text = (ROOT / "docker-compose.yml").read_text() + "".join(p.read_text() for p in K8S)
    text += (ROOT / "docker-compose.sentinel.yml").read_text()
    text += (ROOT / "docker-compose.vllm.yml").read_text()
    text += "".join(p.read_text() for p in (ROOT / "deploy").glob("*.Dockerfile"))
    return set(re.findall(r"\bTOKENQ_[A-Z0-9_]+", text)) - {"TOKENQ_REDIS_PASSWORD"}


def test_every_setting_named_in_deploy_files_exists() -> None:
    unknown = _all_env_names() - SETTING_NAMES
    assert not unknown, f"not settings in shared/settings.py: {sorted(unknown)}"


def test_worker_pods_drain_before_they_are_killed_and_probe_real_paths() -> None:
    config = _docs(ROOT / "deploy" / "k8s" / "configmap.yaml")[0]["data"]
    worker = _docs(ROOT / "deploy" / "k8s" / "worker.yaml")[0]["spec"]["template"]["spec"]
    assert worker["terminationGracePeriodSeconds"] > float(config["TOKENQ_DRAIN_TIMEOUT_S"])
    container = worker["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert container["ports"][0]["containerPort"] == int(config["TOKENQ_WORKER_METRICS_PORT"])
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"


def _metric_names_in(text: str) -> set[str]:
    found = set(re.findall(r"tokenq:[a-z0-9_]+", text))
    return {re.sub(r"_(total|bucket|count|sum)$", "", name) for name in found}


def test_autoscaler_and_dashboard_query_metrics_that_are_exported() -> None:
    keda = [p.read_text() for p in K8S if "keda.sh/" in p.read_text()]
    grafana = (ROOT / "deploy" / "grafana" / "dashboards" / "tokenq.json").read_text()
    assert len(keda) >= 2
    for text in (*keda, grafana):
        unknown = _metric_names_in(text) - METRIC_NAMES
        assert not unknown, f"queried but never exported: {sorted(unknown)}"
    exported = _metric_names_in(WorkerMetrics("m").render().decode())
    assert exported <= METRIC_NAMES


def test_grafana_dashboard_has_the_charts_operators_need() -> None:
    dashboard = json.loads((ROOT / "deploy" / "grafana" / "dashboards" / "tokenq.json").read_text())
    titles = {p["title"] for p in dashboard["panels"]}
    assert {
        "Queue depth per priority",
        "Tokens/s per worker",
        "Time to first token p50 / p95",
    } <= titles
    for path in (ROOT / "deploy" / "grafana" / "provisioning").rglob("*.yml"):
        assert yaml.safe_load(path.read_text())["apiVersion"] == 1


def test_gateway_pods_probe_routes_the_gateway_serves_on_its_port() -> None:
    import inspect

    from producer.gateway.app import create_app
    from producer.gateway.cli import gateway

    paths = set(create_app(Settings()).openapi()["paths"])
    spec = _docs(ROOT / "deploy" / "k8s" / "gateway.yaml")[0]["spec"]["template"]["spec"]
    container = spec["containers"][0]
    assert container["readinessProbe"]["httpGet"]["path"] in paths
    assert container["livenessProbe"]["httpGet"]["path"] in paths
    assert "/metrics" in paths
    default_port = inspect.signature(gateway).parameters["port"].default
    assert container["ports"][0]["containerPort"] == default_port
    assert _compose()["services"]["gateway"]["ports"] == [f"{default_port}:{default_port}"]


def test_the_autoscaler_reads_a_metric_the_gateway_exports() -> None:
    from producer.gateway.metrics import GatewayMetrics

    exported = {m.name for m in GatewayMetrics().registry.collect()}
    keda = (ROOT / "deploy" / "k8s" / "keda-scaledobject.yaml").read_text()
    assert metric_names.QUEUE_DEPTH in keda
    assert metric_names.QUEUE_DEPTH in exported


def _sentinel_compose() -> dict[str, Any]:
    return dict(yaml.safe_load((ROOT / "docker-compose.sentinel.yml").read_text()))


def test_the_sentinel_compose_file_matches_the_compose_spec_and_mounts_what_exists() -> None:
    schema_file = resources.files("check_jsonschema") / "builtin_schemas/vendor/compose-spec.json"
    compose = _sentinel_compose()
    jsonschema.validate(compose, json.loads(schema_file.read_text()))
    for service in compose["services"].values():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            assert not source.startswith("./") or (ROOT / source).exists(), source


def test_the_sentinel_variant_survives_a_primary_lost_with_a_replica_to_confirm_writes() -> None:
    """Three sentinels (quorum 2) watch the base file's redis; two replicas, so that with
    one replica required a failover leaves one; tokenq's processes reach the primary
    through every sentinel, by the name the sentinels monitor."""
    services = _sentinel_compose()["services"]
    base = _compose()["services"]
    sentinels = [n for n, s in services.items() if "sentinel.sh" in str(s.get("entrypoint"))]
    replicas = [n for n, s in services.items() if "--replicaof" in s.get("command", [])]
    assert len(sentinels) == 3 and len(replicas) == 2
    for name in replicas:
        command = services[name]["command"]
        assert command[command.index("--replicaof") + 1] == "redis" and "redis" in base
    script = (ROOT / "deploy" / "sentinel" / "sentinel.sh").read_text()
    assert "sentinel monitor tokenq ${REDIS_PRIMARY_HOST} 6379 ${SENTINEL_QUORUM:-2}" in script
    assert {services[n]["environment"]["REDIS_PRIMARY_HOST"] for n in sentinels} == {"redis"}
    for name in ("gateway", "worker-gpu", "worker-cpu"):
        env = services[name]["environment"]
        url = parse_sentinel_url(re.sub(r"\$\{[^}]*\}", "password", env["TOKENQ_REDIS_URL"]))
        assert (url.service, {h for h, _ in url.sentinels}) == ("tokenq", set(sentinels))
        assert int(env["TOKENQ_REDIS_MIN_REPLICAS"]) == len(replicas) - 1


def test_the_kubernetes_sentinel_variant_runs_three_redis_and_sentinel_pods() -> None:
    docs = {d["kind"]: d for d in _docs(ROOT / "deploy" / "k8s" / "redis-sentinel.yaml")}
    statefulset, scripts = docs["StatefulSet"], docs["ConfigMap"]["data"]
    assert statefulset["spec"]["replicas"] == 3
    assert {c["name"] for c in statefulset["spec"]["template"]["spec"]["containers"]} == {
        "redis", "sentinel",
    }  # fmt: skip
    assert (
        "sentinel monitor tokenq ${primary:-tokenq-redis-0.tokenq-redis} 6379 2"
        in scripts["sentinel.sh"]
    )
    shipped = (ROOT / "deploy" / "redis.conf").read_text()
    for line in ("appendonly yes", "appendfsync everysec", "maxmemory-policy noeviction"):
        assert line in shipped and line in scripts["redis.conf"]
    assert docs["PodDisruptionBudget"]["spec"]["maxUnavailable"] == 1
    header = (ROOT / "deploy" / "k8s" / "redis-sentinel.yaml").read_text().splitlines()
    url = next(line.split(": ", 1)[1] for line in header if "TOKENQ_REDIS_URL:" in line)
    parsed = parse_sentinel_url(url)
    name, _ = statefulset["metadata"]["name"], docs["Service"]["metadata"]["name"]
    assert parsed.service == "tokenq"
    assert parsed.sentinels == [(f"{name}-{i}.{name}", 26379) for i in range(3)]
