"""``recserve sagemaker deploy``: a package deployed to a SageMaker endpoint."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from recserve.cli.console import console, handle_errors
from recserve.cli.options import Settings, takes
from recserve.deploy.sagemaker.cloud import DEPLOY_OPTIONS, DeploySettings


@handle_errors
@takes(Settings("given", (DeploySettings,), build=False, unset=True, names=DEPLOY_OPTIONS))
def deploy(
    package_file: Annotated[
        Path | None, typer.Option("--package", help="Upload this model.tar.gz to model_data first.")
    ] = None,
    env_file: Annotated[Path | None, typer.Option(help="Settings file (default .env.inference).")] = None,
    given: dict[str, Any] | None = None,
) -> None:
    """Create the SageMaker model, endpoint configuration and endpoint.

    Settings: RECSERVE_SAGEMAKER_* environment variables or .env.inference.
    """
    from recserve.deploy.sagemaker.cloud import deploy as run_deploy
    from recserve.deploy.sagemaker.cloud import load_settings, upload

    settings = load_settings(env_file, **(given or {}))
    if package_file is not None and settings.runtime == "triton":  # the model the package holds, not a guess
        from recserve.deploy.sagemaker.cloud import instance_mismatch
        from recserve.errors import ServingError
        from recserve.serving.sagemaker.package import inspect_package

        info = inspect_package(package_file)  # one read of the archive
        model = info.triton_model(package_file)
        mismatch = instance_mismatch(info.on_gpus, settings.instance_type)
        if mismatch and mismatch[0] == "error":
            raise ServingError(f"{package_file}: {mismatch[1]}")
        if mismatch:
            console.print(f"[yellow]warning: {mismatch[1]}[/]")
        settings = settings.model_copy(update={"triton_model": model})
    if package_file is not None:
        with console.status(f"uploading {package_file} to {settings.model_data}"):
            upload(package_file, settings)
    with console.status(f"deploying endpoint {settings.endpoint_name}"):
        result = run_deploy(settings)
    console.print_json(json.dumps(result))
