"""Kubernetes manifests for Triton replicas serving a recserve repository, from one settings object.

``write_manifests`` writes a kustomize layout (``base/`` plus ``overlays/cpu`` and ``overlays/gpu``), the
same overlays rendered (``rendered/cpu.yaml``, ``rendered/gpu.yaml``: what ``kubectl kustomize`` gives, for
clusters without it), a KServe ``InferenceService`` alternative (``kserve/``) and the monitoring files
(``monitoring/``: Prometheus scrape config, alerting rules, Grafana dashboard).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from recserve.constants import GRPC_PORT, HTTP_PORT, METRICS_PORT
from recserve.deploy.monitoring import alert_rules, grafana_dashboard, scrape_config
from recserve.errors import ServingError

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
    replicas: int = Field(2, ge=1)
    max_replicas: int = Field(8, ge=1)
    target_cpu_utilization: int = Field(70, ge=1, le=100)  # the HorizontalPodAutoscaler's target
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
        "--strict-readiness=true",
        f"--exit-timeout-secs={s.exit_timeout_s}",
        "--metrics-config=summary_latencies=true",
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
    }
    if s.repository == "volume":
        container["volumeMounts"] = [{"name": "models", "mountPath": MODELS_PATH, "readOnly": True}]
        pod["volumes"] = [
            {"name": "models", "persistentVolumeClaim": {"claimName": s.repository_claim, "readOnly": True}}
        ]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": s.name, "namespace": s.namespace, "labels": _labels(s)},
        "spec": {
            "replicas": s.replicas,
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


def autoscaler(s: K8sSettings) -> dict[str, Any]:
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": s.name, "namespace": s.namespace, "labels": _labels(s)},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": s.name},
            "minReplicas": s.replicas,
            "maxReplicas": s.max_replicas,
            "metrics": [
                {
                    "type": "Resource",
                    "resource": {
                        "name": "cpu",
                        "target": {"type": "Utilization", "averageUtilization": s.target_cpu_utilization},
                    },
                }
            ],
        },
    }


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


def inference_service(s: K8sSettings) -> dict[str, Any]:
    """The KServe alternative: its Triton runtime on the same repository (from a volume or storage URI)."""
    storage = f"pvc://{s.repository_claim}" if s.repository == "volume" else "s3://BUCKET/PATH/TO/REPOSITORY"
    return {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": {"name": s.name, "namespace": s.namespace, "labels": {"app": s.name}},
        "spec": {
            "predictor": {
                "minReplicas": s.replicas,
                "maxReplicas": s.max_replicas,
                "triton": {
                    "storageUri": storage,
                    "args": ["--strict-readiness=true", f"--exit-timeout-secs={s.exit_timeout_s}"],
                    "resources": {
                        "requests": {"cpu": s.cpu_request, "memory": s.memory_request},
                        "limits": {"cpu": s.cpu_limit, "memory": s.memory_limit},
                    },
                },
            }
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
    from recserve.serving.triton.repository import read_repository_info

    s.check()
    if not (Path(repo) / "recserve.json").is_file():
        raise ServingError(f"{repo}: not a recserve model repository; write one with `recserve repo`")
    info = read_repository_info(repo)
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
        "kserve/inferenceservice.yaml": inference_service(s),
        "monitoring/prometheus.yml": scrape_config(pods_dns=pods_dns(s)),
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
        "kubectl apply -f kserve/inferenceservice.yaml   # the KServe alternative, instead of the above",
        "```",
        "",
        "monitoring/: prometheus.yml (scrape job), alerts.yml (rules), grafana-dashboard.json; docs/deployment.md.",
    ]
    return "\n".join(lines) + "\n"
