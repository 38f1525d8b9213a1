"""The floor layout: ``recommender_floor``, recserve's backend answering the native contract without a graph
(parameter ``floor``): the requests read and staged as the native model's are, batched alike, answered max_k
IDs of -1 wide as the batch's largest k. What a request costs Triton and the backend with no model in it: the
native layout's figures over the floor's are the model's own cost on any host (``recserve bench``: native
over floor)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from recserve.artifacts import served
from recserve.artifacts.export_manifest import ExportManifest
from recserve.artifacts.served import Parameter
from recserve.constants import FLOOR_MODEL, NATIVE_PAD_ID
from recserve.errors import ServingError
from recserve.files import replaced_on_success
from recserve.serving.triton_repository.layouts.common import Layout, batched_config, instances, write_config
from recserve.serving.triton_repository.layouts.native import history_length
from recserve.serving.triton_repository.native_configs import RECSERVE_BACKEND, backend_parameters
from recserve.serving.triton_repository.repository_settings import RepositorySettings


def check(export_dir: Path, manifest: ExportManifest, settings: RepositorySettings) -> None:
    """Any export of integer IDs (the native contract's): the floor reads its window and largest k alone."""
    if manifest.item_id_type != "int64":
        raise ServingError(f"{export_dir}: the floor layout takes integer item IDs, as the native contract does")


def write(repo: Path, export_dir: Path, manifest: ExportManifest, settings: RepositorySettings, version: int) -> None:
    parameters = {
        **backend_parameters(RECSERVE_BACKEND, settings.device),
        Parameter.PADDING_ID: str(NATIVE_PAD_ID),
        Parameter.MAX_K: str(min(manifest.max_k, manifest.num_items)),
        Parameter.FLOOR: "true",
    }
    on_recserve = dataclasses.replace(settings, instance_count=settings.native_instances)
    contract = served.native(history_length(manifest))
    config = batched_config(FLOOR_MODEL, contract, on_recserve, parameters, (RECSERVE_BACKEND, ""))
    write_config(repo / FLOOR_MODEL, config)
    with replaced_on_success(repo / FLOOR_MODEL / str(version)) as staging:  # no file: the floor runs no graph
        (staging / "README").write_text("the floor on recserve's backend: the native contract, no graph\n")


def describe(manifest: ExportManifest, settings: RepositorySettings) -> list[dict]:
    groups = instances(dataclasses.replace(settings, instance_count=settings.native_instances))
    return [{"name": FLOOR_MODEL, "backend": RECSERVE_BACKEND, "instances": groups[0].count}]


LAYOUT = Layout(served.LAYOUTS["floor"], (None, None), check, write, describe)
