"""The seed layout: the PoC's layout and names, python pre- and postprocessing around the TorchScript model
step on the PyTorch backend (``pytorch_libtorch``), at batch size 1, as one ensemble."""

from __future__ import annotations

import shutil
from pathlib import Path

from recserve.artifacts import served
from recserve.artifacts.catalogue import copy_catalogue
from recserve.artifacts.export_manifest import ExportManifest
from recserve.artifacts.served import Parameter, TensorSpec
from recserve.constants import (
    SEED_ENSEMBLE,
    SEED_INDICES,
    SEED_INPUT,
    SEED_K,
    SEED_MODEL,
    SEED_MODEL_INPUT,
    SEED_OUTPUT_IDS,
    SEED_OUTPUT_SCORES,
    SEED_POSTPROCESSING,
    SEED_PREPROCESSING,
    SEED_TOKENS,
    SEED_TOP_SCORES,
)
from recserve.files import replaced_on_success
from recserve.serving.triton_repository.layouts.common import Layout, id_type, instances, python_model, write_config
from recserve.serving.triton_repository.native_configs import backend_parameters, check_seed
from recserve.serving.triton_repository.pbtxt import EnsembleStep, TritonModelConfig
from recserve.serving.triton_repository.repository_settings import RepositorySettings


def _steps(manifest: ExportManifest, settings: RepositorySettings) -> tuple[TritonModelConfig, ...]:
    """The ensemble's three steps: preprocessing, the model step, postprocessing."""
    contract = served.seed(id_type(manifest))
    groups = instances(settings)
    # the history keeps its window - 1 most recent items, then the mask token: at most 40 tokens
    pre = TritonModelConfig(
        SEED_PREPROCESSING,
        contract.inputs,
        (TensorSpec(SEED_TOKENS, "INT64", (1, -1)),),
        instance_groups=groups,
        parameters={Parameter.WINDOW: str(manifest.window)},
    )
    model = TritonModelConfig(  # the PoC's TorchScript model on Triton's PyTorch backend
        SEED_MODEL,
        (TensorSpec(SEED_MODEL_INPUT, "INT64", (-1,)),),
        (TensorSpec(SEED_OUTPUT_IDS, "INT64", (SEED_K,)), TensorSpec(SEED_OUTPUT_SCORES, "FP32", (SEED_K,))),
        platform="pytorch_libtorch",
        max_batch_size=1,
        instance_groups=groups,
        parameters=backend_parameters("pytorch_libtorch", settings.device),
    )
    post = TritonModelConfig(
        SEED_POSTPROCESSING,
        (TensorSpec(SEED_INDICES, "INT64", (1, SEED_K)), TensorSpec(SEED_TOP_SCORES, "FP32", (1, SEED_K))),
        contract.outputs,
        instance_groups=groups,
    )
    return pre, model, post


def _ensemble(manifest: ExportManifest) -> TritonModelConfig:
    contract = served.seed(id_type(manifest))
    return TritonModelConfig(
        SEED_ENSEMBLE,
        contract.inputs,
        contract.outputs,
        platform="ensemble",
        ensemble_steps=(
            EnsembleStep(SEED_PREPROCESSING, {SEED_INPUT: SEED_INPUT}, {SEED_TOKENS: SEED_TOKENS}),
            EnsembleStep(
                SEED_MODEL,
                {SEED_MODEL_INPUT: SEED_TOKENS},
                {SEED_OUTPUT_IDS: SEED_INDICES, SEED_OUTPUT_SCORES: SEED_TOP_SCORES},
            ),
            EnsembleStep(
                SEED_POSTPROCESSING,
                {SEED_INDICES: SEED_INDICES, SEED_TOP_SCORES: SEED_TOP_SCORES},
                {SEED_OUTPUT_IDS: SEED_OUTPUT_IDS, SEED_OUTPUT_SCORES: SEED_OUTPUT_SCORES},
            ),
        ),
    )


def check(export_dir: Path, manifest: ExportManifest, settings: RepositorySettings) -> None:
    check_seed(export_dir, manifest, settings.device)


def write(repo: Path, export_dir: Path, manifest: ExportManifest, settings: RepositorySettings, version: int) -> None:
    pre, model, post = _steps(manifest, settings)
    for config, source in ((pre, "seed_preprocessing"), (post, "seed_postprocessing")):
        write_config(repo / config.name, config)
        python_model(source, repo / config.name / str(version))
        copy_catalogue(export_dir, repo / config.name / str(version))
    write_config(repo / SEED_MODEL, model)
    with replaced_on_success(repo / SEED_MODEL / str(version)) as staging:
        shutil.copyfile(Path(export_dir) / str(manifest.seed_model), staging / "model.pt")
    (repo / SEED_ENSEMBLE / str(version)).mkdir(parents=True, exist_ok=True)
    write_config(repo / SEED_ENSEMBLE, _ensemble(manifest))


def describe(manifest: ExportManifest, settings: RepositorySettings) -> list[dict]:
    return [{"name": name} for name in served.LAYOUTS["seed"].models]


# the PoC's model step: TorchScript, full precision
LAYOUT = Layout(served.LAYOUTS["seed"], ("torchscript", "fp32"), check, write, describe)
