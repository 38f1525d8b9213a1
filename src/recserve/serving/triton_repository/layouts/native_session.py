"""The native session layout: ``recommender_native_session``, the native TorchScript graph on recserve's own
backend, which reads each request's session from the store (``settings.session_store``) and scores it in the
same call (``native/triton-backend``); and ``events_native`` beside it, the session layout's events contract on
the same backend: appends in C++, no graph, on the CPU."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from recserve.artifacts import served
from recserve.artifacts.export_manifest import ExportManifest
from recserve.artifacts.served import Parameter
from recserve.constants import NATIVE_EVENTS_MODEL, NATIVE_SESSION_MODEL
from recserve.serving.triton_repository.layouts.common import Layout, store_parameter, store_record, stored_rules
from recserve.serving.triton_repository.layouts.native import (
    history_length,
    ruled,
    write_graphless_model,
    write_native_model,
)
from recserve.serving.triton_repository.native_configs import RECSERVE_BACKEND, check_native_session
from recserve.serving.triton_repository.repository_settings import RepositorySettings


def check(export_dir: Path, manifest: ExportManifest, settings: RepositorySettings) -> None:
    check_native_session(export_dir, manifest, settings.native_runtime, settings.device)
    store_record(settings)
    if ruled(manifest, dataclasses.replace(settings, native_runtime=RECSERVE_BACKEND)):
        stored_rules(export_dir, manifest, settings)


def write(repo: Path, export_dir: Path, manifest: ExportManifest, settings: RepositorySettings, version: int) -> None:
    on_recserve = dataclasses.replace(settings, native_runtime=RECSERVE_BACKEND)
    width = history_length(manifest)
    parameters = store_parameter(settings) | {Parameter.HISTORY_LENGTH: str(width)}
    contract = served.native_by_session(width, ruled=ruled(manifest, on_recserve))
    write_native_model(repo, NATIVE_SESSION_MODEL, export_dir, manifest, on_recserve, version, contract, parameters)
    events = store_parameter(settings) | {Parameter.EVENTS_ONLY: "true"}
    on_cpus = dataclasses.replace(settings, device="cpu", native_instance_count=settings.native_instances)
    note = "events alone on recserve's backend: no graph, the store in config.pbtxt"
    write_graphless_model(repo, NATIVE_EVENTS_MODEL, served.events("INT64"), on_cpus, events, version, note)


def describe(manifest: ExportManifest, settings: RepositorySettings) -> list[dict]:
    store = store_record(settings)["url"]
    return [
        {"name": NATIVE_SESSION_MODEL, "backend": RECSERVE_BACKEND, "store": store},
        {"name": NATIVE_EVENTS_MODEL, "backend": RECSERVE_BACKEND, "store": store},
    ]


LAYOUT = Layout(served.LAYOUTS["native_session"], ("torchscript", None), check, write, describe)
