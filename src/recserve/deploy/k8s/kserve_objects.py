"""The KServe alternative: an ``InferenceService`` on a ``ServingRuntime`` that runs recserve's serving image."""

from __future__ import annotations

from typing import Any

from recserve.constants import HTTP_PORT
from recserve.deploy.k8s.k8s_settings import K8sSettings
from recserve.deploy.k8s.triton_objects import triton_args


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
    args = [a for a in triton_args(s) if not a.startswith("--model-repository")]
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
