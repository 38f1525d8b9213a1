"""The Triton replicas' objects: Deployment, Services, HorizontalPodAutoscaler (and prometheus-adapter's rule for it),
PodDisruptionBudget, the gpu overlay's patch, and an overlay rendered as ``kubectl kustomize`` renders it."""

from __future__ import annotations

import copy
from typing import Any

from recserve.constants import GRPC_PORT, HTTP_PORT, METRICS_PORT
from recserve.deploy.k8s.k8s_settings import GRACE_MARGIN_S, LIVE_PATH, MODELS_PATH, READY_PATH, K8sSettings, labels
from recserve.deploy.k8s.sentinel_objects import store_objects
from recserve.deploy.k8s.store_objects import store_mount
from recserve.serving.triton_server.launcher import serving_flags


def triton_args(s: K8sSettings) -> list[str]:
    return [
        f"--model-repository={MODELS_PATH}",
        f"--http-port={HTTP_PORT}",
        f"--grpc-port={GRPC_PORT}",
        f"--metrics-port={METRICS_PORT}",
        *serving_flags(s.exit_timeout_s, s.latency_quantiles),
        "--allow-metrics=true",
    ]


def _probe(path: str, period_s: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": period_s,
        "failureThreshold": failures,
        "timeoutSeconds": 2,
    }


def deployment(s: K8sSettings, store: dict | None = None) -> dict[str, Any]:
    """The Triton replicas; with ``store`` (the session layout's store record) the store's Secret mounted."""
    container: dict[str, Any] = {
        "name": "triton",
        "image": s.image,
        "command": ["tritonserver"],
        "args": triton_args(s),
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
    if store is not None:
        mount, volume = store_mount(s, store)
        container["volumeMounts"].append(mount)
        pod["volumes"].append(volume)
    if s.repository == "volume":
        container["volumeMounts"].append({"name": "models", "mountPath": MODELS_PATH, "readOnly": True})
        pod["volumes"].append(
            {"name": "models", "persistentVolumeClaim": {"claimName": s.repository_claim, "readOnly": True}}
        )
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": s.name, "namespace": s.namespace, "labels": labels(s)},
        "spec": {  # no replicas: the autoscaler owns the count, and an apply would reset it
            "selector": {"matchLabels": {"app": s.name}},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            "template": {"metadata": {"labels": labels(s)}, "spec": pod},
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
        "metadata": {"name": s.name, "namespace": s.namespace, "labels": labels(s)},
        "spec": {"selector": {"app": s.name}, "ports": ports},
    }


def pods_service(s: K8sSettings) -> dict[str, Any]:
    """A headless Service: one DNS record per ready pod, what Prometheus discovers the replicas by."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": f"{s.name}-pods", "namespace": s.namespace, "labels": labels(s)},
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
        "metadata": {"name": s.name, "namespace": s.namespace, "labels": labels(s)},
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
        "metadata": {"name": s.name, "namespace": s.namespace, "labels": labels(s)},
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


def render_overlay(s: K8sSettings, overlay: str, store: dict | None = None) -> list[dict[str, Any]]:
    """The objects ``kubectl kustomize overlays/<overlay>`` yields: the base, with the gpu patch applied."""
    objects = [deployment(s, store), service(s), pods_service(s), autoscaler(s), disruption_budget(s)]
    if store is not None and s.store != "external":
        objects += [obj for name, obj in store_objects(s, store).items() if name != "store-networkpolicy.yaml"]
    if overlay == "gpu":
        pod = objects[0]["spec"]["template"]["spec"]
        patch = gpu_patch(s)["spec"]["template"]["spec"]
        resources = pod["containers"][0]["resources"]
        for key in ("requests", "limits"):
            resources[key] |= patch["containers"][0]["resources"][key]
        pod["tolerations"] = copy.deepcopy(patch["tolerations"])
    return objects
