"""Stage shortcuts: a repository or a SageMaker package from either source, an export as it is or a
training run through a validated export.

``recserve repo`` and ``recserve sagemaker package`` use these; a run is exported with the export stage's own
entry point (``recserve.export.exporter.export_run``, parity-checked) into a temporary folder, then handed to
the serving stage, which never exports anything itself. From an export nothing of torch is imported.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from recserve.constants import DEFAULT_MAX_K
from recserve.devices import torch_device
from recserve.serving.triton_repository.layouts import LAYOUTS, check_request, write_repository
from recserve.serving.triton_repository.repository_settings import RepositorySettings

NATIVE_BACKENDS = ("torchscript", "onnx")  # the export backends that write a native model


def repository(
    repo: Path,
    layouts: tuple[str, ...],
    settings: RepositorySettings,
    version: int = 1,
    *,
    export: Path | None = None,
    run: Path | None = None,
    backend: str | None = None,
    precision: str = "fp32",
    max_k: int = DEFAULT_MAX_K,
    explore_new: float = 0.0,
) -> dict:
    """The layouts written into ``repo`` from an export as it is, or from a run exported first
    (``repository_from_run``, with ``backend``, ``precision``, ``max_k`` and ``explore_new``); ``recserve
    repo``'s two sources."""
    if export is not None:
        return write_repository(export, repo, layouts, settings, version)
    if run is None:
        raise ValueError("repository: give an export or a run")
    return repository_from_run(run, repo, layouts, settings, backend, precision, version, max_k, explore_new)


def repository_from_run(
    run_dir: Path,
    repo: Path,
    layouts: tuple[str, ...] = ("fused",),
    settings: RepositorySettings | None = None,
    backend: str | None = None,
    precision: str = "fp32",
    version: int = 1,
    max_k: int = DEFAULT_MAX_K,
    explore_new: float = 0.0,
) -> dict:
    """``write_repository`` from a run: the fused and echo layouts from one export of ``backend`` (default:
    the device's, ``recserve.export.backends.DEFAULT_BACKEND``), the native layout from ``backend`` where it
    is torchscript or onnx, else from onnx on CPUs (dense integer IDs) and torchscript on GPUs, and the seed
    layout's model step from a torchscript fp32 export."""
    from recserve.export.backends import default_backend
    from recserve.export.exporter import export_run

    settings = settings or RepositorySettings()
    check_request(layouts, settings, version)  # before the export, which takes a while
    device = torch_device(settings.device)
    chosen = backend or default_backend(device)
    groups: dict[tuple[str, str], tuple[str, ...]] = {}
    for layout in layouts:  # the export each layout serves (the table's ``export``), one export per kind
        wanted, wanted_precision = LAYOUTS[layout].export
        if wanted == "native":
            wanted = backend if backend in NATIVE_BACKENDS else _native_backend(run_dir, device)
        key = (wanted or chosen, wanted_precision or precision)
        groups[key] = groups.get(key, ()) + (layout,)
    summary: dict = {"models": []}
    with tempfile.TemporaryDirectory(prefix="recserve-export-") as tmp:
        for (group_backend, group_precision), group in groups.items():
            export_dir = Path(tmp) / f"{group_backend}-{group_precision}"
            export_run(
                run_dir, group_backend, group_precision, export_dir, device=device, max_k=max_k, explore_new=explore_new
            )
            written = write_repository(export_dir, repo, group, settings, version)
            summary = written | {"models": summary["models"] + written["models"]}
    return summary


def write_next_version(repo: Path, run: Path) -> int:
    """The repository's next version of every model from ``run``, as its record says it was written (layouts,
    each layout's export backend and precision, its settings); on a failure the version's folders written so
    far are removed, so that no model holds a version the others lack.

    Returns:
        The version written.
    """
    from recserve.artifacts.repository_record import read_repository_info
    from recserve.serving.promotion import remove_version, repository_settings, serving_version

    info = read_repository_info(repo)
    settings = repository_settings(repo, info)
    version = serving_version(repo) + 1
    groups: dict[tuple[str, str, int, float], tuple[str, ...]] = {}
    for layout, export in info["layouts"].items():  # each layout from the export it was written from
        shape = (int(export.get("max_k", DEFAULT_MAX_K)), float(export.get("explore_new", 0.0)))
        key = (export["backend"], export["precision"], *shape)
        groups[key] = groups.get(key, ()) + (layout,)
    try:
        for (backend, precision, max_k, explore_new), group in groups.items():
            repository_from_run(run, repo, group, settings, backend, precision, version, max_k, explore_new)
    except BaseException:
        remove_version(repo, version)
        raise
    return version


def _native_backend(run_dir: Path, device: str) -> str:
    """onnx on CPUs where the IDs allow it (the faster of the two there, docs/benchmarks.md), else torchscript."""
    from recserve.artifacts.catalogue import has_catalogue, read_catalogue
    from recserve.data.vocab import use_lookup_table

    dense = has_catalogue(run_dir) and use_lookup_table(read_catalogue(run_dir))
    return "onnx" if device == "cpu" and dense else "torchscript"


def package(
    out: Path,
    runtime: str,
    *,
    export: Path | None = None,
    run: Path | None = None,
    device: str = "cpu",
    instances: int | None = None,
) -> dict:
    """The SageMaker package for ``runtime`` from an export as it is (made for its own device), or from a run
    exported first for ``device`` (``package_from_run``); ``recserve sagemaker package``'s two sources."""
    torch_device(device)  # an unknown device word is refused whichever the source
    if export is not None:
        from recserve.serving.sagemaker.package import package as write_package

        return write_package(export, runtime, out, instances)
    if run is None:
        raise ValueError("package: give an export or a run")
    return package_from_run(run, runtime, out, device=device, instances=instances)


def package_from_run(
    run_dir: Path,
    runtime: str,
    out: Path,
    max_k: int = DEFAULT_MAX_K,
    device: str = "cpu",
    instances: int | None = None,
) -> dict:
    """``recserve.serving.sagemaker.package.package`` from a run, through the export each runtime serves
    (``RUNTIME_EXPORTS``); a triton package's export is made for ``device`` (cpu or gpu: a GPU package is
    traced on this machine's GPU); string IDs for the triton runtime are refused before anything is exported."""
    from recserve.artifacts.catalogue import has_catalogue, id_type_of, read_catalogue
    from recserve.errors import ServingError
    from recserve.export.exporter import export_run
    from recserve.serving.sagemaker.package import NO_NATIVE_FOR_TRITON, RUNTIME_EXPORTS, check_runtime, package

    check_runtime(runtime, out)
    backend, precision = RUNTIME_EXPORTS[runtime]
    if runtime == "triton" and has_catalogue(run_dir) and id_type_of(read_catalogue(run_dir)) == "string":
        raise ServingError(NO_NATIVE_FOR_TRITON.format(reason="string IDs"))
    # the pytorch runtime's handler chooses the endpoint's device itself: its eager export is made anywhere
    export_device = torch_device(device) if runtime == "triton" else "cpu"
    with tempfile.TemporaryDirectory(prefix="recserve-export-") as tmp:
        export_run(run_dir, backend, precision, Path(tmp) / "export", device=export_device, max_k=max_k)
        return package(Path(tmp) / "export", runtime, out, instances)
