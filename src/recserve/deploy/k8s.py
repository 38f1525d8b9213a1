"""Kubernetes manifests for Triton replicas serving a recserve repository, from one settings object.

``write_manifests`` writes a kustomize layout (``base/`` plus ``overlays/cpu`` and ``overlays/gpu``), the
same overlays rendered (``rendered/cpu.yaml``, ``rendered/gpu.yaml``: what ``kubectl kustomize`` gives, for
clusters without it), a KServe ``InferenceService`` alternative (``kserve/``) and the monitoring files
(``monitoring/``: Prometheus scrape config, alerting rules, Grafana dashboard, and the prometheus-adapter rule
that gives the autoscaler each pod's queue time).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from recserve.constants import GRPC_PORT, HTTP_PORT, METRICS_PORT, REPOSITORY_FILE
from recserve.deploy.monitoring import alert_rules, grafana_dashboard, scrape_config
from recserve.errors import ServingError
from recserve.serving.triton_server.bundle import model_backends
from recserve.serving.triton_server.launcher import serving_flags

READY_PATH, LIVE_PATH = "/v2/health/ready", "/v2/health/live"
MODELS_PATH = "/models"
# docs/reliability.md: `recserve serve` drained and exited 5.9 s after SIGTERM with --exit-timeout-secs 10;
# the pod gets Triton's exit timeout plus this margin before Kubernetes kills it
GRACE_MARGIN_S = 15


class K8sSettings(BaseSettings):
    """What the manifests need; each field is also read from RECSERVE_K8S_<NAME> or ``.env.k8s``."""

    model_config = SettingsConfigDict(env_prefix="RECSERVE_K8S_", env_file=".env.k8s", extra="ignore")

    name: str = Field("recserve", pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    namespace: str = Field("default", pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    image: str = "recserve-serve:1"  # deploy/docker/Dockerfile.serve with the repository baked in
    repository: Literal["image", "volume"] = "image"  # the repository from the image, or from a volume
    repository_claim: str | None = None  # with repository=volume: a PersistentVolumeClaim holding it
    replicas: int = Field(2, ge=1)  # the autoscaler's minimum (the Deployment leaves the count to it)
    max_replicas: int = Field(8, ge=1)
    # what the HorizontalPodAutoscaler scales on: each pod's mean queue time a request (Triton's chart does
    # so, through prometheus-adapter's rule in monitoring/), or CPU utilization (no adapter needed)
    scale_on: Literal["queue_time", "cpu"] = "queue_time"
    target_queue_time_us: int = Field(2000, ge=1)  # a fifth of a 10 ms p99 budget spent waiting
    target_cpu_utilization: int = Field(70, ge=1, le=100)
    shm_size: str = "1Gi"  # memory-backed /dev/shm: python models pass tensors through it (64 MiB by default)
    fs_group: int = 1000  # the pod's group: a repository volume is readable by the server's user
    min_available: int = Field(1, ge=0)  # the PodDisruptionBudget
    cpu_request: str = "2"
    cpu_limit: str = "4"
    memory_request: str = "4Gi"
    memory_limit: str = "8Gi"
    gpus: int = Field(1, ge=1)  # the gpu overlay: nvidia.com/gpu per pod
    exit_timeout_s: int = Field(30, ge=1)  # Triton's --exit-timeout-secs: in-flight requests get this long

    def check(self) -> None:
        if self.repository == "volume" and not self.repository_claim:
            raise ServingError(
                "repository volume: set repository_claim (RECSERVE_K8S_REPOSITORY_CLAIM), the "
                "PersistentVolumeClaim that holds the model repository"
            )
        if self.max_replicas < self.replicas:
            raise ServingError(f"max_replicas {self.max_replicas} is below replicas {self.replicas}")


def _labels(s: K8sSettings) -> dict[str, str]:
    return {"app": s.name, "app.kubernetes.io/name": s.name, "app.kubernetes.io/component": "triton"}


def _triton_args(s: K8sSettings) -> list[str]:
    return [
        f"--model-repository={MODELS_PATH}",
        f"--http-port={HTTP_PORT}",
        f"--grpc-port={GRPC_PORT}",
        f"--metrics-port={METRICS_PORT}",
        *serving_flags(s.exit_timeout_s),
        "--allow-metrics=true",
    ]


def _probe(path: str, period_s: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": period_s,
        "failureThreshold": failures,
        "timeoutSeconds": 2,
    }


def deployment(s: K8sSettings) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "triton",
        "image": s.image,
        "command": ["tritonserver"],
        "args": _triton_args(s),
        "ports": [
            {"name": "http", "containerPort": HTTP_PORT},
            {"name": "grpc", "containerPort": GRPC_PORT},
            {"name": "metrics", "containerPort": METRICS_PORT},
        ],
        "readinessProbe": _probe(READY_PATH, 5, 3),
        "livenessProbe": _probe(LIVE_PATH, 10, 3),
        "startupProbe": _probe(READY_PATH, 5, 60),  # model loading: up to 5 minutes
        "resources": {
            "requests": {"cpu": s.cpu_request, "memory": s.memory_request},
            "limits": {"cpu": s.cpu_limit, "memory": s.memory_limit},
        },
        "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "allowPrivilegeEscalation": False},
    }
    pod: dict[str, Any] = {
        "containers": [container],
        "terminationGracePeriodSeconds": s.exit_timeout_s + GRACE_MARGIN_S,
        "securityContext": {"runAsNonRoot": True, "fsGroup": s.fs_group},
    }
    container["volumeMounts"] = [{"name": "shm", "mountPath": "/dev/shm"}]
    pod["volumes"] = [{"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": s.shm_size}}]
    if s.repository == "volume":
        container["volumeMounts"].append({"name": "models", "mountPath": MODELS_PATH, "readOnly": True})
        pod["volumes"].append(
            {"name": "models", "persistentVolumeClaim": {"claimName": s.repository_claim, "readOnly": True}}
        )
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": s.name, "namespace": s.namespace, "labels": _labels(s)},
        "spec": {  # no replicas: the autoscaler owns the count, and an apply would reset it
            "selector": {"matchLabels": {"app": s.name}},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            "template": {"metadata": {"labels": _labels(s)}, "spec": pod},
        },
    }


def service(s: K8sSettings) -> dict[str, Any]:
    ports = [
        {"name": name, "port": port, "targetPort": name}
        for name, port in (("http", HTTP_PORT), ("grpc", GRPC_PORT), ("metrics", METRICS_PORT))
    ]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": s.name, "namespace": s.namespace, "labels": _labels(s)},
        "spec": {"selector": {"app": s.name}, "ports": ports},
    }


def pods_service(s: K8sSettings) -> dict[str, Any]:
    """A headless Service: one DNS record per ready pod, what Prometheus discovers the replicas by."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": f"{s.name}-pods", "namespace": s.namespace, "labels": _labels(s)},
        "spec": {
            "clusterIP": "None",
            "selector": {"app": s.name},
            "ports": [{"name": "metrics", "port": METRICS_PORT, "targetPort": "metrics"}],
        },
    }


def pods_dns(s: K8sSettings) -> str:
    return f"{s.name}-pods.{s.namespace}.svc.cluster.local"


QUEUE_METRIC = "recserve_queue_time_us_per_request"  # what prometheus-adapter's rule names it for the HPA


def autoscaler(s: K8sSettings) -> dict[str, Any]:
    if s.scale_on == "queue_time":
        metric: dict[str, Any] = {
            "type": "Pods",
            "pods": {
                "metric": {"name": QUEUE_METRIC},
                "target": {"type": "AverageValue", "averageValue": str(s.target_queue_time_us)},
            },
        }
    else:
        target = {"type": "Utilization", "averageUtilization": s.target_cpu_utilization}
        metric = {"type": "Resource", "resource": {"name": "cpu", "target": target}}
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": s.name, "namespace": s.namespace, "labels": _labels(s)},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": s.name},
            "minReplicas": s.replicas,
            "maxReplicas": s.max_replicas,
            "metrics": [metric],
        },
    }


def adapter_rules(s: K8sSettings) -> dict[str, Any]:
    """prometheus-adapter's rule (its chart's ``rules.custom``): each pod's queue time a request over the
    last minute, Triton's cumulative queue microseconds over its successful requests."""
    matchers = "<<.LabelMatchers>>"
    query = (
        f"sum(rate(nv_inference_queue_duration_us{{{matchers}}}[1m])) by (<<.GroupBy>>) / "
        f"clamp_min(sum(rate(nv_inference_request_success{{{matchers}}}[1m])) by (<<.GroupBy>>), 0.001)"
    )
    rule = {
        "seriesQuery": f'nv_inference_queue_duration_us{{namespace="{s.namespace}",pod!=""}}',
        "resources": {"overrides": {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}},
        "name": {"matches": "nv_inference_queue_duration_us", "as": QUEUE_METRIC},
        "metricsQuery": query,
    }
    return {"rules": {"custom": [rule]}}


def disruption_budget(s: K8sSettings) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": s.name, "namespace": s.namespace, "labels": _labels(s)},
        "spec": {"minAvailable": s.min_available, "selector": {"matchLabels": {"app": s.name}}},
    }


def gpu_patch(s: K8sSettings) -> dict[str, Any]:
    """The gpu overlay's strategic-merge patch: GPUs requested and limited, NVIDIA's taint tolerated."""
    gpus = {"nvidia.com/gpu": str(s.gpus)}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": s.name, "namespace": s.namespace},
        "spec": {
            "template": {
                "spec": {
                    "containers": [{"name": "triton", "resources": {"requests": gpus, "limits": gpus}}],
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                }
            }
        },
    }


def inference_service(s: K8sSettings, gpu: bool = False) -> dict[str, Any]:
    """The KServe alternative, in its ``predictor.model`` form: the repository (a volume or a storage URI)
    on recserve's serving image through ``serving_runtime`` (NVIDIA's stock image has no recserve for the
    python layouts), with GPUs requested for a GPU repository."""
    storage = f"pvc://{s.repository_claim}" if s.repository == "volume" else "s3://BUCKET/PATH/TO/REPOSITORY"
    resources: dict[str, Any] = {
        "requests": {"cpu": s.cpu_request, "memory": s.memory_request},
        "limits": {"cpu": s.cpu_limit, "memory": s.memory_limit},
    }
    if gpu:
        for key in ("requests", "limits"):
            resources[key]["nvidia.com/gpu"] = str(s.gpus)
    return {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": {"name": s.name, "namespace": s.namespace, "labels": {"app": s.name}},
        "spec": {
            "predictor": {
                "minReplicas": s.replicas,
                "maxReplicas": s.max_replicas,
                "model": {
                    "modelFormat": {"name": "triton"},
                    "runtime": runtime_name(s),
                    "storageUri": storage,
                    "resources": resources,
                },
            }
        },
    }


def runtime_name(s: K8sSettings) -> str:
    return f"{s.name}-triton"


def serving_runtime(s: K8sSettings) -> dict[str, Any]:
    """A KServe ServingRuntime running recserve's serving image's tritonserver on the model KServe mounts."""
    args = [a for a in _triton_args(s) if not a.startswith("--model-repository")]
    return {
        "apiVersion": "serving.kserve.io/v1alpha1",
        "kind": "ServingRuntime",
        "metadata": {"name": runtime_name(s), "namespace": s.namespace, "labels": {"app": s.name}},
        "spec": {
            "supportedModelFormats": [{"name": "triton", "version": "2", "autoSelect": False}],
            "protocolVersions": ["v2", "grpc-v2"],
            "containers": [
                {
                    "name": "kserve-container",
                    "image": s.image,
                    "command": ["tritonserver"],
                    "args": ["--model-repository=/mnt/models", *args],
                    "ports": [{"containerPort": HTTP_PORT, "protocol": "TCP"}],
                }
            ],
        },
    }


def render_overlay(s: K8sSettings, overlay: str) -> list[dict[str, Any]]:
    """The objects ``kubectl kustomize overlays/<overlay>`` yields: the base, with the gpu patch applied."""
    objects = [deployment(s), service(s), pods_service(s), autoscaler(s), disruption_budget(s)]
    if overlay == "gpu":
        pod = objects[0]["spec"]["template"]["spec"]
        patch = gpu_patch(s)["spec"]["template"]["spec"]
        resources = pod["containers"][0]["resources"]
        for key in ("requests", "limits"):
            resources[key] |= patch["containers"][0]["resources"][key]
        pod["tolerations"] = copy.deepcopy(patch["tolerations"])
    return objects


def write_manifests(repo: Path, out: Path, s: K8sSettings) -> list[Path]:
    """Writes every manifest under ``out``; returns the files written. ``repo`` is checked to be a
    recserve repository (its record names the layouts the image must hold)."""
    from recserve.serving.triton_repository.repository_settings import read_repository_info

    s.check()
    if not (Path(repo) / REPOSITORY_FILE).is_file():
        raise ServingError(f"{repo}: not a recserve model repository; write one with `recserve repo`")
    info = read_repository_info(repo)
    _check_image_backends(Path(repo))
    files: dict[str, Any] = {
        "base/deployment.yaml": deployment(s),
        "base/service.yaml": service(s),
        "base/pods.yaml": pods_service(s),
        "base/hpa.yaml": autoscaler(s),
        "base/pdb.yaml": disruption_budget(s),
        "base/kustomization.yaml": _kustomization(
            ["deployment.yaml", "service.yaml", "pods.yaml", "hpa.yaml", "pdb.yaml"]
        ),
        "overlays/cpu/kustomization.yaml": _kustomization(["../../base"]),
        "overlays/gpu/kustomization.yaml": _kustomization(["../../base"]) | {"patches": [{"path": "gpu.yaml"}]},
        "overlays/gpu/gpu.yaml": gpu_patch(s),
        "kserve/inferenceservice.yaml": inference_service(s, gpu=serves_on_gpus(info)),
        "kserve/servingruntime.yaml": serving_runtime(s),
        "monitoring/prometheus.yml": scrape_config(pods_dns=pods_dns(s)),
        "monitoring/prometheus-adapter.yaml": adapter_rules(s),
        "monitoring/alerts.yml": alert_rules(),
    }
    written = []
    for relative, content in files.items():
        written.append(_write(Path(out) / relative, yaml.safe_dump(content, sort_keys=False)))
    for overlay in ("cpu", "gpu"):
        text = yaml.safe_dump_all(render_overlay(s, overlay), sort_keys=False)
        written.append(_write(Path(out) / "rendered" / f"{overlay}.yaml", text))
    written.append(
        _write(Path(out) / "monitoring" / "grafana-dashboard.json", json.dumps(grafana_dashboard(), indent=2))
    )
    written.append(_write(Path(out) / "README.md", _readme(s, info)))
    return written


def _check_image_backends(repo: Path) -> None:
    """The serving image is NVIDIA's Triton container with recserve installed: Triton's own backends, not
    recserve's (native/triton-backend is built against a source checkout's torch)."""
    from recserve.serving.triton_repository.native_configs import RECSERVE_BACKEND

    for model, backend, _ in model_backends(repo):
        if backend == RECSERVE_BACKEND:
            raise ServingError(
                f"{repo}: {model} runs on recserve's own Triton backend, which the serving image "
                "(deploy/docker/Dockerfile.serve, NVIDIA's Triton container) does not hold: write the repository "
                "with `recserve repo --native-runtime pytorch` for Kubernetes"
            )


def serves_on_gpus(info: dict) -> bool:
    """Whether a repository's record has a layout exported for a GPU."""
    return any(str(layout.get("device", "cpu")) in ("cuda", "gpu") for layout in info.get("layouts", {}).values())


def _kustomization(resources: list[str]) -> dict[str, Any]:
    return {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", "resources": resources}


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text if text.endswith("\n") else text + "\n")
    return path


def _readme(s: K8sSettings, info: dict) -> str:
    layouts = ", ".join(sorted(info.get("layouts", {}))) or "unknown"
    lines = [
        f"# {s.name}: Triton on Kubernetes",
        "",
        f"Written by `recserve deploy k8s` for a repository with the layouts {layouts}.",
        "",
        "```bash",
        f"docker build -f deploy/docker/Dockerfile.serve --build-arg REPO=<repo> -t {s.image} .",
        "kubectl apply -k overlays/gpu   # or overlays/cpu; without kustomize: kubectl apply -f rendered/gpu.yaml",
        "kubectl apply -f kserve/servingruntime.yaml -f kserve/inferenceservice.yaml   # the KServe alternative",
        "```",
        "",
        "monitoring/: prometheus.yml (scrape job), alerts.yml (rules), grafana-dashboard.json, and",
        "prometheus-adapter.yaml: the rule that gives the autoscaler each pod's queue time",
        "(`helm install prometheus-adapter prometheus-community/prometheus-adapter \\`",
        "`-f monitoring/prometheus-adapter.yaml`;",
        "RECSERVE_K8S_SCALE_ON=cpu scales on CPU instead, without the adapter); docs/deployment.md.",
    ]
    return "\n".join(lines) + "\n"
