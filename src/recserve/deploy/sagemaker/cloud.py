"""Deployment to a SageMaker endpoint with boto3: model, endpoint configuration, endpoint, then invocation.

Settings come from ``RECSERVE_SAGEMAKER_*`` environment variables and an ``.env.inference`` file
(environment wins), through pydantic-settings. ``endpoint_url`` points the SageMaker and S3 clients at
another API endpoint (a private one, or a local moto server for tests).
"""

from __future__ import annotations

import logging
import time
import uuid
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from recserve.constants import NATIVE_MODEL
from recserve.deploy.sagemaker.images import image_uri
from recserve.env_settings import read_settings
from recserve.errors import ServingError
from recserve.serving.sagemaker.package import TRITON_MODEL_ENV, pytorch_environment

log = logging.getLogger(__name__)

ENV_FILE = ".env.inference"


def environment(settings: DeploySettings) -> dict[str, str]:
    """The container's environment: the model to serve (triton), or the entry point and TorchServe's batching,
    workers and threads (pytorch)."""
    if settings.runtime == "triton":
        return {TRITON_MODEL_ENV: settings.triton_model}
    return pytorch_environment(settings.workers)


class DeploySettings(BaseSettings):
    """Where and how to deploy; every field can be set as ``RECSERVE_SAGEMAKER_<FIELD>``."""

    model_config = SettingsConfigDict(env_prefix="RECSERVE_SAGEMAKER_", env_file=ENV_FILE, extra="ignore")

    region: str = "us-east-1"
    role_arn: str | None = Field(None, description="IAM role SageMaker assumes to pull the image and model data")
    image_uri: str | None = Field(
        None,
        description="inference container image; default: the runtime's for the region and instance type "
        "(deploy.sagemaker.images, from the SageMaker SDK's table)",
    )
    model_data: str | None = Field(None, description="S3 URI of model.tar.gz")
    runtime: Literal["pytorch", "triton"] = "pytorch"
    triton_model: str = Field(
        NATIVE_MODEL,
        description="triton runtime: the package's one model folder (deploy --package reads it from there)",
        pattern=r"^[A-Za-z0-9_.-]+$",
    )
    instance_type: str = "ml.g5.xlarge"  # one A10G, the PoC's GPU
    instance_count: int = Field(1, ge=1)
    workers: int = Field(
        1, ge=1, description="pytorch runtime: TorchServe workers (model processes) per instance, one thread each"
    )
    endpoint_name: str = Field("recserve", description="The endpoint to create or update.")
    wait: bool = Field(True, description="Wait until the endpoint is InService.")
    wait_timeout_s: int = Field(1800, ge=1)
    replace_failed: bool = Field(
        False, description="Delete an endpoint in Failed (it cannot be updated) and create it anew."
    )
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


DEPLOY_OPTIONS = ("endpoint_name", "wait", "replace_failed")  # the fields `recserve sagemaker deploy` takes as options


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


NAME_LIMIT = 63  # SageMaker's limit for model, endpoint configuration and endpoint names
BUSY = ("Creating", "Updating", "SystemUpdating", "RollingBack", "Deleting")


def resource_name(endpoint_name: str) -> str:
    """``<endpoint>-<UTC stamp>-<8 hex>``, cut to fit 63 characters: unique within a second too (4 hex collided
    once in 50 names a second about 2% of the time)."""
    suffix = f"-{time.strftime('%Y%m%d%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:8]}"
    return endpoint_name[: NAME_LIMIT - len(suffix)].rstrip("-") + suffix


def deploy(settings: DeploySettings, sm=None, name: str | None = None) -> dict:
    """Creates the model and endpoint configuration, then creates (or updates) the endpoint.

    An endpoint that is Creating or Updating is waited for first (with ``wait``; without, refused with what to
    do); a Failed one cannot be updated and is refused with its FailureReason unless ``replace_failed``, which
    deletes it and creates it anew. After the wait the endpoint must be InService on the configuration just
    made, else the error gives its status and FailureReason. What this call created is deleted again when it
    fails (a new endpoint too; an existing endpoint is left on its old configuration).

    Args:
        sm: a boto3 SageMaker client (default: one for the settings' region and endpoint URL).
        name: the new model's and endpoint configuration's name (default: ``resource_name``).

    Returns:
        The endpoint's name, ARN and status (``InService`` once waited for).
    """
    from botocore.exceptions import BotoCoreError, ClientError

    settings.require("role_arn", "model_data")
    image = settings.image_uri or image_uri(settings.runtime, settings.region, settings.instance_type)
    sm = sm or _client("sagemaker", settings)
    name, endpoint = name or resource_name(settings.endpoint_name), settings.endpoint_name
    created: list[tuple[str, str]] = []  # (kind, name) to delete if the deploy fails
    try:
        existing = _ready_for_update(sm, settings)
        sm.create_model(
            ModelName=name,
            ExecutionRoleArn=settings.role_arn,
            PrimaryContainer={
                "Image": image,
                "ModelDataUrl": settings.model_data,
                "Environment": environment(settings),
            },
        )
        created.append(("model", name))
        sm.create_endpoint_config(
            EndpointConfigName=name,
            ProductionVariants=[
                {
                    "VariantName": "AllTraffic",
                    "ModelName": name,
                    "InstanceType": settings.instance_type,
                    "InitialInstanceCount": settings.instance_count,
                }
            ],
        )
        created.append(("endpoint_config", name))
        if existing:
            sm.update_endpoint(EndpointName=endpoint, EndpointConfigName=name)
        else:
            sm.create_endpoint(EndpointName=endpoint, EndpointConfigName=name)
            created.append(("endpoint", endpoint))
        if settings.wait:
            _wait_in_service(sm, settings)
        described = sm.describe_endpoint(EndpointName=endpoint)
        if settings.wait and (described["EndpointStatus"] != "InService" or described["EndpointConfigName"] != name):
            raise ServingError(
                f"endpoint {endpoint!r} is {described['EndpointStatus']} on configuration "
                f"{described.get('EndpointConfigName')!r}, not InService on {name!r}: "
                f"{described.get('FailureReason') or 'no FailureReason given'}"
            )
    except (BotoCoreError, ClientError, ServingError) as err:
        _delete(sm, created)
        if isinstance(err, ServingError):
            raise
        reason = _failure_reason(sm, endpoint)
        raise ServingError(f"deploying endpoint {endpoint!r} failed: {err}{reason}") from err
    return {
        "endpoint_name": described["EndpointName"],
        "endpoint_arn": described["EndpointArn"],
        "status": described["EndpointStatus"],
        "model_name": name,
        "endpoint_config_name": name,
    }


def _ready_for_update(sm, settings: DeploySettings) -> bool:
    """Whether the endpoint exists (and can take an update now); waits for a busy one, replaces a Failed
    one when asked, refuses otherwise."""
    status, reason = _status(sm, settings.endpoint_name)
    if status is None:
        return False
    if status in BUSY:
        if not settings.wait:
            raise ServingError(
                f"endpoint {settings.endpoint_name!r} is {status}: it cannot be updated until that ends; "
                "deploy again with --wait (it waits first), or later"
            )
        if status == "Deleting":
            sm.get_waiter("endpoint_deleted").wait(EndpointName=settings.endpoint_name, WaiterConfig=_waits(settings))
            return False
        _wait_in_service(sm, settings)
        status, reason = _status(sm, settings.endpoint_name)
    if status == "Failed":
        if not settings.replace_failed:
            raise ServingError(
                f"endpoint {settings.endpoint_name!r} is Failed ({reason or 'no FailureReason given'}) and cannot "
                "be updated: deploy with --replace-failed to delete and create it anew"
            )
        sm.delete_endpoint(EndpointName=settings.endpoint_name)
        sm.get_waiter("endpoint_deleted").wait(EndpointName=settings.endpoint_name, WaiterConfig=_waits(settings))
        return False
    return True


def _status(sm, name: str) -> tuple[str | None, str]:
    from botocore.exceptions import ClientError

    try:
        described = sm.describe_endpoint(EndpointName=name)
    except ClientError as err:
        if err.response.get("Error", {}).get("Code") in ("ValidationException", "ResourceNotFound"):
            return None, ""
        raise
    return described["EndpointStatus"], described.get("FailureReason", "")


def _waits(settings: DeploySettings) -> dict:
    delay_s = 15 if settings.endpoint_url is None else 1
    return {"Delay": delay_s, "MaxAttempts": max(1, settings.wait_timeout_s // delay_s)}


def _wait_in_service(sm, settings: DeploySettings) -> None:
    from botocore.exceptions import WaiterError

    try:
        sm.get_waiter("endpoint_in_service").wait(EndpointName=settings.endpoint_name, WaiterConfig=_waits(settings))
    except WaiterError as err:
        status, reason = _status(sm, settings.endpoint_name)
        raise ServingError(
            f"endpoint {settings.endpoint_name!r} did not become InService: {status or 'gone'}"
            f"{f' ({reason})' if reason else ''}"
        ) from err


def _failure_reason(sm, name: str) -> str:
    try:
        _, reason = _status(sm, name)
    except Exception:  # the reason is a courtesy: the error itself is what is reported
        return ""
    return f" (FailureReason: {reason})" if reason else ""


NAME_KEYS = {"model": "ModelName", "endpoint_config": "EndpointConfigName", "endpoint": "EndpointName"}


def _delete(sm, created: list[tuple[str, str]]) -> None:
    """Deletes what a failed deploy created, newest first; a deletion that fails is logged, not raised."""
    for kind, name in reversed(created):
        try:
            getattr(sm, f"delete_{kind}")(**{NAME_KEYS[kind]: name})
        except Exception as err:  # cleanup must not hide the deploy's own error
            log.warning("could not delete the %s %s left by the failed deploy: %s", kind, name, err)


def invoke_endpoint(settings: DeploySettings, body: bytes, content_type: str = "application/json") -> tuple[str, bytes]:
    """Invokes the deployed endpoint (the body in its runtime's protocol, ``serving.sagemaker.protocol``);
    returns the content type and the raw answer."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        response = _client("sagemaker-runtime", settings).invoke_endpoint(
            EndpointName=settings.endpoint_name,
            ContentType=content_type,
            Accept="application/json",
            Body=body,
        )
    except (BotoCoreError, ClientError) as err:
        raise ServingError(f"invoking endpoint {settings.endpoint_name!r} failed: {err}") from err
    return response.get("ContentType", ""), response["Body"].read()


GPU_FAMILIES = ("ml.g", "ml.p")  # SageMaker's instance families with NVIDIA GPUs (g4dn, g5, g6, p3, p4d, p5, ...)


def instance_mismatch(on_gpus: bool, instance_type: str) -> tuple[str, str] | None:
    """("error" or "warning", why) where a triton package and the endpoint's instance type disagree: GPU
    instances cannot load on a machine without a GPU; CPU instances on a GPU machine leave the GPU idle."""
    gpu_machine = instance_type.startswith(GPU_FAMILIES)
    if on_gpus and not gpu_machine:
        return "error", (
            f"the package's model runs on GPUs, and {instance_type} has none: deploy on a GPU instance type "
            "(e.g. ml.g5.xlarge) or package with --device cpu"
        )
    if not on_gpus and gpu_machine:
        return "warning", (
            f"the package's model runs on CPUs, so the GPU of {instance_type} would sit idle: package with "
            "--device gpu on a GPU host, or deploy on a CPU instance type (e.g. ml.c5.xlarge)"
        )
    return None
