"""``recserve deploy k8s``'s folder: a kustomize layout (``base/`` plus ``overlays/cpu`` and ``overlays/gpu``), the
same overlays rendered (``rendered/cpu.yaml``, ``rendered/gpu.yaml``: what ``kubectl kustomize`` gives, for
clusters without it), a KServe ``InferenceService`` alternative (``kserve/``), the monitoring files
(``monitoring/``: Prometheus scrape config, alerting rules, Grafana dashboard, and the prometheus-adapter rule
that gives the autoscaler each pod's queue time) and a README."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from recserve.artifacts.repository_record import has_record, read_repository_info, store_of
from recserve.deploy.k8s.k8s_settings import K8sSettings
from recserve.deploy.k8s.kserve_objects import inference_service, serving_runtime
from recserve.deploy.k8s.sentinel_objects import OPERATOR_KEY, store_objects
from recserve.deploy.k8s.store_objects import (
    MAXMEMORY_SHARE,
    SECRET_KEY,
    WRITER_LABEL,
    check_store_record,
)
from recserve.deploy.k8s.triton_objects import (
    adapter_rules,
    autoscaler,
    deployment,
    disruption_budget,
    gpu_patch,
    pods_dns,
    pods_service,
    render_overlay,
    service,
)
from recserve.deploy.monitoring import alert_rules, grafana_dashboard, scrape_config
from recserve.errors import ServingError
from recserve.serving.triton_server.bundle import model_backends


def write_manifests(repo: Path, out: Path, s: K8sSettings) -> list[Path]:
    """Writes every manifest under ``out``; returns the files written. ``repo`` is checked to be a
    recserve repository (its record names the layouts the image must hold)."""

    s.check()
    if not has_record(repo):
        raise ServingError(f"{repo}: not a recserve model repository; write one with `recserve repo`")
    info = read_repository_info(repo)
    _check_image_backends(Path(repo))
    store = store_of(info)
    if store is not None:
        check_store_record(s, store)
    base = ["deployment.yaml", "service.yaml", "pods.yaml", "hpa.yaml", "pdb.yaml"]
    store_files: dict[str, Any] = {}
    if store is not None and s.store != "external":
        store_files = {f"base/{name}": obj for name, obj in store_objects(s, store).items()}
        base += list(store_objects(s, store))
    files: dict[str, Any] = {
        "base/deployment.yaml": deployment(s, store),
        "base/service.yaml": service(s),
        "base/pods.yaml": pods_service(s),
        "base/hpa.yaml": autoscaler(s),
        "base/pdb.yaml": disruption_budget(s),
        **store_files,
        "base/kustomization.yaml": _kustomization(base),
        "overlays/cpu/kustomization.yaml": _kustomization(["../../base"]),
        "overlays/gpu/kustomization.yaml": _kustomization(["../../base"]) | {"patches": [{"path": "gpu.yaml"}]},
        "overlays/gpu/gpu.yaml": gpu_patch(s),
        "kserve/inferenceservice.yaml": inference_service(s, gpu=serves_on_gpus(info)),
        "kserve/servingruntime.yaml": serving_runtime(s),
        "monitoring/prometheus.yml": scrape_config(pods_dns=pods_dns(s)),
        "monitoring/prometheus-adapter.yaml": adapter_rules(s),
        "monitoring/alerts.yml": alert_rules(quantiles=bool(s.latency_quantiles)),
    }
    written = []
    for relative, content in files.items():
        written.append(_write(Path(out) / relative, yaml.safe_dump(content, sort_keys=False)))
    for overlay in ("cpu", "gpu"):
        text = yaml.safe_dump_all(render_overlay(s, overlay, store), sort_keys=False)
        written.append(_write(Path(out) / "rendered" / f"{overlay}.yaml", text))
    written.append(
        _write(
            Path(out) / "monitoring" / "grafana-dashboard.json",
            json.dumps(grafana_dashboard(quantiles=bool(s.latency_quantiles)), indent=2),
        )
    )
    written.append(_write(Path(out) / "README.md", _readme(s, info, store)))
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


def _readme(s: K8sSettings, info: dict, store: dict | None) -> str:
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
    if store is not None:
        where = (
            f"the StatefulSet {s.name}-store (base/store.yaml: Valkey, the append-only file fsynced at every write on "
            f"a {s.store_storage} volume, its ACL built from the Secret at start: the password's SHA-256 only)"
            if s.store != "external"
            else f"the store at {store['url']} (its ACL user {store['username']}, keys {store['prefix']}* only)"
        )
        lines += [
            "",
            "## The session store",
            "",
            f"The session layout keeps each session's items in {where}. Its password is the Secret",
            f"`{s.store_secret}` (key `{SECRET_KEY}`), which no file here holds; create it before applying:",
            "",
            "```bash",
            f"kubectl create secret generic {s.store_secret} -n {s.namespace} --from-file={SECRET_KEY}=PASSWORD_FILE",
            "```",
            "",
            f"The Triton pods read it at {store['password_file']}; docs/sessions.md.",
        ]
        if s.store == "sentinel":
            lines += [
                "",
                f"With failover: {s.store_replicas} Valkey pods (the first starts as the primary) and three Sentinels",
                "(base/store-sentinel.yaml) that promote a replica when the primary fails; the Triton pods find the",
                "primary through them, and an append is acknowledged once a replica holds it too. The Secret also",
                f"needs the key `{OPERATOR_KEY}` (the password the nodes replicate and the Sentinels work with):",
                "",
                "```bash",
                f"kubectl create secret generic {s.store_secret} -n {s.namespace} \\",
                f"  --from-file={SECRET_KEY}=PASSWORD_FILE --from-file={OPERATOR_KEY}=OPERATOR_PASSWORD_FILE",
                "```",
            ]
        if s.store != "external":
            lines += [
                "",
                "base/store-networkpolicy.yaml admits to the store only the Triton pods and pods labelled",
                f'`{WRITER_LABEL}: "true"` (your event writers); the store evicts the least recently used sessions',
                f"past {int(MAXMEMORY_SHARE * 100)}% of its {s.store_memory} instead of being killed; its pod runs as",
                "the restricted Pod Security Standard asks. Traffic to it is not encrypted (docs/security.md says why",
                "and what to do where that matters).",
            ]
            if "@sha256:" not in s.store_image:
                lines += [
                    "",
                    f"**Pin the store's image by digest before production**: `{s.store_image}` is a tag, which can",
                    "move. `docker buildx imagetools inspect IMAGE` prints its digest; set",
                    "RECSERVE_K8S_STORE_IMAGE=IMAGE@sha256:DIGEST and write the manifests again.",
                ]
    return "\n".join(lines) + "\n"
