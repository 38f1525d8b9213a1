"""The floor layout: ``recommender_floor``, recserve's backend answering the native contract without a graph
(parameter ``floor``): the requests read and staged as the native model's are, batched alike, answered max_k
IDs of -1 wide as the batch's largest k. What a request costs Triton and the backend with no model in it: the
native layout's figures over the floor's are the model's own cost on any host (``recserve bench``: native
over floor)."""

from __future__ import annotations

from pathlib import Path

from recserve.artifacts import served
from recserve.artifacts.export_manifest import ExportManifest
from recserve.artifacts.served import Parameter
from recserve.constants import FLOOR_MODEL
from recserve.errors import ServingError
from recserve.serving.triton_repository.layouts.common import Layout
from recserve.serving.triton_repository.layouts.native import history_length, shape_parameters, write_graphless_model
from recserve.serving.triton_repository.native_configs import RECSERVE_BACKEND, backend_parameters
from recserve.serving.triton_repository.repository_settings import RepositorySettings


def check(export_dir: Path, manifest: ExportManifest, settings: RepositorySettings) -> None:
    """Any export of integer IDs (the native contract's): the floor reads its window and largest k alone."""
    if manifest.item_id_type != "int64":
        raise ServingError(f"{export_dir}: the floor layout takes integer item IDs, as the native contract does")


def write(repo: Path, export_dir: Path, manifest: ExportManifest, settings: RepositorySettings, version: int) -> None:
    parameters = {
        **backend_parameters(RECSERVE_BACKEND, settings.device),
        **shape_parameters(manifest),
        Parameter.FLOOR: "true",
    }
    contract = served.native(history_length(manifest))
    note = "the floor on recserve's backend: the native contract, no graph"
    write_graphless_model(repo, FLOOR_MODEL, contract, settings, parameters, version, note)


def describe(manifest: ExportManifest, settings: RepositorySettings) -> list[dict]:
    return [{"name": FLOOR_MODEL, "backend": RECSERVE_BACKEND, "instances": settings.native_instances}]


LAYOUT = Layout(served.LAYOUTS["floor"], (None, None), check, write, describe)
