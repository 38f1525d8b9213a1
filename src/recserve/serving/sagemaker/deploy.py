"""Deployment to a SageMaker endpoint with boto3: model, endpoint configuration, endpoint, then invocation.

Settings come from ``RECSERVE_SAGEMAKER_*`` environment variables and an ``.env.inference`` file
(environment wins), through pydantic-settings. ``endpoint_url`` points the SageMaker and S3 clients at
another API endpoint (a private one, or a local moto server for tests).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from recserve.constants import FUSED_MODEL, NATIVE_MODEL
from recserve.errors import ServingError
from recserve.serving.sagemaker.package import ENVIRONMENT, TRITON_MODEL_ENV
from recserve.settings import read_settings

log = logging.getLogger(__name__)

ENV_FILE = ".env.inference"


def environment(settings: DeploySettings) -> dict[str, str]:
    """The container's environment: the entry point (pytorch) or the model to serve (triton)."""
    if settings.runtime == "triton":
        return {TRITON_MODEL_ENV: settings.triton_model}
    return dict(ENVIRONMENT[settings.runtime])


class DeploySettings(BaseSettings):
    """Where and how to deploy; every field can be set as ``RECSERVE_SAGEMAKER_<FIELD>``."""

    model_config = SettingsConfigDict(env_prefix="RECSERVE_SAGEMAKER_", env_file=ENV_FILE, extra="ignore")

    region: str = "us-east-1"
    role_arn: str | None = Field(None, description="IAM role SageMaker assumes to pull the image and model data")
    image_uri: str | None = Field(None, description="inference container image (PyTorch or Triton, as the runtime)")
    model_data: str | None = Field(None, description="S3 URI of model.tar.gz")
    runtime: Literal["pytorch", "triton"] = "pytorch"
    triton_model: str = Field(
        NATIVE_MODEL,
        description="triton runtime: the package's model (recserve sagemaker package prints it): "
        "recommender_native for the native layout, recommender for the fused one (string IDs)",
        pattern=f"^({NATIVE_MODEL}|{FUSED_MODEL})$",
    )
    instance_type: str = "ml.g5.xlarge"  # one A10G, the PoC's GPU
    instance_count: int = Field(1, ge=1)
    endpoint_name: str = "recserve"
    wait: bool = True
    wait_timeout_s: int = Field(1800, ge=1)
    endpoint_url: str | None = None

    @field_validator("model_data")
    @classmethod
    def _s3_uri(cls, value: str | None) -> str | None:
        if value is not None and (not value.startswith("s3://") or len(value.removeprefix("s3://").split("/", 1)) != 2):
            raise ValueError(f"{value!r}: expected s3://bucket/key/model.tar.gz")
        return value

    @field_validator("role_arn")
    @classmethod
    def _arn(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("arn:"):
            raise ValueError(f"{value!r}: expected an IAM role ARN (arn:aws:iam::<account>:role/<name>)")
        return value

    def require(self, *names: str) -> None:
        missing = [n for n in names if getattr(self, n) is None]
        if missing:
            env = ", ".join(f"RECSERVE_SAGEMAKER_{n.upper()}" for n in missing)
            raise ServingError(
                f"missing deployment settings: {', '.join(missing)}; set {env} or put them in {ENV_FILE}"
            )


def load_settings(env_file: Path | None = None, **overrides) -> DeploySettings:
    """Reads the settings, reporting every missing or bad one in a single error."""
    return read_settings(DeploySettings, env_file or ENV_FILE, **overrides)


def _client(service: str, settings: DeploySettings):
    import boto3

    return boto3.client(service, region_name=settings.region, endpoint_url=settings.endpoint_url)


def upload(package_path: Path, settings: DeploySettings) -> str:
    """Uploads a local model.tar.gz to ``settings.model_data``."""
    settings.require("model_data")
    model_data = str(settings.model_data)
    bucket, key = model_data.removeprefix("s3://").split("/", 1)
    _client("s3", settings).upload_file(str(package_path), bucket, key)
    return model_data


def deploy(settings: DeploySettings) -> dict:
    """Creates the model and endpoint configuration, then creates (or updates) the endpoint.

    Returns:
        The endpoint's name, ARN and status (``InService`` once waited for).
    """
    from botocore.exceptions import BotoCoreError, ClientError

    settings.require("role_arn", "image_uri", "model_data")
    sm = _client("sagemaker", settings)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    model_name = f"{settings.endpoint_name}-{stamp}"
    try:
        sm.create_model(
            ModelName=model_name,
            ExecutionRoleArn=settings.role_arn,
            PrimaryContainer={
                "Image": settings.image_uri,
                "ModelDataUrl": settings.model_data,
                "Environment": environment(settings),
            },
        )
        sm.create_endpoint_config(
            EndpointConfigName=model_name,
            ProductionVariants=[
                {
                    "VariantName": "AllTraffic",
                    "ModelName": model_name,
                    "InstanceType": settings.instance_type,
                    "InitialInstanceCount": settings.instance_count,
                }
            ],
        )
        if _endpoint_exists(sm, settings.endpoint_name):
            sm.update_endpoint(EndpointName=settings.endpoint_name, EndpointConfigName=model_name)
        else:
            sm.create_endpoint(EndpointName=settings.endpoint_name, EndpointConfigName=model_name)
        if settings.wait:
            delay_s = 15 if settings.endpoint_url is None else 1
            sm.get_waiter("endpoint_in_service").wait(
                EndpointName=settings.endpoint_name,
                WaiterConfig={"Delay": delay_s, "MaxAttempts": max(1, settings.wait_timeout_s // delay_s)},
            )
        described = sm.describe_endpoint(EndpointName=settings.endpoint_name)
    except (BotoCoreError, ClientError) as err:
        raise ServingError(f"deploying endpoint {settings.endpoint_name!r} failed: {err}") from err
    return {
        "endpoint_name": described["EndpointName"],
        "endpoint_arn": described["EndpointArn"],
        "status": described["EndpointStatus"],
        "model_name": model_name,
        "endpoint_config_name": model_name,
    }


def _endpoint_exists(sm, name: str) -> bool:
    from botocore.exceptions import ClientError

    try:
        sm.describe_endpoint(EndpointName=name)
        return True
    except ClientError as err:
        if err.response.get("Error", {}).get("Code") in ("ValidationException", "ResourceNotFound"):
            return False
        raise


def invoke_endpoint(settings: DeploySettings, body: dict) -> tuple[str, bytes]:
    """Invokes the deployed endpoint with a JSON body; returns the content type and the raw answer."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        response = _client("sagemaker-runtime", settings).invoke_endpoint(
            EndpointName=settings.endpoint_name,
            ContentType="application/json",
            Accept="application/json",
            Body=json.dumps(body),
        )
    except (BotoCoreError, ClientError) as err:
        raise ServingError(f"invoking endpoint {settings.endpoint_name!r} failed: {err}") from err
    return response.get("ContentType", ""), response["Body"].read()
