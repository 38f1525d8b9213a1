"""The session layout: ``recommender_session``, the export (copied whole) behind a batched python model that
reads each request's session from the store (``settings.session_store``: its address, user, prefix and
password file, never the password); and ``events``, a batched python model that only appends a request's
events to the same store (no export)."""

from __future__ import annotations

from pathlib import Path

from recserve.artifacts import served
from recserve.artifacts.export_manifest import ExportManifest
from recserve.artifacts.served import Parameter
from recserve.constants import EVENTS_MODEL, SESSION_MODEL
from recserve.files import replaced_on_success
from recserve.serving.triton_repository.layouts.common import (
    Layout,
    batched_config,
    id_type,
    python_model,
    python_parameters,
    store_parameter,
    store_record,
    write_config,
    write_python_version,
)
from recserve.serving.triton_repository.repository_settings import RepositorySettings


def check(export_dir: Path, manifest: ExportManifest, settings: RepositorySettings) -> None:
    store_record(settings)
    python_parameters(export_dir, manifest, settings)


def write(repo: Path, export_dir: Path, manifest: ExportManifest, settings: RepositorySettings, version: int) -> None:
    parameters = python_parameters(export_dir, manifest, settings)
    write_config(
        repo / SESSION_MODEL, batched_config(SESSION_MODEL, served.by_session(id_type(manifest)), settings, parameters)
    )
    write_python_version(repo / SESSION_MODEL, version, export_dir, "session")
    events = store_parameter(settings) | {Parameter.ITEM_ID_TYPE: manifest.item_id_type}
    write_config(repo / EVENTS_MODEL, batched_config(EVENTS_MODEL, served.events(id_type(manifest)), settings, events))
    with replaced_on_success(repo / EVENTS_MODEL / str(version)) as staging:  # whole or not at all
        python_model("events", staging)


def describe(manifest: ExportManifest, settings: RepositorySettings) -> list[dict]:
    store = store_record(settings)["url"]
    return [{"name": SESSION_MODEL, "store": store}, {"name": EVENTS_MODEL, "store": store}]


LAYOUT = Layout(served.LAYOUTS["session"], (None, None), check, write, describe)
