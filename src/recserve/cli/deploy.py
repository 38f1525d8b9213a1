"""``recserve deploy``: Kubernetes manifests and monitoring for a model repository."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from recserve.cli.console import console, err_console, handle_errors

app = typer.Typer(
    help="Deployment: Kubernetes manifests (kustomize overlays, KServe) and Prometheus/Grafana files.",
    no_args_is_help=True,
)


@app.command()
@handle_errors
def k8s(
    repo: Annotated[
        Path,
        typer.Option(
            "--repo", help="Model repository written by `recserve repo` (baked into the serving image, or on a volume)."
        ),
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder for the manifests.")] = Path("k8s"),
    image: Annotated[str | None, typer.Option(help="Serving image (deploy/docker/Dockerfile.serve).")] = None,
    name: Annotated[str | None, typer.Option(help="Name of the Deployment, Service and the rest.")] = None,
    namespace: Annotated[str | None, typer.Option(help="Kubernetes namespace.")] = None,
    replicas: Annotated[int | None, typer.Option(help="The autoscaler's minimum replicas (default: 2).")] = None,
    max_replicas: Annotated[int | None, typer.Option(help="The autoscaler's maximum (default: 8).")] = None,
    scale_on: Annotated[
        str | None,
        typer.Option(
            help="queue_time (each pod's mean queue time a request, through prometheus-adapter: its rule is in "
            "monitoring/) or cpu (CPU utilisation, no adapter) (default: queue_time)."
        ),
    ] = None,
    repository: Annotated[
        str | None, typer.Option(help="image (baked in) or volume (a PersistentVolumeClaim).")
    ] = None,
    repository_claim: Annotated[str | None, typer.Option(help="With --repository volume: the claim's name.")] = None,
    store: Annotated[
        str | None,
        typer.Option(
            help="For a repository with the session layout: statefulset (a Valkey StatefulSet with persistence, "
            "written beside the replicas), sentinel (the same replicated, with three Sentinels that fail it over) "
            "or external (the store the repository's record names) (default: statefulset). "
            "Its password is the Secret RECSERVE_K8S_STORE_SECRET (default: recserve-store)."
        ),
    ] = None,
    env_file: Annotated[Path, typer.Option(help="Settings file (RECSERVE_K8S_<NAME>=value lines).")] = Path(".env.k8s"),
) -> None:
    """Write Deployment, Service, HorizontalPodAutoscaler, PodDisruptionBudget (kustomize base with cpu and
    gpu overlays, and rendered), a KServe InferenceService and ServingRuntime, and Prometheus, prometheus-adapter
    and Grafana files; for the session layout, its store (a StatefulSet, or an existing one's Secret). Settings
    not given here come from RECSERVE_K8S_* variables or --env-file, then the defaults."""
    from recserve.deploy.k8s.k8s_settings import K8sSettings
    from recserve.deploy.k8s.manifest_files import write_manifests
    from recserve.env_settings import read_settings

    given: dict[str, Any] = dict(
        image=image,
        name=name,
        namespace=namespace,
        replicas=replicas,
        max_replicas=max_replicas,
        scale_on=scale_on,
        repository=repository,
        repository_claim=repository_claim,
        store=store,
    )
    settings = read_settings(K8sSettings, env_file, **given)
    files = write_manifests(repo, out, settings)
    console.print(f"{len(files)} files in {out}: kubectl apply -k {out}/overlays/gpu (or overlays/cpu)")
    if any(path.name.startswith("store") for path in files) and "@sha256:" not in settings.store_image:
        err_console.print(
            f"[yellow]warning:[/] the store's image {settings.store_image} is a tag, which can move: pin it by digest "
            "(RECSERVE_K8S_STORE_IMAGE=IMAGE@sha256:DIGEST) before production; the README written says how"
        )
