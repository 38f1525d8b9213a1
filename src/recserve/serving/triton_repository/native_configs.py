"""What Triton's native backends run from an export: the native layouts' models and the seed layout's
TorchScript model step; which backend runs them, its settings and the checks that an export can provide them
on the device asked for. Their tensor contracts are ``recserve.artifacts.served``'s."""

from __future__ import annotations

from pathlib import Path

from recserve.artifacts.export_manifest import ExportManifest
from recserve.artifacts.served import Parameter
from recserve.constants import NATIVE_ONNX_FILE, NATIVE_TORCHSCRIPT_FILE
from recserve.errors import ServingError

# the native model's file in an export -> (Triton platform, the file name that platform loads)
NATIVE_PLATFORMS = {
    NATIVE_TORCHSCRIPT_FILE: ("pytorch_libtorch", "model.pt"),
    NATIVE_ONNX_FILE: ("onnxruntime_onnx", "model.onnx"),
}
# What may run a TorchScript native model: recserve's own backend (native/triton-backend: CUDA graphs per
# batch-size bucket on GPUs, the graph as it is on CPUs) or Triton's PyTorch backend.
NATIVE_RUNTIMES = ("recserve", "pytorch")
RECSERVE_BACKEND = "recserve"


def native_runtime(manifest: ExportManifest, runtime: str | None, device: str) -> str:
    """The backend that serves the export's native model: onnxruntime for an ONNX graph; for TorchScript
    ``runtime``, by default recserve's own on GPUs (a CUDA graph replay instead of ~100 operator launches)
    and Triton's PyTorch backend on CPUs.

    Raises:
        ServingError: an unknown runtime, or one named for an ONNX graph.
    """
    if manifest.native_model == NATIVE_ONNX_FILE:
        if runtime is not None:
            raise ServingError(
                f"--native-runtime {runtime} runs TorchScript; this onnx export's native model runs on Triton's "
                "onnxruntime backend (export with --backend torchscript for the other runtimes)"
            )
        return "onnxruntime"
    if runtime is None:
        return RECSERVE_BACKEND if device == "gpu" else "pytorch"
    return runtime


def native_backend(manifest: ExportManifest, runtime: str | None, device: str) -> tuple[str, str]:
    """(backend, platform) of the native model's config.pbtxt: one of them is empty."""
    chosen = native_runtime(manifest, runtime, device)
    if chosen == RECSERVE_BACKEND:
        return RECSERVE_BACKEND, ""
    return "", NATIVE_PLATFORMS[str(manifest.native_model)][0]


def check_native_session(export_dir: Path, manifest: ExportManifest, runtime: str | None, device: str) -> None:
    """The native model by session runs on recserve's own backend only, from a TorchScript native graph."""
    check_native(export_dir, manifest, device)
    if manifest.native_model != NATIVE_TORCHSCRIPT_FILE or runtime not in (None, RECSERVE_BACKEND):
        raise ServingError(
            "the native_session layout reads the session store in recserve's own backend, which runs the "
            "TorchScript native graph: export with --backend torchscript, and leave --native-runtime unset (or "
            "recserve); the session layout serves any export by session"
        )


def backend_parameters(platform: str, device: str) -> dict[str, str]:
    """The backends' own settings: TorchScript without autograd and without the profiling executor (which
    re-optimises the graph for every new batch size the batcher forms; recserve's backend never runs it),
    and on CPUs one thread an instance (the instances are the parallelism, as for the python models)."""
    if platform == RECSERVE_BACKEND:
        return {Parameter.INTRA_OP_THREAD_COUNT: "1"} if device == "cpu" else {}
    if platform == "pytorch_libtorch":
        # (INTER_OP_THREAD_COUNT is process-wide: a second instance setting it aborts the server)
        threads = {"INTRA_OP_THREAD_COUNT": "1"} if device == "cpu" else {}
        return {"INFERENCE_MODE": "true", "DISABLE_OPTIMIZED_EXECUTION": "true", **threads}
    return {"intra_op_thread_count": "1", "inter_op_thread_count": "1"} if device == "cpu" else {}


def require_built_for(manifest: ExportManifest, device: str, what: str) -> None:
    """What an export compiled or traced on one device (a backend that is not portable, a traced TorchScript
    graph, whose constants live there) is served on that device only.

    Raises:
        ServingError: ``what`` (a phrase ending in "built for" or "traced on") for another device.
    """
    if not manifest.built_for(device):
        raise ServingError(
            f"{what} {manifest.device} and runs there only; serve it with --device "
            f"{'gpu' if manifest.device != 'cpu' else 'cpu'} or export again with --device "
            f"{'cuda' if device == 'gpu' else 'cpu'}"
        )


def check_native(export_dir: Path, manifest: ExportManifest, device: str) -> None:
    if not manifest.native_model:
        reason = manifest.native_absent
        raise ServingError(
            f"{export_dir}: this {manifest.backend} export holds no native model"
            + (f" ({reason})" if reason else "; export with --backend torchscript (or onnx, CPU only)")
        )
    if manifest.native_model == NATIVE_ONNX_FILE and device == "gpu":
        raise ServingError(
            "the onnxruntime backend built here runs on CPUs only; serve a torchscript export on GPUs "
            "(recserve export --backend torchscript --device cuda)"
        )
    if manifest.native_model == NATIVE_TORCHSCRIPT_FILE:
        require_built_for(manifest, device, "the native TorchScript model was traced on")


def check_seed(export_dir: Path, manifest: ExportManifest, device: str) -> None:
    if not manifest.seed_model:
        raise ServingError(
            f"{export_dir}: the seed layout's model step is TorchScript on the PyTorch backend, which this "
            f"{manifest.backend} export does not hold; export with --backend torchscript for it"
        )
    require_built_for(manifest, device, "the seed layout's TorchScript model step was traced on")
