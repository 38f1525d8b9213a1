"""The echo layout: ``echo``, the ``recommender`` contract and batching with a fixed answer and no compute (the
server's floor, for benchmarks)."""

from __future__ import annotations

from pathlib import Path

from recserve.artifacts import served
from recserve.artifacts.export_manifest import ExportManifest
from recserve.artifacts.served import Parameter
from recserve.constants import ECHO_MODEL
from recserve.serving.triton_repository.layouts.common import (
    Layout,
    batched_config,
    id_type,
    no_check,
    python_model,
    write_config,
)
from recserve.serving.triton_repository.repository_settings import RepositorySettings


def write(repo: Path, export_dir: Path, manifest: ExportManifest, settings: RepositorySettings, version: int) -> None:
    parameters = {Parameter.MAX_K: str(manifest.max_k), Parameter.ITEM_ID_TYPE: manifest.item_id_type}
    python_model("echo", repo / ECHO_MODEL / str(version))
    write_config(
        repo / ECHO_MODEL, batched_config(ECHO_MODEL, served.recommender(id_type(manifest)), settings, parameters)
    )


def describe(manifest: ExportManifest, settings: RepositorySettings) -> list[dict]:
    return [{"name": ECHO_MODEL}]


LAYOUT = Layout(served.LAYOUTS["echo"], (None, None), no_check, write, describe)
