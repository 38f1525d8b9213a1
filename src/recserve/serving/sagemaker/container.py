"""Starts SageMaker's PyTorch serving stack (the inference toolkit over TorchServe) as the container does.

One change: TorchServe binds to loopback rather than every interface, since this endpoint is local.
Run as ``python -m recserve.serving.sagemaker.container`` with the container's environment variables set.
"""

from __future__ import annotations


def main() -> None:
    from sagemaker_pytorch_serving_container import serving, torchserve

    generate = torchserve._generate_ts_config_properties
    torchserve._generate_ts_config_properties = lambda handler: generate(handler).replace("0.0.0.0", "127.0.0.1")
    serving.main()


if __name__ == "__main__":
    main()
