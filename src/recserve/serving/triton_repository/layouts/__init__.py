"""``recserve repo``: writes a Triton model repository (fused, native, seed, session, native_session, echo and floor
layouts) from an export.

The repository serves the export that ``recserve export`` validated: the python models' version folders hold
a copy of it; the native layouts and the seed layout's model step serve the TorchScript or ONNX files the
export wrote and checked. ``recserve.pipeline.repository_from_run`` is the shortcut that exports a run first.

Each layout is the ``LAYOUT`` of the module of its name in this package (its writer, checks and description);
what its clients see of it, its models and their contracts, is ``recserve.artifacts.served.LAYOUTS``, whose order is the
order a repository writes them in.
"""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path
from typing import Any

from recserve.artifacts import served
from recserve.artifacts.export_manifest import ExportManifest
from recserve.artifacts.repository_record import record_layouts
from recserve.errors import ServingError
from recserve.serving.triton_repository.layouts.common import EXPORT_SUBDIR, Layout, store_record
from recserve.serving.triton_repository.native_configs import NATIVE_RUNTIMES
from recserve.serving.triton_repository.repository_settings import RepositorySettings

__all__ = ["EXPORT_SUBDIR", "LAYOUTS", "Layout", "check_request", "write_repository"]

LAYOUTS: dict[str, Layout] = {name: importlib.import_module(f"{__name__}.{name}").LAYOUT for name in served.LAYOUTS}


def write_repository(
    export_dir: Path,
    repo: Path,
    layouts: tuple[str, ...] = ("fused",),
    settings: RepositorySettings = RepositorySettings(),
    version: int = 1,
) -> dict:
    """Writes (or adds to) a model repository from an export folder; returns a summary of what it holds.

    Raises:
        ExportError: ``export_dir`` is not an export folder.
        ServingError: an unknown layout, device or version; an export compiled for another device than
            ``settings.device``; the seed layout from an export without the model's weights.
    """
    check_request(layouts, settings, version)
    export_dir = Path(export_dir)
    manifest = ExportManifest.read(export_dir)
    chosen = [LAYOUTS[name] for name in LAYOUTS if name in layouts]  # in the table's order
    for layout in chosen:  # every check before anything is written
        layout.check(export_dir, manifest, settings)
    repo = Path(repo)
    repo.mkdir(parents=True, exist_ok=True)
    summary: dict = {"repository": str(repo), "version": version, "models": []}
    for layout in chosen:
        layout.write(repo, export_dir, manifest, settings, version)
        summary["models"] += layout.describe(manifest, settings)
    export = {
        "backend": manifest.backend,
        "precision": manifest.precision,
        "device": manifest.device,
        "max_k": manifest.max_k,
        "explore_new": manifest.explore_new,
        "item_id_type": manifest.item_id_type,
    }
    store = store_record(settings) if settings.session_store else None  # sessions' and hidden items' store
    record_layouts(repo, layouts, export, manifest.run, store, _recorded(settings), version)
    return summary


def _recorded(settings: RepositorySettings) -> dict:
    """The settings as the repository's record keeps them: their files' paths absolute, so that a later
    version (``recserve promote``) is written alike from any folder."""
    paths: dict[str, Any] = {
        name: str(Path(value).resolve()) for name in ("session_store", "rules") if (value := getattr(settings, name))
    }
    return dataclasses.asdict(dataclasses.replace(settings, **paths))


def check_request(layouts: tuple[str, ...], settings: RepositorySettings, version: int) -> None:
    """Refuses unknown layouts, devices and versions, and GPU ids without device gpu (ServingError)."""
    unknown = [layout for layout in layouts if layout not in LAYOUTS]
    if unknown or not layouts:
        raise ServingError(f"layout {', '.join(unknown) or '(none)'}: expected any of {', '.join(LAYOUTS)}")
    if settings.device not in ("cpu", "gpu"):
        raise ServingError(f"device {settings.device!r}: expected cpu or gpu")
    if settings.gpus and (settings.device != "gpu" or min(settings.gpus) < 0):
        raise ServingError(f"gpus {list(settings.gpus)}: GPU ids (0, 1, ...) go with device gpu")
    if version < 1:
        raise ServingError(f"version {version}: must be at least 1")
    if settings.native_runtime is not None and settings.native_runtime not in NATIVE_RUNTIMES:
        raise ServingError(f"native runtime {settings.native_runtime!r}: expected one of {', '.join(NATIVE_RUNTIMES)}")
