"""The SageMaker inference images each runtime deploys on, by region: a table, so ``recserve sagemaker deploy``
needs no image URI pasted by hand (``RECSERVE_SAGEMAKER_IMAGE_URI`` still overrides it).

Source: the SageMaker Python SDK's own table, sagemaker-core 2.27.0 (SDK 3.27.0, 2026-10),
``sagemaker/core/image_uri_config/pytorch.json`` (``inference``, version 2.6.0, py312) and
``sagemaker-tritonserver.json`` (version 24.09, the release nearest the bundled Triton's 24.10).
"""

from __future__ import annotations

from recserve.errors import ServingError

SOURCE = "sagemaker-core 2.27.0 image_uri_config (pytorch.json inference 2.6.0; sagemaker-tritonserver.json 24.09)"

PYTORCH_REGISTRIES = {
    "af-south-1": "626614931356",
    "ap-east-1": "871362719292",
    "ap-east-2": "975050140332",
    "ap-northeast-1": "763104351884",
    "ap-northeast-2": "763104351884",
    "ap-northeast-3": "364406365360",
    "ap-south-1": "763104351884",
    "ap-south-2": "772153158452",
    "ap-southeast-1": "763104351884",
    "ap-southeast-2": "763104351884",
    "ap-southeast-3": "907027046896",
    "ap-southeast-4": "457447274322",
    "ap-southeast-5": "550225433462",
    "ap-southeast-6": "633930458069",
    "ap-southeast-7": "590183813437",
    "ca-central-1": "763104351884",
    "ca-west-1": "204538143572",
    "cn-north-1": "727897471807",
    "cn-northwest-1": "727897471807",
    "eu-central-1": "763104351884",
    "eu-central-2": "380420809688",
    "eu-north-1": "763104351884",
    "eu-south-1": "692866216735",
    "eu-south-2": "503227376785",
    "eu-west-1": "763104351884",
    "eu-west-2": "763104351884",
    "eu-west-3": "763104351884",
    "il-central-1": "780543022126",
    "me-central-1": "914824155844",
    "me-south-1": "217643126080",
    "me-west-1": "124382933778",
    "mx-central-1": "637423239942",
    "sa-east-1": "763104351884",
    "us-east-1": "763104351884",
    "us-east-2": "763104351884",
    "us-gov-east-1": "446045086412",
    "us-gov-west-1": "442386744353",
    "us-west-1": "763104351884",
    "us-west-2": "763104351884",
}
TRITON_REGISTRIES = {
    "af-south-1": "626614931356",
    "ap-east-1": "871362719292",
    "ap-northeast-1": "763104351884",
    "ap-northeast-2": "763104351884",
    "ap-northeast-3": "364406365360",
    "ap-south-1": "763104351884",
    "ap-southeast-1": "763104351884",
    "ap-southeast-2": "763104351884",
    "ap-southeast-3": "907027046896",
    "ca-central-1": "763104351884",
    "ca-west-1": "204538143572",
    "cn-north-1": "727897471807",
    "cn-northwest-1": "727897471807",
    "eu-central-1": "763104351884",
    "eu-north-1": "763104351884",
    "eu-south-1": "692866216735",
    "eu-west-1": "763104351884",
    "eu-west-2": "763104351884",
    "eu-west-3": "763104351884",
    "il-central-1": "780543022126",
    "me-south-1": "217643126080",
    "sa-east-1": "763104351884",
    "us-east-1": "763104351884",
    "us-east-2": "763104351884",
    "us-west-1": "763104351884",
    "us-west-2": "763104351884",
}
# runtime -> (repository, tag with {processor}, registries)
IMAGES = {
    "pytorch": ("pytorch-inference", "2.6.0-{processor}-py312", PYTORCH_REGISTRIES),
    "triton": ("sagemaker-tritonserver", "24.09-py3", TRITON_REGISTRIES),  # one image for CPUs and GPUs
}
GPU_FAMILIES = ("ml.g", "ml.p")  # instance types with NVIDIA GPUs (ml.g5.xlarge, ml.p4d.24xlarge, ...)


def processor(instance_type: str) -> str:
    return "gpu" if instance_type.startswith(GPU_FAMILIES) else "cpu"


def image_uri(runtime: str, region: str, instance_type: str) -> str:
    """The runtime's inference image in ``region`` for ``instance_type``'s processor.

    Raises:
        ServingError: a runtime or region the table does not hold, naming the override.
    """
    if runtime not in IMAGES:
        raise ServingError(f"runtime {runtime!r}: expected one of {', '.join(IMAGES)}")
    repository, tag, registries = IMAGES[runtime]
    if region not in registries:
        raise ServingError(
            f"no {runtime} inference image is listed for region {region} ({SOURCE}); set "
            "RECSERVE_SAGEMAKER_IMAGE_URI to the image to run"
        )
    domain = "amazonaws.com.cn" if region.startswith("cn-") else "amazonaws.com"
    return (
        f"{registries[region]}.dkr.ecr.{region}.{domain}/{repository}:{tag.format(processor=processor(instance_type))}"
    )
