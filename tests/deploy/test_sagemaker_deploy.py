"""Deploy's edge cases against SageMaker's API as botocore describes it (its Stubber: each call checked and
answered in order): endpoints that are busy, Failed, or fail after the update; names; what a failed deploy
leaves behind (nothing)."""

from __future__ import annotations

import boto3
import pytest
from botocore.stub import Stubber

from recserve.deploy.sagemaker.cloud import NAME_LIMIT, DeploySettings, deploy, environment, resource_name
from recserve.errors import ServingError

NAME = "recs-20261201-abcd"
ARN = "arn:aws:sagemaker:us-east-1:123456789012:endpoint/recs"


def _settings(**overrides) -> DeploySettings:
    values = dict(
        role_arn="arn:aws:iam::123456789012:role/recserve",
        image_uri="763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-inference:2.5-gpu-py311",
        model_data="s3://models/recserve/model.tar.gz",
        endpoint_name="recs",
        endpoint_url="http://127.0.0.1:9",  # never reached: the stubber answers; a 1 s waiter delay
        wait_timeout_s=3,
    )
    return DeploySettings(_env_file=None, **(values | overrides))


@pytest.fixture
def sm(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    client = boto3.client("sagemaker", region_name="us-east-1")
    with Stubber(client) as stubber:
        yield client, stubber
        stubber.assert_no_pending_responses()


def _endpoint(status: str, config: str = NAME, reason: str | None = None) -> dict:
    described = {
        "EndpointName": "recs",
        "EndpointArn": ARN,
        "EndpointConfigName": config,
        "EndpointStatus": status,
        "CreationTime": "2026-12-01T00:00:00Z",
        "LastModifiedTime": "2026-12-01T00:00:00Z",
    }
    return described | ({"FailureReason": reason} if reason else {})


def _describe(stubber, status: str | None, **kwargs) -> None:
    if status is None:
        stubber.add_client_error("describe_endpoint", "ValidationException", "Could not find endpoint")
    else:
        stubber.add_response("describe_endpoint", _endpoint(status, **kwargs), {"EndpointName": "recs"})


def _creates(stubber, endpoint: str) -> None:
    stubber.add_response("create_model", {"ModelArn": f"{ARN}-model"})
    stubber.add_response("create_endpoint_config", {"EndpointConfigArn": f"{ARN}-config"})
    stubber.add_response(f"{endpoint}_endpoint", {"EndpointArn": ARN})


# the PyTorch container's settings deploy gives the model (docs/sagemaker.md, "Throughput"), workers aside
PYTORCH_ENVIRONMENT = {
    "SAGEMAKER_PROGRAM": "inference.py",
    "SAGEMAKER_TS_BATCH_SIZE": "16",
    "SAGEMAKER_TS_MAX_BATCH_DELAY": "1",
    "OMP_NUM_THREADS": "1",
}


def test_the_pytorch_container_gets_batching_one_thread_and_the_workers_asked_for():
    four = environment(_settings(workers=4))
    assert four == PYTORCH_ENVIRONMENT | {"SAGEMAKER_TS_MIN_WORKERS": "4", "SAGEMAKER_TS_MAX_WORKERS": "4"}
    assert environment(_settings(runtime="triton")) == {"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "recommender_native"}
    with pytest.raises(ValueError, match="workers"):
        _settings(workers=0)


def test_names_fit_sagemakers_limit_and_never_repeat():
    long = "a" * 70
    names = {resource_name(long) for _ in range(1000)}
    assert len(names) == 1000 and all(len(n) <= NAME_LIMIT for n in names)
    assert resource_name("recs").startswith("recs-") and len(resource_name("recs")) == len("recs") + 24


def test_an_updating_endpoint_is_waited_for_then_updated(sm):
    client, stubber = sm
    _describe(stubber, "Updating")  # the endpoint is busy: wait first
    _describe(stubber, "InService", config="old")  # the waiter's poll
    _describe(stubber, "InService", config="old")
    _creates(stubber, "update")
    _describe(stubber, "InService")  # the waiter, after the update
    _describe(stubber, "InService")
    assert deploy(_settings(), client, NAME)["status"] == "InService"


def test_a_busy_endpoint_without_wait_is_refused_before_anything_is_created(sm):
    client, stubber = sm
    _describe(stubber, "Creating")
    with pytest.raises(
        ServingError, match="is Creating: it cannot be updated until that ends; deploy again with --wait"
    ):
        deploy(_settings(wait=False), client, NAME)


def test_a_failed_endpoint_is_refused_with_its_reason_unless_replaced(sm):
    client, stubber = sm
    _describe(stubber, "Failed", reason="ping health check failed")
    with pytest.raises(ServingError, match=r"is Failed \(ping health check failed\).*--replace-failed"):
        deploy(_settings(), client, NAME)
    _describe(stubber, "Failed", reason="ping health check failed")
    stubber.add_response("delete_endpoint", {}, {"EndpointName": "recs"})
    _describe(stubber, None)  # the endpoint_deleted waiter: gone
    _creates(stubber, "create")
    _describe(stubber, "InService")
    _describe(stubber, "InService")
    assert deploy(_settings(replace_failed=True), client, NAME)["endpoint_config_name"] == NAME


def test_an_endpoint_that_fails_after_the_deploy_reports_why_and_leaves_nothing_behind(sm):
    client, stubber = sm
    _describe(stubber, None)  # a new endpoint
    _creates(stubber, "create")
    _describe(stubber, "Failed", reason="image not found")  # the waiter sees it fail
    _describe(stubber, "Failed", reason="image not found")
    for kind, key in (("endpoint", "EndpointName"), ("endpoint_config", "EndpointConfigName"), ("model", "ModelName")):
        stubber.add_response(f"delete_{kind}", {}, {key: "recs" if kind == "endpoint" else NAME})
    with pytest.raises(ServingError, match=r"did not become InService: Failed \(image not found\)"):
        deploy(_settings(), client, NAME)


def test_an_update_left_on_another_configuration_is_an_error_and_the_new_one_is_removed(sm):
    client, stubber = sm
    _describe(stubber, "InService", config="old")
    _creates(stubber, "update")
    _describe(stubber, "InService", config="old")  # the waiter: in service, but...
    _describe(stubber, "InService", config="old", reason="update rolled back: capacity")
    stubber.add_response("delete_endpoint_config", {}, {"EndpointConfigName": NAME})
    stubber.add_response("delete_model", {}, {"ModelName": NAME})
    with pytest.raises(ServingError, match=r"InService on configuration 'old', not InService on .*update rolled back"):
        deploy(_settings(), client, NAME)


@pytest.mark.parametrize(
    ("runtime", "region", "instance_type", "image"),
    [
        (
            "pytorch",
            "us-east-1",
            "ml.g5.xlarge",
            "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-inference:2.6.0-gpu-py312",
        ),
        (
            "pytorch",
            "af-south-1",
            "ml.c5.xlarge",
            "626614931356.dkr.ecr.af-south-1.amazonaws.com/pytorch-inference:2.6.0-cpu-py312",
        ),
        (
            "triton",
            "eu-west-1",
            "ml.g5.xlarge",
            "763104351884.dkr.ecr.eu-west-1.amazonaws.com/sagemaker-tritonserver:24.09-py3",
        ),
    ],
)
def test_the_image_comes_from_the_table_for_the_region_runtime_and_processor(sm, runtime, region, instance_type, image):
    client, stubber = sm
    _describe(stubber, None)
    stubber.add_response(
        "create_model",
        {"ModelArn": f"{ARN}-model"},
        {
            "ModelName": NAME,
            "ExecutionRoleArn": "arn:aws:iam::123456789012:role/recserve",
            "PrimaryContainer": {
                "Image": image,
                "ModelDataUrl": "s3://models/recserve/model.tar.gz",
                "Environment": PYTORCH_ENVIRONMENT | {"SAGEMAKER_TS_MIN_WORKERS": "1", "SAGEMAKER_TS_MAX_WORKERS": "1"}
                if runtime == "pytorch"
                else {"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "recommender_native"},
            },
        },
    )
    stubber.add_response("create_endpoint_config", {"EndpointConfigArn": f"{ARN}-config"})
    stubber.add_response("create_endpoint", {"EndpointArn": ARN})
    _describe(stubber, "Creating")  # the status reported without waiting
    settings = _settings(image_uri=None, runtime=runtime, region=region, instance_type=instance_type, wait=False)
    assert deploy(settings, client, NAME)["status"] == "Creating"


def test_a_region_the_table_lacks_is_refused_naming_the_override(sm):
    client, stubber = sm
    with pytest.raises(ServingError, match="no triton inference image is listed for region xx-east-9.*IMAGE_URI"):
        deploy(_settings(image_uri=None, runtime="triton", region="xx-east-9"), client, NAME)
