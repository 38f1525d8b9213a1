"""What the layouts' writers share: a dynamically batched model's config from its contract, a python model's
source, a config.pbtxt, the export copied into a version folder, and the store record a model by session is
given."""

from __future__ import annotations

import functools
import json
import logging
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

from recserve.artifacts.catalogue import TRITON_DTYPES
from recserve.artifacts.export_manifest import ExportManifest
from recserve.artifacts.item_table import ATTRIBUTES_FILE, read_attributes
from recserve.artifacts.served import Contract, Parameter, ServedLayout
from recserve.constants import ITEMS_FILE
from recserve.errors import ConfigError, ServingError
from recserve.files import replaced_on_success
from recserve.rules.language import RuleError, compile_rule, parse, values_no_item_holds
from recserve.rules.named import read_named_rules
from recserve.serving.triton_repository.pbtxt import (
    DynamicBatching,
    InstanceGroup,
    QueuePolicy,
    TritonModelConfig,
    to_pbtxt,
)
from recserve.serving.triton_repository.repository_settings import RepositorySettings

log = logging.getLogger(__name__)

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
    """The config parameter that tells a model its store (``Parameter.SESSION_STORE``)."""
    return {Parameter.SESSION_STORE: json.dumps(store_record(settings), sort_keys=True)}


def stored_rules(export_dir: Path, manifest: ExportManifest, settings: RepositorySettings) -> dict[str, np.ndarray]:
    """The rules stored by name (``settings.rules``), each compiled against the export's item attributes: the
    items it lets through, (N,) bool in catalogue order; none without ``settings.rules``.

    Raises:
        ConfigError: a file that cannot be read, or a name that is not one.
        ServingError: a rule that does not fit the export's attributes.
    """
    if not settings.rules:
        return {}
    # every layout of a repository asks: compiled once while the files are the ones compiled
    files = (Path(settings.rules), Path(export_dir) / ATTRIBUTES_FILE, Path(export_dir) / ITEMS_FILE)
    return dict(_compiled_rules(str(export_dir), manifest.num_items, settings.rules, tuple(map(_stamp, files))))


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        status = path.stat()
    except OSError:
        return None
    return status.st_mtime_ns, status.st_size


@functools.lru_cache(maxsize=4)
def _compiled_rules(export_dir: str, num_items: int, rules: str, stamps: tuple) -> dict[str, np.ndarray]:
    named = read_named_rules(Path(rules))
    attributes = read_attributes(Path(export_dir), num_items)
    masks = {}
    for name, text in named.items():
        try:
            masks[name] = compile_rule(text, attributes)
            masks[name].flags.writeable = False  # shared by every caller
        except RuleError as err:
            raise ServingError(f"--rules {rules}: rule {name!r}: {err}") from err
        for line in values_no_item_holds(parse(text), attributes):  # lets nothing through for that value: said
            log.warning("--rules %s: rule %r: %s", rules, name, line)
    return masks


def rules_parameter(export_dir: Path, manifest: ExportManifest, settings: RepositorySettings) -> dict[str, str]:
    """The config parameter of the rules stored by name (``Parameter.RULES``), each checked
    against the export's item attributes (``stored_rules``); none without ``settings.rules``."""
    if not settings.rules:
        return {}
    stored_rules(export_dir, manifest, settings)
    return {Parameter.RULES: json.dumps(read_named_rules(Path(settings.rules)), sort_keys=True)}


def python_parameters(export_dir: Path, manifest: ExportManifest, settings: RepositorySettings) -> dict[str, str]:
    """A fused or session python model's parameters: its export, its rules, its store where there is one."""
    if settings.response_cache and settings.session_store:
        raise ServingError(
            "--response-cache would answer from before a hide (recserve items hide): leave it off with a session store"
        )
    store = store_parameter(settings) if settings.session_store else {}
    return {Parameter.EXPORT_DIR: EXPORT_SUBDIR} | rules_parameter(export_dir, manifest, settings) | store


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
