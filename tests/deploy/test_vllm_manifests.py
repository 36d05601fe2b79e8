"""The vLLM workers' deployment (issue 46, models past one machine): the multi-node
LeaderWorkerSet, its KEDA ScaledObject and docker-compose.vllm.yml run `tokenq worker`
with flags it has, give the engine exactly the GPUs its parallelism asks for, point Ray
workers at their head, scale whole groups, and give the head time to drain."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import click
import jsonschema
import pytest
import typer
import yaml

from producer.cli import app

ROOT = Path(__file__).parents[2]
LWS_FILE = ROOT / "deploy" / "k8s" / "worker-vllm-multinode.yaml"
KEDA_FILE = ROOT / "deploy" / "k8s" / "worker-vllm-multinode-keda.yaml"
COMPOSE_FILE = ROOT / "docker-compose.vllm.yml"
DOCKERFILE = ROOT / "deploy" / "worker-vllm.Dockerfile"
GPU = "nvidia.com/gpu"


@dataclass(frozen=True)
class WorkerArgs:
    """A `tokenq worker` argument list, read the way its parser reads it."""

    values: dict[str, list[str]]
    switches: set[str]

    def one(self, flag: str, default: str | None = None) -> str:
        found = self.values.get(flag, [] if default is None else [default])
        assert len(found) == 1, f"{flag}: {found}"
        return found[0]

    def parallel(self) -> tuple[int, int]:
        tp = int(self.one("--tensor-parallel-size", "1"))
        return tp, int(self.one("--pipeline-parallel-size", "1"))

    def vllm_args(self) -> dict[str, str]:
        return dict(arg.split("=", 1) for arg in self.values.get("--vllm-arg", []))


def _worker_options() -> tuple[set[str], set[str]]:
    """The options `tokenq worker` takes a value for, and its switches."""
    group = typer.main.get_command(app)
    command = group.get_command(click.Context(group), "worker")  # type: ignore[arg-type,attr-defined]
    values: set[str] = set()
    switches: set[str] = set()
    for param in command.params:
        names = {*param.opts, *param.secondary_opts}
        (switches if getattr(param, "is_flag", False) else values).update(names)
    return values, switches


def parse_worker_args(argv: list[str]) -> WorkerArgs:
    """Every token a known option or its value; no positional arguments."""
    value_flags, switch_flags = _worker_options()
    values: dict[str, list[str]] = {}
    switches: set[str] = set()
    tokens = iter(argv)
    for token in tokens:
        if token in switch_flags:
            switches.add(token)
        elif token in value_flags:
            values.setdefault(token, []).append(next(tokens))
        else:
            raise AssertionError(f"`tokenq worker` has no option {token!r}")
    return WorkerArgs(values, switches)


def _docs(path: Path) -> dict[str, dict[str, Any]]:
    return {d["kind"]: d for d in yaml.safe_load_all(path.read_text()) if d}


def _lws() -> dict[str, Any]:
    return _docs(LWS_FILE)["LeaderWorkerSet"]


def _pod(role: str) -> dict[str, Any]:
    return dict(_lws()["spec"]["leaderWorkerTemplate"][role]["spec"])


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


def _gpus(container: dict[str, Any]) -> int:
    resources_ = container["resources"]
    assert resources_["limits"][GPU] == resources_["requests"][GPU]
    return int(resources_["limits"][GPU])


def _compose() -> dict[str, Any]:
    return dict(yaml.safe_load(COMPOSE_FILE.read_text()))


def _compose_gpus(service: dict[str, Any]) -> int:
    (device,) = service["deploy"]["resources"]["reservations"]["devices"]
    assert device["capabilities"] == ["gpu"]
    return int(device["count"])


def _image_entrypoint() -> list[str]:
    line = next(x for x in DOCKERFILE.read_text().splitlines() if x.startswith("ENTRYPOINT"))
    return list(json.loads(line.removeprefix("ENTRYPOINT")))


def _lines(script: str) -> list[str]:
    """A shell script's commands, continuation lines joined."""
    return [line.strip() for line in script.replace("\\\n", " ").splitlines()]


def _head_port(script: str) -> int:
    starts = [shlex.split(line) for line in _lines(script) if "ray start --head" in line]
    (start,) = starts
    (port,) = [arg.split("=", 1)[1] for arg in start if arg.startswith("--port=")]
    return int(port)


def test_the_options_the_tests_accept_are_the_worker_commands_own() -> None:
    """The parser the manifest tests use refuses a flag `tokenq worker` lacks."""
    assert parse_worker_args(["--model", "m", "--burst"]).values == {"--model": ["m"]}
    with pytest.raises(AssertionError, match="no option '--tensor-parallel'"):
        parse_worker_args(["--tensor-parallel", "2"])


def test_the_group_head_runs_the_ray_head_then_one_tokenq_worker_on_vllm_over_ray() -> None:
    head = _pod("leaderTemplate")["containers"][0]
    shell, flag, script, _ = head["command"]
    assert (shell, flag) == ("/bin/bash", "-c")
    lines = _lines(script)
    ray_head = next(i for i, x in enumerate(lines) if x.startswith("ray start --head"))
    assert ray_head < lines.index('exec tokenq worker "$@"') == len(lines) - 1
    args = parse_worker_args(head["args"])
    assert args.one("--engine") == "vllm"
    assert args.vllm_args()["distributed_executor_backend"] == "ray"


def test_the_group_has_exactly_the_gpus_tensor_times_pipeline_parallel_asks_for() -> None:
    """Tensor-parallel within a node, pipeline-parallel across them: each pod holds one
    stage's GPUs, and the group has a pod per stage."""
    lws = _lws()["spec"]["leaderWorkerTemplate"]
    head = _pod("leaderTemplate")["containers"][0]
    (worker,) = _pod("workerTemplate")["containers"]
    tp, pp = parse_worker_args(head["args"]).parallel()
    assert pp > 1, "a multi-node group pipelines across its nodes"
    assert _gpus(head) == _gpus(worker) == tp
    assert lws["size"] == pp
    assert _gpus(head) + (lws["size"] - 1) * _gpus(worker) == tp * pp
    assert int(_env(head)["GROUP_GPUS"]) == tp * pp
    assert 'int(os.environ["GROUP_GPUS"])' in head["command"][2]


def test_the_ray_workers_join_the_head_the_group_service_names() -> None:
    """LWS_LEADER_ADDRESS is the leader pod's name in the group's headless service; the
    workers wait for, join, are ready with and outwait the Ray head at its port."""
    head = _pod("leaderTemplate")["containers"][0]
    (worker,) = _pod("workerTemplate")["containers"]
    port = _head_port(head["command"][2])
    assert {"name": "ray-gcs", "containerPort": port} in head["ports"]
    script = worker["command"][2]
    assert f'head="$LWS_LEADER_ADDRESS:{port}"' in script
    assert 'ray health-check --address "$head"' in script
    (start,) = [shlex.split(x) for x in _lines(script) if "ray start" in x]
    assert '--address="$head"' in script and "--block" in start
    address = f'"$LWS_LEADER_ADDRESS:{port}"'
    assert address in worker["readinessProbe"]["exec"]["command"][-1]
    assert worker["readinessProbe"]["timeoutSeconds"] >= 10, "ray health-check imports Ray"
    assert address in worker["lifecycle"]["preStop"]["exec"]["command"][-1]
    assert "networkConfig" not in _lws()["spec"], "one shared service names every leader"


def test_every_pod_of_the_group_has_shared_memory_and_its_own_address_for_nccl() -> None:
    for role in ("leaderTemplate", "workerTemplate"):
        pod = _pod(role)
        (container,) = pod["containers"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
        host_ip = next(e for e in container["env"] if e["name"] == "VLLM_HOST_IP")
        assert host_ip["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
        assert '--node-ip-address="$VLLM_HOST_IP"' in container["command"][2]


def test_the_head_is_probed_like_every_worker_and_drains_before_its_group_goes() -> None:
    config = yaml.safe_load((ROOT / "deploy" / "k8s" / "configmap.yaml").read_text())["data"]
    leader, worker_pod = _pod("leaderTemplate"), _pod("workerTemplate")
    head = leader["containers"][0]
    drain_s = float(_env(head)["TOKENQ_DRAIN_TIMEOUT_S"])
    assert leader["terminationGracePeriodSeconds"] > drain_s
    assert worker_pod["terminationGracePeriodSeconds"] > leader["terminationGracePeriodSeconds"]
    metrics = next(p for p in head["ports"] if p["name"] == "metrics")
    assert metrics["containerPort"] == int(config["TOKENQ_WORKER_METRICS_PORT"])
    for probe in ("startupProbe", "readinessProbe"):
        assert head[probe]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert head["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    annotations = _lws()["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["metadata"]
    assert annotations["annotations"]["prometheus.io/port"] == str(metrics["containerPort"])


def test_keda_scales_whole_groups_on_one_groups_batch() -> None:
    lws, scaled = _lws(), _docs(KEDA_FILE)["ScaledObject"]
    target = scaled["spec"]["scaleTargetRef"]
    assert (target["apiVersion"], target["kind"]) == (lws["apiVersion"], lws["kind"])
    assert target["name"] == lws["metadata"]["name"]
    head = _pod("leaderTemplate")["containers"][0]
    args = parse_worker_args(head["args"])
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["metadata"]["threshold"] == args.one("--max-num-seqs")
    models = set(re.findall(r'model="([^"]+)"', trigger["metadata"]["query"]))
    assert models == {args.one("--served-model-name")}
    drain_s = float(_env(head)["TOKENQ_DRAIN_TIMEOUT_S"])
    assert scaled["spec"]["cooldownPeriod"] > drain_s


def test_the_vllm_compose_file_matches_the_compose_spec_and_builds_the_vllm_image() -> None:
    schema_file = resources.files("check_jsonschema") / "builtin_schemas/vendor/compose-spec.json"
    compose = _compose()
    jsonschema.validate(compose, json.loads(schema_file.read_text()))
    for service in compose["services"].values():
        assert ROOT / service["build"]["dockerfile"] == DOCKERFILE
        assert service["shm_size"]
    assert _image_entrypoint() == ["tokenq", "worker"]
    assert "pip install '.[vllm]'" in DOCKERFILE.read_text()


def test_the_one_node_service_gives_tensor_parallel_all_its_gpus() -> None:
    service = _compose()["services"]["worker-vllm"]
    args = parse_worker_args(service["command"])
    assert args.one("--engine") == "vllm"
    tp, pp = args.parallel()
    assert (tp, pp) == (_compose_gpus(service), 1)
    assert "distributed_executor_backend" not in args.vllm_args()
    drain_s = float(service["environment"]["TOKENQ_DRAIN_TIMEOUT_S"])
    assert int(service["stop_grace_period"].removesuffix("s")) > drain_s


def test_the_compose_head_and_worker_pair_adds_up_and_meets_at_the_heads_port() -> None:
    """One host each (a compose file cannot span hosts): the head's tokenq worker, over
    Ray, uses its own GPUs and the worker host's, one pipeline stage per host."""
    services = _compose()["services"]
    head, worker = services["ray-head"], services["ray-worker"]
    assert head["network_mode"] == worker["network_mode"] == "host"
    shell, flag, script, _ = head["entrypoint"]
    assert (shell, flag) == ("/bin/bash", "-c")
    assert script.strip().splitlines()[-1] == 'exec tokenq worker "$$@"'
    args = parse_worker_args(head["command"])
    assert args.one("--engine") == "vllm"
    assert args.vllm_args()["distributed_executor_backend"] == "ray"
    tp, pp = args.parallel()
    assert _compose_gpus(head) == _compose_gpus(worker) == tp and pp == 2
    assert int(head["environment"]["GROUP_GPUS"]) == tp * pp
    port = _head_port(script)
    assert 'head="$${RAY_HEAD_IP:?' in worker["entrypoint"][2]
    assert re.search(rf'RAY_HEAD_IP:\?[^}}]*}}:{port}"', worker["entrypoint"][2])
    assert '--address="$$head"' in worker["entrypoint"][2]
    drain_s = float(head["environment"]["TOKENQ_DRAIN_TIMEOUT_S"])
    head_grace_s = int(head["stop_grace_period"].removesuffix("s"))
    assert int(worker["stop_grace_period"].removesuffix("s")) > head_grace_s > drain_s


def _scripts() -> dict[str, list[str]]:
    """Every shell command line these files run, as argv (compose's `$$` undone)."""
    lws = _lws()["spec"]["leaderWorkerTemplate"]
    head = lws["leaderTemplate"]["spec"]["containers"][0]
    (worker,) = lws["workerTemplate"]["spec"]["containers"]
    services = _compose()["services"]
    compose = {
        name: [arg.replace("$$", "$") for arg in services[name]["entrypoint"]]
        + services[name].get("command", [])
        for name in ("ray-head", "ray-worker")
    }
    return {
        "k8s head": head["command"] + head["args"],
        "k8s ray worker": worker["command"],
        "k8s ray worker preStop": worker["lifecycle"]["preStop"]["exec"]["command"],
        "k8s ray worker readiness": worker["readinessProbe"]["exec"]["command"],
        "compose ray-head": compose["ray-head"],
        "compose ray-worker": compose["ray-worker"],
    }


def test_every_shell_script_parses() -> None:
    for name, argv in _scripts().items():
        assert argv[:2] == ["/bin/bash", "-c"], name
        checked = subprocess.run(["bash", "-n", "-c", argv[2]], capture_output=True, text=True)
        assert checked.returncode == 0, f"{name}: {checked.stderr}"


def _stand_ins(tmp_path: Path, gpus: int) -> dict[str, str]:
    """`ray` and `tokenq` that print their arguments, and a `ray` module whose cluster
    has `gpus` GPUs: the scripts run as they would, minus the cluster."""
    bin_dir, py_dir = tmp_path / "bin", tmp_path / "py"
    bin_dir.mkdir(parents=True)
    py_dir.mkdir(parents=True)
    for tool in ("ray", "tokenq"):
        (bin_dir / tool).write_text(f'#!/bin/sh\nprintf "{tool}"; printf " %s" "$@"; echo\n')
        (bin_dir / tool).chmod(0o755)
    (py_dir / "ray.py").write_text(
        f"def init(**kwargs): pass\ndef cluster_resources(): return {{'GPU': {gpus}}}\n"
    )
    path = f"{bin_dir}:{os.environ['PATH']}"
    return {"PATH": path, "PYTHONPATH": str(py_dir), "LWS_LEADER_ADDRESS": "g-0.g"}


def test_the_head_starts_ray_then_hands_tokenq_worker_its_args_once_the_gpus_joined(
    tmp_path: Path,
) -> None:
    head = _pod("leaderTemplate")["containers"][0]
    env = _stand_ins(tmp_path, gpus=16) | {"VLLM_HOST_IP": "10.0.0.5", "GROUP_GPUS": "16"}
    run = subprocess.run(_scripts()["k8s head"], env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    ray, tokenq = run.stdout.splitlines()
    assert shlex.split(ray)[:3] == ["ray", "start", "--head"]
    assert "--node-ip-address=10.0.0.5" in shlex.split(ray)
    assert shlex.split(tokenq) == ["tokenq", "worker", *head["args"]]
    waiting = _stand_ins(tmp_path / "short", gpus=8) | {"VLLM_HOST_IP": "x", "GROUP_GPUS": "16"}
    with pytest.raises(subprocess.TimeoutExpired):
        subprocess.run(_scripts()["k8s head"], env=waiting, capture_output=True, timeout=3)


@pytest.mark.parametrize("script", ["k8s ray worker", "compose ray-worker"])
def test_a_ray_worker_joins_the_heads_address(tmp_path: Path, script: str) -> None:
    env = _stand_ins(tmp_path, gpus=0) | {"VLLM_HOST_IP": "10.0.0.6", "RAY_HEAD_IP": "g-0.g"}
    run = subprocess.run(_scripts()[script], env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    *_, start = run.stdout.splitlines()
    assert shlex.split(start)[:3] == ["ray", "start", "--address=g-0.g:6379"]
    assert "--block" in shlex.split(start)
