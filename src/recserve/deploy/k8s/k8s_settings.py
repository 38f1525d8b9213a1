"""What the Kubernetes manifests are made from: ``K8sSettings`` (each field also read from RECSERVE_K8S_<NAME> or
``.env.k8s``), and the names and labels every object shares."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from recserve.errors import ServingError
from recserve.serving.triton_server.launcher import check_latency_quantiles

READY_PATH, LIVE_PATH = "/v2/health/ready", "/v2/health/live"

MODELS_PATH = "/models"

# docs/reliability.md: `recserve serve` drained and exited 5.9 s after SIGTERM with --exit-timeout-secs 10;
# the pod gets Triton's exit timeout plus this margin before Kubernetes kills it
GRACE_MARGIN_S = 15


class K8sSettings(BaseSettings):
    """What the manifests need; each field is also read from RECSERVE_K8S_<NAME> or ``.env.k8s``, and those
    with a description are options of ``recserve deploy k8s`` (``K8S_OPTIONS``)."""

    model_config = SettingsConfigDict(env_prefix="RECSERVE_K8S_", env_file=".env.k8s", extra="ignore")

    name: str = Field(
        "recserve",
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        description="Name of the Deployment, Service and the rest.",
    )
    namespace: str = Field("default", pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", description="Kubernetes namespace.")
    image: str = Field(
        "recserve-serve:1", description="Serving image (deploy/docker/Dockerfile.serve, the repository baked in)."
    )
    repository: Literal["image", "volume"] = Field(
        "image", description="image (baked in) or volume (a PersistentVolumeClaim)."
    )
    repository_claim: str | None = Field(None, description="With --repository volume: the claim's name.")
    # the Deployment leaves the count to the autoscaler
    replicas: int = Field(2, ge=1, description="The autoscaler's minimum replicas.")
    max_replicas: int = Field(8, ge=1, description="The autoscaler's maximum replicas.")
    scale_on: Literal["queue_time", "cpu"] = Field(
        "queue_time",
        description="queue_time (each pod's mean queue time a request, as Triton's chart does, through "
        "prometheus-adapter: its rule is in monitoring/) or cpu (CPU utilisation, no adapter).",
    )
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
    latency_quantiles: str = Field(
        "",
        description="Latency quantiles Triton's metrics keep (quantile:error pairs, e.g. 0.5:0.05,0.99:0.001): "
        "the p50 and p99 panels and the p99 alert. Off by default: Triton 2.51's summaries stall every instance "
        "of a model for milliseconds each 500 requests under load; the mean latency alert needs none.",
    )
    # its password in the Secret store_secret (key "password"; with sentinel also "operator")
    store: Literal["statefulset", "sentinel", "external"] = Field(
        "statefulset",
        description="For a repository with a session layout: statefulset (a Valkey StatefulSet with persistence, "
        "written beside the replicas), sentinel (the same replicated, with three Sentinels that fail it over) "
        "or external (the store the repository's record names). Its password is the Secret "
        "RECSERVE_K8S_STORE_SECRET.",
    )
    store_replicas: int = Field(3, ge=2)  # with store sentinel: the Valkey pods, one primary and its replicas
    store_secret: str = Field("recserve-store", pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    # a supported, patched Valkey; pin it by digest for production (image@sha256:..., docs/security.md)
    store_image: str = "valkey/valkey:9.1.4"
    store_storage: str = "10Gi"  # the StatefulSet's volume: the append-only file
    store_memory: str = "2Gi"

    def check(self) -> None:
        if self.repository == "volume" and not self.repository_claim:
            raise ServingError(
                "repository volume: set repository_claim (RECSERVE_K8S_REPOSITORY_CLAIM), the "
                "PersistentVolumeClaim that holds the model repository"
            )
        if self.latency_quantiles:
            check_latency_quantiles(self.latency_quantiles)
        if self.max_replicas < self.replicas:
            raise ServingError(f"max_replicas {self.max_replicas} is below replicas {self.replicas}")


K8S_OPTIONS = (
    "image",
    "name",
    "namespace",
    "replicas",
    "max_replicas",
    "scale_on",
    "repository",
    "repository_claim",
    "store",
    "latency_quantiles",
)


def labels(s: K8sSettings) -> dict[str, str]:
    return {"app": s.name, "app.kubernetes.io/name": s.name, "app.kubernetes.io/component": "triton"}
