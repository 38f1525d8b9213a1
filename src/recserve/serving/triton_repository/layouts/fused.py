"""The fused layout: ``recommender``, the export (copied whole) behind a batched python model."""

from __future__ import annotations

from pathlib import Path

from recserve.artifacts import served
from recserve.artifacts.export_manifest import ExportManifest
from recserve.constants import FUSED_MODEL
from recserve.serving.triton_repository.layouts.common import (
    Layout,
    batched_config,
    id_type,
    python_parameters,
    write_config,
    write_python_version,
)
from recserve.serving.triton_repository.native_configs import require_built_for
from recserve.serving.triton_repository.pbtxt import to_pbtxt
from recserve.serving.triton_repository.repository_settings import RepositorySettings


def check(export_dir: Path, manifest: ExportManifest, settings: RepositorySettings) -> None:
    if not manifest.portable:
        require_built_for(manifest, settings.device, f"the {manifest.backend} export was built for")
    python_parameters(export_dir, manifest, settings)  # the store and the rules, before anything is written


def write(repo: Path, export_dir: Path, manifest: ExportManifest, settings: RepositorySettings, version: int) -> None:
    model_dir = repo / FUSED_MODEL
    parameters = python_parameters(export_dir, manifest, settings)
    config = batched_config(FUSED_MODEL, served.recommender(id_type(manifest)), settings, parameters)
    # a config.pbtxt unchanged is left alone: a polling server reloads the model when it changes
    if not (model_dir / "config.pbtxt").exists() or (model_dir / "config.pbtxt").read_text() != to_pbtxt(config):
        write_config(model_dir, config)
    write_python_version(model_dir, version, export_dir, "fused")


def describe(manifest: ExportManifest, settings: RepositorySettings) -> list[dict]:
    return [
        {
            "name": FUSED_MODEL,
            "backend": manifest.backend,
            "precision": manifest.precision,
            "validation_max_diff": manifest.validation.get("max_score_diff"),
        }
    ]


LAYOUT = Layout(served.LAYOUTS["fused"], (None, None), check, write, describe)
