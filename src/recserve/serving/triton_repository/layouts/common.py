"""What the layouts' writers share: a dynamically batched model's config from its contract, a python model's
source, a config.pbtxt, the export copied into a version folder, and the store record a model by session is
given."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from recserve.artifacts.catalogue import TRITON_DTYPES
from recserve.artifacts.export_manifest import ExportManifest
from recserve.artifacts.served import Contract, ServedLayout
from recserve.errors import ConfigError, ServingError
from recserve.files import replaced_on_success
from recserve.serving.triton_repository.pbtxt import (
    DynamicBatching,
    InstanceGroup,
    QueuePolicy,
    TritonModelConfig,
    to_pbtxt,
)
from recserve.serving.triton_repository.repository_settings import RepositorySettings

EXPORT_SUBDIR = "export"


def instances(settings: RepositorySettings) -> tuple[InstanceGroup, ...]:
    if settings.device == "gpu":
        return (InstanceGroup(count=settings.instance_count, kind="KIND_GPU", gpus=settings.gpus),)
    return (InstanceGroup(count=settings.instance_count, kind="KIND_CPU"),)


def batched_config(
    name: str,
    contract: Contract,
    settings: RepositorySettings,
    parameters: dict,
    backend: tuple[str, str] = ("python", ""),
) -> TritonModelConfig:
    """A dynamically batched model of ``contract`` on ``backend`` (backend, platform: one of them empty)."""
    policy = None
    if settings.max_queue_size or settings.queue_timeout_microseconds:
        policy = QueuePolicy(settings.max_queue_size, settings.queue_timeout_microseconds)
    return TritonModelConfig(
        name=name,
        inputs=contract.inputs,
        outputs=contract.outputs,
        backend=backend[0],
        platform=backend[1],
        max_batch_size=settings.max_batch_size,
        dynamic_batching=DynamicBatching(settings.preferred_batch_sizes, settings.queue_delay_microseconds, policy),
        instance_groups=instances(settings),
        version_policy_latest=settings.versions_served,
        response_cache=settings.response_cache,
        parameters=parameters,
    )


def python_model(source: str, target_dir: Path) -> None:
    """Writes the python model ``python_models/SOURCE.py`` as ``target_dir``/model.py."""
    target_dir.mkdir(parents=True, exist_ok=True)
    text = resources.files("recserve.serving.triton_repository.python_models").joinpath(f"{source}.py").read_text()
    (target_dir / "model.py").write_text(text)


def write_config(model_dir: Path, config: TritonModelConfig) -> None:
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.pbtxt").write_text(to_pbtxt(config))


def write_python_version(model_dir: Path, version: int, export_dir: Path, source: str) -> None:
    """A python model's version folder holding the export whole: it appears whole (a polling server must never
    load a half-written one), built under a hidden name Triton ignores, then renamed."""
    with replaced_on_success(model_dir / str(version)) as staging:
        shutil.copytree(export_dir, staging / EXPORT_SUBDIR, ignore=shutil.ignore_patterns(".*"))
        python_model(source, staging)


def id_type(manifest: ExportManifest) -> str:
    """The served item_ids' data type: the catalogue's ID type, as the export's manifest records it."""
    return TRITON_DTYPES[manifest.item_id_type]


def store_record(settings: RepositorySettings) -> dict:
    """What a model by session is told of its store (``store_settings.read_store_record``): never a password.

    Raises:
        ServingError: no store given, or one that cannot be read.
    """
    from recserve.sessions.store_settings import read_store_record

    if not settings.session_store:
        raise ServingError("the session layout needs a session store: --session-store FOLDER_OR_JSON")
    try:
        return read_store_record(settings.session_store)
    except ConfigError as err:
        raise ServingError(f"--session-store: {err}") from err


def store_parameter(settings: RepositorySettings) -> dict[str, str]:
    """The config parameter that tells a model by session its store."""
    return {"session_store": json.dumps(store_record(settings), sort_keys=True)}


@dataclass(frozen=True)
class Layout:
    """One layout of a repository: what its clients see of it (``served``: its models and their request), the
    export of a run it serves, its checks (all run before anything is written), its writer and what a
    repository's summary says of it. Each is the ``LAYOUT`` of a module of this package."""

    served: ServedLayout
    # (backend, precision) of the export it serves from a run: None keeps what was asked for; "native": the
    # native graph's backend for the run and device (``pipeline.repository_from_run`` chooses)
    export: tuple[str | None, str | None]
    check: Callable[[Path, ExportManifest, RepositorySettings], None]
    write: Callable[[Path, Path, ExportManifest, RepositorySettings, int], None]
    describe: Callable[[ExportManifest, RepositorySettings], list[dict]]

    @property
    def models(self) -> tuple[str, ...]:
        return self.served.models

    @property
    def entry(self) -> str:
        return self.served.entry


def no_check(export_dir: Path, manifest: ExportManifest, settings: RepositorySettings) -> None:
    return None
