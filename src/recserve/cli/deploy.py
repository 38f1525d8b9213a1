"""``recserve deploy``: Kubernetes manifests and monitoring for a model repository."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from recserve.cli.console import console, err_console, handle_errors
from recserve.cli.options import Settings, takes
from recserve.deploy.k8s.k8s_settings import K8S_OPTIONS, K8sSettings

app = typer.Typer(
    help="Deployment: Kubernetes manifests (kustomize overlays, KServe) and Prometheus/Grafana files.",
    no_args_is_help=True,
)


@app.command()
@handle_errors
@takes(Settings("given", (K8sSettings,), build=False, unset=True, names=K8S_OPTIONS))
def k8s(
    repo: Annotated[
        Path,
        typer.Option(
            "--repo", help="Model repository written by `recserve repo` (baked into the serving image, or on a volume)."
        ),
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder for the manifests.")] = Path("k8s"),
    env_file: Annotated[Path, typer.Option(help="Settings file (RECSERVE_K8S_<NAME>=value lines).")] = Path(".env.k8s"),
    given: dict[str, Any] | None = None,
) -> None:
    """Write Deployment, Service, HorizontalPodAutoscaler, PodDisruptionBudget (kustomize base with cpu and
    gpu overlays, and rendered), a KServe InferenceService and ServingRuntime, and Prometheus, prometheus-adapter
    and Grafana files; for the session layout, its store (a StatefulSet, or an existing one's Secret). Settings
    not given here come from RECSERVE_K8S_* variables or --env-file, then the defaults (every field of
    deploy.k8s.k8s_settings.K8sSettings: resources, GPUs, the exit timeout, the store's image and size)."""
    from recserve.deploy.k8s.manifest_files import write_manifests
    from recserve.env_settings import read_settings

    settings = read_settings(K8sSettings, env_file, **(given or {}))
    files = write_manifests(repo, out, settings)
    console.print(f"{len(files)} files in {out}: kubectl apply -k {out}/overlays/gpu (or overlays/cpu)")
    if any(path.name.startswith("store") for path in files) and "@sha256:" not in settings.store_image:
        err_console.print(
            f"[yellow]warning:[/] the store's image {settings.store_image} is a tag, which can move: pin it by digest "
            "(RECSERVE_K8S_STORE_IMAGE=IMAGE@sha256:DIGEST) before production; the README written says how"
        )
