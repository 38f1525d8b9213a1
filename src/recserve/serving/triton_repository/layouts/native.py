"""The native layout: ``recommender_native``, the export's native TorchScript or ONNX graph on a native backend
(recserve's own or Triton's, ``native_configs.native_backend``)."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

from recserve.artifacts import served
from recserve.artifacts.export_manifest import ExportManifest
from recserve.constants import NATIVE_MODEL, NATIVE_ONNX_FILE, NATIVE_PAD_ID
from recserve.files import replaced_on_success
from recserve.serving.triton_repository.layouts.common import Layout, batched_config, write_config
from recserve.serving.triton_repository.native_configs import (
    NATIVE_PLATFORMS,
    backend_parameters,
    check_native,
    native_backend,
)
from recserve.serving.triton_repository.repository_settings import RepositorySettings


def history_length(manifest: ExportManifest) -> int:
    """The native graph's width: the history items of the model's window (the last token is its own)."""
    return manifest.window - 1


def contract(manifest: ExportManifest) -> served.Contract:
    return served.native(history_length(manifest), onnx=manifest.native_model == NATIVE_ONNX_FILE)


def write_native_model(
    repo: Path,
    name: str,
    export_dir: Path,
    manifest: ExportManifest,
    settings: RepositorySettings,
    version: int,
    model_contract: served.Contract,
    extra: dict | None = None,
) -> None:
    """A native model (``name``) of ``model_contract``: the export's native graph on its backend, with the
    backend's settings, the padding ID and the largest k as parameters (``extra`` added)."""
    backend = native_backend(manifest, settings.native_runtime, settings.device)
    parameters = {
        **backend_parameters(backend[0] or backend[1], settings.device),
        "padding_id": str(NATIVE_PAD_ID),
        "max_k": str(min(manifest.max_k, manifest.num_items)),
        **(extra or {}),
    }
    instances = dataclasses.replace(settings, instance_count=settings.native_instances)
    write_config(repo / name, batched_config(name, model_contract, instances, parameters, backend))
    target = NATIVE_PLATFORMS[str(manifest.native_model)][1]
    with replaced_on_success(repo / name / str(version)) as staging:
        shutil.copyfile(Path(export_dir) / str(manifest.native_model), staging / target)
        for data in Path(export_dir).glob(f"{manifest.native_model}.data"):  # ONNX weights kept outside
            shutil.copyfile(data, staging / data.name)


def check(export_dir: Path, manifest: ExportManifest, settings: RepositorySettings) -> None:
    check_native(export_dir, manifest, settings.device)
    native_backend(manifest, settings.native_runtime, settings.device)


def write(repo: Path, export_dir: Path, manifest: ExportManifest, settings: RepositorySettings, version: int) -> None:
    write_native_model(repo, NATIVE_MODEL, export_dir, manifest, settings, version, contract(manifest))


def describe(manifest: ExportManifest, settings: RepositorySettings) -> list[dict]:
    return [
        {
            "name": NATIVE_MODEL,
            "backend": "".join(native_backend(manifest, settings.native_runtime, settings.device)),
            "precision": manifest.precision,
            "validation_max_diff": manifest.validation.get("native", {}).get("max_score_diff"),
        }
    ]


LAYOUT = Layout(served.LAYOUTS["native"], ("native", None), check, write, describe)
