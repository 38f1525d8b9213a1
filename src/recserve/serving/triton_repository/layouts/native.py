"""The native layout: ``recommender_native``, the export's native TorchScript or ONNX graph on a native backend
(recserve's own or Triton's, ``native_configs.native_backend``). On recserve's backend it takes business rules
(the graph's ``ruled`` method): the rules stored by name, compiled here into the rule bank the backend reads
(``RULE_BANK_FILE``), the items a request lists, and with a store the items hidden catalogue-wide."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np

from recserve.artifacts import served
from recserve.artifacts.catalogue import read_catalogue
from recserve.artifacts.export_manifest import ExportManifest
from recserve.artifacts.served import Parameter
from recserve.constants import NATIVE_MODEL, NATIVE_ONNX_FILE, NATIVE_PAD_ID, RULE_BANK_FILE
from recserve.errors import ServingError
from recserve.files import replaced_on_success
from recserve.serving.triton_repository.layouts.common import (
    Layout,
    batched_config,
    store_record,
    stored_rules,
    write_config,
)
from recserve.serving.triton_repository.native_configs import (
    NATIVE_PLATFORMS,
    RECSERVE_BACKEND,
    backend_parameters,
    check_native,
    native_backend,
)
from recserve.serving.triton_repository.repository_settings import RepositorySettings


def history_length(manifest: ExportManifest) -> int:
    """The native graph's width: the history items of the model's window (the last token is its own)."""
    return manifest.window - 1


def ruled(manifest: ExportManifest, settings: RepositorySettings) -> bool:
    """Whether the native model takes business rules: recserve's backend, running a graph with ``ruled``."""
    on_recserve = native_backend(manifest, settings.native_runtime, settings.device)[0] == RECSERVE_BACKEND
    return manifest.native_rules and on_recserve


def contract(manifest: ExportManifest, settings: RepositorySettings) -> served.Contract:
    onnx = manifest.native_model == NATIVE_ONNX_FILE
    return served.native(history_length(manifest), onnx=onnx, ruled=ruled(manifest, settings))


def write_rule_bank(target: Path, export_dir: Path, manifest: ExportManifest, settings: RepositorySettings) -> None:
    """The rule bank recserve's backend reads (``rule_bank.RuleBank``): the catalogue's IDs in index order, the
    stored rules' names, and their masks by vocabulary index (row 0 every item; padding and the mask token
    never)."""
    from recserve.artifacts.rule_bank import save_rule_bank  # torch, only where one is written

    named = stored_rules(export_dir, manifest, settings)
    masks = np.zeros((1 + len(named), manifest.num_items + 2), dtype=bool)
    masks[0, 1:-1] = True
    for row, mask in enumerate(named.values(), start=1):
        masks[row, 1:-1] = mask
    save_rule_bank(target, read_catalogue(export_dir).astype(np.int64), list(named), masks)


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
    rules = ruled(manifest, settings)
    parameters = {
        **backend_parameters(backend[0] or backend[1], settings.device),
        **shape_parameters(manifest),
        **({Parameter.RULES_FILE: RULE_BANK_FILE} if rules else {}),
        **(extra or {}),
    }
    if rules and settings.session_store and Parameter.SESSION_STORE not in parameters:  # hidden items, read there
        parameters[Parameter.HIDDEN_STORE] = json.dumps(store_record(settings), sort_keys=True)
    if settings.step_summary_s:
        if backend[0] != RECSERVE_BACKEND:
            raise ServingError(
                f"step_summary_s={settings.step_summary_s}: the batches' steps are logged by recserve's backend; "
                f"this native model runs on {backend[0] or backend[1]} (--native-runtime recserve chooses it)"
            )
        parameters[Parameter.STEP_SUMMARY_S] = str(settings.step_summary_s)
    instances = dataclasses.replace(settings, instance_count=settings.native_instances)
    write_config(repo / name, batched_config(name, model_contract, instances, parameters, backend))
    target = NATIVE_PLATFORMS[str(manifest.native_model)][1]
    with replaced_on_success(repo / name / str(version)) as staging:
        shutil.copyfile(Path(export_dir) / str(manifest.native_model), staging / target)
        for data in Path(export_dir).glob(f"{manifest.native_model}.data"):  # ONNX weights kept outside
            shutil.copyfile(data, staging / data.name)
        if rules:
            write_rule_bank(staging / RULE_BANK_FILE, export_dir, manifest, settings)


def shape_parameters(manifest: ExportManifest) -> dict[str, str]:
    """The padding ID and the largest k a native model's config gives its clients (``served.NativeShape``)."""
    return {Parameter.PADDING_ID: str(NATIVE_PAD_ID), Parameter.MAX_K: str(min(manifest.max_k, manifest.num_items))}


def write_graphless_model(
    repo: Path,
    name: str,
    contract: served.Contract,
    settings: RepositorySettings,
    parameters: dict[str, str],
    version: int,
    note: str,
) -> None:
    """A model of recserve's backend that runs no graph (the floor, events alone): its config, ``settings``'
    native instances, and a version folder that holds only ``note`` (the backend loads nothing from it)."""
    instances = dataclasses.replace(settings, instance_count=settings.native_instances)
    write_config(repo / name, batched_config(name, contract, instances, parameters, (RECSERVE_BACKEND, "")))
    with replaced_on_success(repo / name / str(version)) as staging:
        (staging / "README").write_text(note + "\n")


def check(export_dir: Path, manifest: ExportManifest, settings: RepositorySettings) -> None:
    check_native(export_dir, manifest, settings.device)
    if ruled(manifest, settings):  # its stored rules fit the export, before anything is written
        stored_rules(export_dir, manifest, settings)


def write(repo: Path, export_dir: Path, manifest: ExportManifest, settings: RepositorySettings, version: int) -> None:
    write_native_model(repo, NATIVE_MODEL, export_dir, manifest, settings, version, contract(manifest, settings))


def describe(manifest: ExportManifest, settings: RepositorySettings) -> list[dict]:
    return [
        {
            "name": NATIVE_MODEL,
            "backend": "".join(native_backend(manifest, settings.native_runtime, settings.device)),
            "precision": manifest.precision,
            "validation_max_diff": manifest.validation.get("native", {}).get("max_score_diff"),
            "rules": ruled(manifest, settings),
        }
    ]


LAYOUT = Layout(served.LAYOUTS["native"], ("native", None), check, write, describe)
