"""Where a Triton python model instance runs its model: imported by the python models (no pb_utils here)."""

import os

DEVICE_ENV = "RECSERVE_DEVICE"


def instance_device(args: dict) -> str:
    """``cuda:N`` for GPU instances or when the server was started with ``--gpu``; else ``cpu``."""
    if args["model_instance_kind"] == "GPU":
        return f"cuda:{args['model_instance_device_id']}"
    return "cuda:0" if os.environ.get(DEVICE_ENV) == "cuda" else "cpu"
