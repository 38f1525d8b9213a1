"""``recserve sagemaker``: package a run for SageMaker, serve it locally, deploy it and invoke it."""

from __future__ import annotations

import typer

from recserve.cli.sagemaker_deploy import deploy
from recserve.cli.sagemaker_invoke import invoke
from recserve.cli.sagemaker_package import package
from recserve.cli.sagemaker_serve import serve

app = typer.Typer(
    help="SageMaker: model.tar.gz, a local endpoint (/ping, /invocations), deployment, invocation.",
    no_args_is_help=True,
)
for command in (package, serve, deploy, invoke):
    app.command()(command)
