"""The export folder's manifest (``export.json``): what was exported, how, and how it validated.

One writer (``recserve.export.exporter.export_run``) and one reader (``ExportManifest.read``); every stage
after export (the predictor, the Triton repository, the SageMaker package) reads an export through it.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recserve.constants import EXPORT_MANIFEST
from recserve.errors import ExportError

EXPORT_FORMAT_VERSION = 1
# what a backend's save may add
BACKEND_FIELDS = {"fixed_length", "batch_buckets", "native_model", "native_rules", "native_absent", "seed_model"}


@dataclass(frozen=True)
class ExportManifest:
    model: str  # bert4rec, sasrec or multvae
    backend: str  # one of recserve.export.backends.BACKENDS
    precision: str  # fp32, fp16, bf16 or int8
    device: str  # cpu or cuda: where it was built and validated
    max_k: int  # the largest k the graph answers
    window: int  # the model's input window (history items plus the mask or reserved token)
    num_items: int
    item_id_type: str  # int64 or string
    id_mapping: str  # "graph": the graph maps IDs itself; "predictor": the predictor maps them first
    run: str  # the training run it came from
    portable: bool  # loads on any device; False: compiled for ``device`` and served there only
    fixed_length: int | None = None  # backends compiled for one padded history length
    batch_buckets: tuple[int, ...] = ()  # cudagraph: the batch sizes captured
    native_model: str | None = None  # the native layout's model file (torchscript, onnx), if the catalogue allows
    native_rules: bool = False  # the native model also answers under business rules (its ``ruled`` method)
    native_absent: str | None = None  # a torchscript or onnx export without a native model: why the catalogue
    # does not allow one
    seed_model: str | None = None  # the seed layout's TorchScript model step (torchscript)
    build_s: float | None = None
    explore_new: float = 0.0  # the answer's share reserved for new items (serving_graph.explored_top)
    validation: Mapping[str, Any] = field(default_factory=dict)  # parity (and quality) against eager fp32
    format_version: int = EXPORT_FORMAT_VERSION

    def with_backend_fields(self, added: Mapping[str, Any]) -> ExportManifest:
        """This manifest with the fields a backend's ``save`` returned (``BACKEND_FIELDS``)."""
        unknown = set(added) - BACKEND_FIELDS
        if unknown:
            raise ExportError(f"backend {self.backend} returned unknown manifest fields: {', '.join(sorted(unknown))}")
        fields: dict[str, Any] = {k: tuple(v) if k == "batch_buckets" else v for k, v in added.items()}
        return dataclasses.replace(self, **fields)

    def built_for(self, device: str) -> bool:
        """Whether what this export compiled or traced on its device runs on serving device ``device``
        (``cpu`` or ``gpu``)."""
        return (self.device != "cpu") == (device == "gpu")

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["batch_buckets"] = list(self.batch_buckets)
        data["validation"] = dict(self.validation)
        return data

    def write(self, export_dir: Path) -> None:
        (Path(export_dir) / EXPORT_MANIFEST).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def read(cls, export_dir: Path) -> ExportManifest:
        """The manifest of ``export_dir``.

        Raises:
            ExportError: no manifest (not an export folder), unreadable JSON, another format version, or
                fields missing.
        """
        path = Path(export_dir) / EXPORT_MANIFEST
        if not path.is_file():
            raise ExportError(f"{export_dir}: no {EXPORT_MANIFEST}; pass a folder written by `recserve export`")
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise ExportError(f"{path}: unreadable ({err})") from err
        if data.get("format_version") != EXPORT_FORMAT_VERSION:
            raise ExportError(
                f"{path}: format version {data.get('format_version')}, this recserve reads "
                f"{EXPORT_FORMAT_VERSION}; export the run again"
            )
        names = {f.name for f in dataclasses.fields(cls)}
        missing = [
            f.name
            for f in dataclasses.fields(cls)
            if f.name not in data and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        ]
        if missing:
            raise ExportError(f"{path}: missing {', '.join(missing)}; export the run again")
        known = {k: v for k, v in data.items() if k in names}
        known["batch_buckets"] = tuple(known.get("batch_buckets") or ())
        return cls(**known)
