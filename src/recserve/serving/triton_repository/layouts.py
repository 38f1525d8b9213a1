"""``recserve repo``: writes a Triton model repository (fused, native, seed and echo layouts) from an export.

The repository serves the export that ``recserve export`` validated: the fused model's version folder holds a
copy of it; the native layout and the seed layout's model step serve the TorchScript or ONNX files the export
wrote and checked. ``recserve.pipeline.repository_from_run`` is the shortcut that exports a run first.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from recserve.catalogue import TRITON_DTYPES, copy_catalogue
from recserve.constants import (
    ECHO_MODEL,
    FUSED_MODEL,
    INPUT_EXCLUDE_SEEN,
    INPUT_ITEM_IDS,
    INPUT_K,
    INPUT_SESSION_ID,
    NATIVE_MODEL,
    NATIVE_PAD_ID,
    NATIVE_SESSION_MODEL,
    OUTPUT_HISTORY_LENGTH,
    OUTPUT_HISTORY_SOURCE,
    OUTPUT_ITEM_IDS,
    OUTPUT_SCORES,
    OUTPUT_UNKNOWN_IDS,
    SEED_ENSEMBLE,
    SEED_HISTORY_LENGTH,
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
    SESSION_LAYOUTS,
    SESSION_MODEL,
)
from recserve.errors import ConfigError, ServingError
from recserve.export.manifest import ExportManifest
from recserve.files import replaced_on_success
from recserve.serving.triton_repository.native_configs import (
    NATIVE_PLATFORMS,
    NATIVE_RUNTIMES,
    RECSERVE_BACKEND,
    backend_parameters,
    check_native,
    check_native_session,
    check_seed,
    native_backend,
    native_contract,
    native_session_contract,
    require_built_for,
)
from recserve.serving.triton_repository.pbtxt import (
    DynamicBatching,
    EnsembleStep,
    InstanceGroup,
    QueuePolicy,
    TensorSpec,
    TritonModelConfig,
    to_pbtxt,
)
from recserve.serving.triton_repository.repository_settings import RepositorySettings, record_layouts

log = logging.getLogger(__name__)

EXPORT_SUBDIR = "export"


def _instances(settings: RepositorySettings) -> tuple[InstanceGroup, ...]:
    if settings.device == "gpu":
        return (InstanceGroup(count=settings.instance_count, kind="KIND_GPU", gpus=settings.gpus),)
    return (InstanceGroup(count=settings.instance_count, kind="KIND_CPU"),)


def _contract(id_type: str, unknown_output: bool) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    """The ``recommender`` contract: ragged item IDs, optional k and exclude_seen; IDs and scores out
    (and the count of unknown IDs dropped, where the model counts them)."""
    inputs = (
        TensorSpec(INPUT_ITEM_IDS, id_type, (-1,), allow_ragged_batch=True),
        TensorSpec(INPUT_K, "INT32", (1,), optional=True),
        TensorSpec(INPUT_EXCLUDE_SEEN, "BOOL", (1,), optional=True),
    )
    outputs: tuple[TensorSpec, ...] = (
        TensorSpec(OUTPUT_ITEM_IDS, id_type, (-1,)),
        TensorSpec(OUTPUT_SCORES, "FP32", (-1,)),
    )
    if unknown_output:
        outputs += (TensorSpec(OUTPUT_UNKNOWN_IDS, "INT32", (1,)),)
    return inputs, outputs


def _batched_config(
    name: str, id_type: str, settings: RepositorySettings, parameters: dict, manifest: ExportManifest | None = None
) -> TritonModelConfig:
    """A dynamically batched model of the ``recommender`` contract: a python model, or (``manifest`` given)
    the export's native model on its backend."""
    backend = "python"
    if manifest is None:
        inputs, outputs = _contract(id_type, unknown_output=name == FUSED_MODEL)
        platform = ""
    else:
        inputs, outputs = native_contract(manifest)
        backend, platform = native_backend(manifest, settings.native_runtime, settings.device)
    policy = None
    if settings.max_queue_size or settings.queue_timeout_microseconds:
        policy = QueuePolicy(settings.max_queue_size, settings.queue_timeout_microseconds)
    return TritonModelConfig(
        name=name,
        inputs=inputs,
        outputs=outputs,
        backend=backend,
        platform=platform,
        max_batch_size=settings.max_batch_size,
        dynamic_batching=DynamicBatching(settings.preferred_batch_sizes, settings.queue_delay_microseconds, policy),
        instance_groups=_instances(settings),
        version_policy_latest=settings.versions_served,
        response_cache=settings.response_cache,
        parameters=parameters,
    )


def _python_model(source: str, target_dir: Path) -> None:
    target_dir.mkdir(parents=True, exist_ok=True)
    text = resources.files("recserve.serving.triton_repository.python_models").joinpath(f"{source}.py").read_text()
    (target_dir / "model.py").write_text(text)


def _write_config(model_dir: Path, config: TritonModelConfig) -> None:
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.pbtxt").write_text(to_pbtxt(config))


def _id_type(manifest: ExportManifest) -> str:
    """The served item_ids' data type: the catalogue's ID type, as the export's manifest records it."""
    return TRITON_DTYPES[manifest.item_id_type]


def write_fused(
    repo: Path, export_dir: Path, manifest: ExportManifest, settings: RepositorySettings, version: int = 1
) -> None:
    """The ``recommender`` model: the export (copied whole) behind a batched python model."""
    model_dir = repo / FUSED_MODEL
    # the version folder appears whole (a polling server must never load a half-written one): built
    # under a hidden name Triton ignores, then renamed
    config = _batched_config(FUSED_MODEL, _id_type(manifest), settings, {"export_dir": EXPORT_SUBDIR})
    if not (model_dir / "config.pbtxt").exists() or (model_dir / "config.pbtxt").read_text() != to_pbtxt(config):
        _write_config(model_dir, config)
    with replaced_on_success(model_dir / str(version)) as staging:
        shutil.copytree(export_dir, staging / EXPORT_SUBDIR, ignore=shutil.ignore_patterns(".*"))
        _python_model("fused", staging)


def _store_record(settings: RepositorySettings) -> dict:
    """What the session model is told of its store (``store_settings.read_store_record``): never a password."""
    from recserve.sessions.store_settings import read_store_record

    if not settings.session_store:
        raise ServingError("the session layout needs a session store: --session-store FOLDER_OR_JSON")
    try:
        return read_store_record(settings.session_store)
    except ConfigError as err:
        raise ServingError(f"--session-store: {err}") from err


def _check_session(export_dir: Path, manifest: ExportManifest, settings: RepositorySettings) -> None:
    _store_record(settings)


def write_session(
    repo: Path, export_dir: Path, manifest: ExportManifest, settings: RepositorySettings, version: int = 1
) -> None:
    """The ``recommender_session`` model: the export (copied whole) behind a batched python model that reads
    each request's session from the store (``settings.session_store``; its address, user, prefix and
    password file, never the password)."""
    id_type = _id_type(manifest)
    config = _batched_config(
        SESSION_MODEL,
        id_type,
        settings,
        {"export_dir": EXPORT_SUBDIR, "session_store": json.dumps(_store_record(settings), sort_keys=True)},
    )
    config = dataclasses.replace(config, inputs=_session_contract(id_type)[0], outputs=_session_contract(id_type)[1])
    _write_config(repo / SESSION_MODEL, config)
    with replaced_on_success(repo / SESSION_MODEL / str(version)) as staging:
        shutil.copytree(export_dir, staging / EXPORT_SUBDIR, ignore=shutil.ignore_patterns(".*"))
        _python_model("session", staging)


def _session_contract(id_type: str) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    """The ``recommender`` contract by session: a session ID a row, the items to append first optional."""
    inputs, outputs = _contract(id_type, unknown_output=True)
    item_ids = dataclasses.replace(inputs[0], optional=True)
    inputs = (TensorSpec(INPUT_SESSION_ID, "BYTES", (1,)), item_ids, *inputs[1:])
    outputs += (TensorSpec(OUTPUT_HISTORY_SOURCE, "INT32", (1,)), TensorSpec(OUTPUT_HISTORY_LENGTH, "INT32", (1,)))
    return inputs, outputs


def write_native(
    repo: Path, export_dir: Path, manifest: ExportManifest, settings: RepositorySettings, version: int = 1
) -> None:
    """The ``recommender_native`` model: the export's native TorchScript or ONNX graph on a native backend
    (recserve's own or Triton's, ``native_backend``)."""
    _write_native_model(repo, NATIVE_MODEL, export_dir, manifest, settings, version)


def write_native_session(
    repo: Path, export_dir: Path, manifest: ExportManifest, settings: RepositorySettings, version: int = 1
) -> None:
    """The ``recommender_native_session`` model: the native TorchScript graph on recserve's own backend,
    which reads each request's session from the store (``settings.session_store``) and scores it in the
    same call (``native/triton-backend``)."""
    store = {"session_store": json.dumps(_store_record(settings), sort_keys=True)}
    session = dataclasses.replace(settings, native_runtime=RECSERVE_BACKEND)
    contract = native_session_contract(manifest)
    parameters = store | {"history_length": str(native_contract(manifest)[0][0].dims[0])}  # the graph's width
    _write_native_model(repo, NATIVE_SESSION_MODEL, export_dir, manifest, session, version, parameters, contract)


def _write_native_model(
    repo: Path,
    name: str,
    export_dir: Path,
    manifest: ExportManifest,
    settings: RepositorySettings,
    version: int,
    extra: dict | None = None,
    contract: tuple | None = None,
) -> None:
    target = NATIVE_PLATFORMS[str(manifest.native_model)][1]
    backend, platform = native_backend(manifest, settings.native_runtime, settings.device)
    parameters = {
        **backend_parameters(backend or platform, settings.device),
        "padding_id": str(NATIVE_PAD_ID),
        "max_k": str(min(manifest.max_k, manifest.num_items)),
        **(extra or {}),
    }
    instances = dataclasses.replace(settings, instance_count=settings.native_instances)
    config = _batched_config(name, "INT64", instances, parameters, manifest)
    if contract is not None:
        config = dataclasses.replace(config, inputs=contract[0], outputs=contract[1])
    _write_config(repo / name, config)
    with replaced_on_success(repo / name / str(version)) as staging:
        shutil.copyfile(Path(export_dir) / str(manifest.native_model), staging / target)
        for data in Path(export_dir).glob(f"{manifest.native_model}.data"):  # ONNX weights kept outside
            shutil.copyfile(data, staging / data.name)


def write_echo(
    repo: Path, export_dir: Path, manifest: ExportManifest, settings: RepositorySettings, version: int = 1
) -> None:
    """The ``echo`` model: the same contract and batching, a fixed answer, no compute."""
    id_type = _id_type(manifest)
    parameters = {"max_k": str(manifest.max_k), "item_id_type": manifest.item_id_type}
    _python_model("echo", repo / ECHO_MODEL / str(version))
    _write_config(repo / ECHO_MODEL, _batched_config(ECHO_MODEL, id_type, settings, parameters))


def write_seed(
    repo: Path, export_dir: Path, manifest: ExportManifest, settings: RepositorySettings, version: int = 1
) -> None:
    """The PoC's layout and names: python pre- and postprocessing around the TorchScript model step on the
    PyTorch backend (``pytorch_libtorch``), at batch size 1."""
    id_type = _id_type(manifest)
    window = manifest.window
    instances = _instances(settings)
    # the history keeps its window - 1 most recent items, then the mask token: at most 40 tokens
    pre = TritonModelConfig(
        SEED_PREPROCESSING,
        (TensorSpec(SEED_INPUT, id_type, (SEED_HISTORY_LENGTH,)),),
        (TensorSpec(SEED_TOKENS, "INT64", (1, -1)),),
        instance_groups=instances,
        parameters={"window": str(window)},
    )
    model = TritonModelConfig(  # the PoC's TorchScript model on Triton's PyTorch backend
        SEED_MODEL,
        (TensorSpec(SEED_MODEL_INPUT, "INT64", (-1,)),),
        (TensorSpec(SEED_OUTPUT_IDS, "INT64", (SEED_K,)), TensorSpec(SEED_OUTPUT_SCORES, "FP32", (SEED_K,))),
        platform="pytorch_libtorch",
        max_batch_size=1,
        instance_groups=instances,
        parameters=backend_parameters("pytorch_libtorch", settings.device),
    )
    post = TritonModelConfig(
        SEED_POSTPROCESSING,
        (TensorSpec(SEED_INDICES, "INT64", (1, SEED_K)), TensorSpec(SEED_TOP_SCORES, "FP32", (1, SEED_K))),
        (TensorSpec(SEED_OUTPUT_IDS, id_type, (SEED_K,)), TensorSpec(SEED_OUTPUT_SCORES, "FP32", (SEED_K,))),
        instance_groups=instances,
    )
    ensemble = TritonModelConfig(
        SEED_ENSEMBLE,
        (TensorSpec(SEED_INPUT, id_type, (SEED_HISTORY_LENGTH,)),),
        (TensorSpec(SEED_OUTPUT_IDS, id_type, (SEED_K,)), TensorSpec(SEED_OUTPUT_SCORES, "FP32", (SEED_K,))),
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
    for config, source in ((pre, "seed_preprocessing"), (post, "seed_postprocessing")):
        _write_config(repo / config.name, config)
        _python_model(source, repo / config.name / str(version))
        copy_catalogue(export_dir, repo / config.name / str(version))
    _write_config(repo / SEED_MODEL, model)
    with replaced_on_success(repo / SEED_MODEL / str(version)) as staging:
        shutil.copyfile(Path(export_dir) / str(manifest.seed_model), staging / "model.pt")
    (repo / SEED_ENSEMBLE / str(version)).mkdir(parents=True, exist_ok=True)
    _write_config(repo / SEED_ENSEMBLE, ensemble)


def _check_fused(export_dir: Path, manifest: ExportManifest, settings: RepositorySettings) -> None:
    if not manifest.portable:
        require_built_for(manifest, settings.device, f"the {manifest.backend} export was built for")


def _check_native(export_dir: Path, manifest: ExportManifest, settings: RepositorySettings) -> None:
    check_native(export_dir, manifest, settings.device)
    native_backend(manifest, settings.native_runtime, settings.device)


def _check_native_session(export_dir: Path, manifest: ExportManifest, settings: RepositorySettings) -> None:
    check_native_session(export_dir, manifest, settings.native_runtime, settings.device)
    _check_session(export_dir, manifest, settings)


def _describe_fused(manifest: ExportManifest, settings: RepositorySettings) -> list[dict]:
    return [
        {
            "name": FUSED_MODEL,
            "backend": manifest.backend,
            "precision": manifest.precision,
            "validation_max_diff": manifest.validation.get("max_score_diff"),
        }
    ]


def _describe_native(manifest: ExportManifest, settings: RepositorySettings) -> list[dict]:
    return [
        {
            "name": NATIVE_MODEL,
            "backend": "".join(native_backend(manifest, settings.native_runtime, settings.device)),
            "precision": manifest.precision,
            "validation_max_diff": manifest.validation.get("native", {}).get("max_score_diff"),
        }
    ]


@dataclass(frozen=True)
class Layout:
    """One layout of a repository: the models it writes (the one clients call first), the export of a run
    it serves, its checks (all run before anything is written) and its writer."""

    models: tuple[str, ...]
    # (backend, precision) of the export it serves from a run: None keeps what was asked for; "native": the
    # native graph's backend for the run and device (``pipeline.repository_from_run`` chooses)
    export: tuple[str | None, str | None]
    check: Callable[[Path, ExportManifest, RepositorySettings], None]
    write: Callable[[Path, Path, ExportManifest, RepositorySettings, int], None]
    describe: Callable[[ExportManifest, RepositorySettings], list[dict]]

    @property
    def entry(self) -> str:
        return self.models[0]


def _nothing(*_) -> None:
    return None


LAYOUTS: dict[str, Layout] = {
    "fused": Layout((FUSED_MODEL,), (None, None), _check_fused, write_fused, _describe_fused),
    "native": Layout((NATIVE_MODEL,), ("native", None), _check_native, write_native, _describe_native),
    "seed": Layout(
        (SEED_ENSEMBLE, SEED_PREPROCESSING, SEED_MODEL, SEED_POSTPROCESSING),
        ("torchscript", "fp32"),  # the PoC's model step: TorchScript, full precision
        lambda export_dir, manifest, settings: check_seed(export_dir, manifest, settings.device),
        write_seed,
        lambda *_: [{"name": n} for n in LAYOUTS["seed"].models],
    ),
    "session": Layout(
        (SESSION_MODEL,),
        (None, None),
        _check_session,
        write_session,
        lambda manifest, settings: [{"name": SESSION_MODEL, "store": _store_record(settings)["url"]}],
    ),
    "native_session": Layout(
        (NATIVE_SESSION_MODEL,),
        ("torchscript", None),  # recserve's backend runs the TorchScript native graph
        _check_native_session,
        write_native_session,
        lambda manifest, settings: [
            {"name": NATIVE_SESSION_MODEL, "backend": RECSERVE_BACKEND, "store": _store_record(settings)["url"]}
        ],
    ),
    "echo": Layout(
        (ECHO_MODEL,), (None, None), _nothing, write_echo, lambda manifest, settings: [{"name": ECHO_MODEL}]
    ),
}


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
    export = {"backend": manifest.backend, "precision": manifest.precision, "device": manifest.device}
    store = _store_record(settings) if set(layouts) & set(SESSION_LAYOUTS) else None
    record_layouts(repo, layouts, export, manifest.run, store)
    return summary


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
