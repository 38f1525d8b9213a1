"""The served models' contracts, written once for the repository's writer and for every client: each layout's
models (the one clients call first), the request it takes, and each model's tensors.

``recserve.serving.triton_repository.layouts`` writes config.pbtxt from these contracts; the client, the
benchmarks and the SageMaker container build their requests from them and read a native model's shape back
from its config (``NativeShape``). A request's business rules (``Rules``) are its optional rule inputs, and
the options of ``recserve recommend``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from recserve.constants import (
    ECHO_MODEL,
    EVENTS_MODEL,
    FLOOR_MODEL,
    FUSED_MODEL,
    INPUT_EVENT_IDS,
    INPUT_EXCLUDE_ITEMS,
    INPUT_EXCLUDE_SEEN,
    INPUT_INCLUDE_ITEMS,
    INPUT_ITEM_IDS,
    INPUT_K,
    INPUT_RULE,
    INPUT_SESSION_ID,
    INPUT_WHERE,
    NATIVE_EVENTS_MODEL,
    NATIVE_MODEL,
    NATIVE_ONNX_OUTPUT_IDS,
    NATIVE_SESSION_MODEL,
    OUTPUT_HISTORY_LENGTH,
    OUTPUT_HISTORY_SOURCE,
    OUTPUT_ITEM_IDS,
    OUTPUT_SCORES,
    OUTPUT_STORED,
    OUTPUT_UNKNOWN_IDS,
    SEED_ENSEMBLE,
    SEED_HISTORY_LENGTH,
    SEED_INPUT,
    SEED_K,
    SEED_MODEL,
    SEED_OUTPUT_IDS,
    SEED_OUTPUT_SCORES,
    SEED_POSTPROCESSING,
    SEED_PREPROCESSING,
    SESSION_MODEL,
)
from recserve.errors import RequestError
from recserve.option_fields import option

if TYPE_CHECKING:
    import numpy as np


class Parameter:
    """The parameters recserve writes into a model's config.pbtxt (each a string), by name: the repository's
    layouts write them and ``config_parameters`` reads them back (the python models, the client's
    ``NativeShape``); recserve's own backend reads ``BACKEND_PARAMETERS`` in C++ (native/triton-backend/src/
    recserve.cc, held to these names by tests/serving/test_config_parameters.py)."""

    WINDOW = "window"  # the seed layout's preprocessing: the model's input window
    MAX_K = "max_k"  # echo, native: the largest k answered
    PADDING_ID = "padding_id"  # native: the ID that pads a history
    ITEM_ID_TYPE = "item_id_type"  # echo, events: the catalogue's ID type ("int64" or "string")
    EXPORT_DIR = "export_dir"  # fused, session: the export's folder inside the version
    RULES = "rules"  # fused, session: the rules the repository stores by name (JSON: name -> rule)
    SESSION_STORE = "session_store"  # by session, events: the store's record (JSON, never a password)
    # recserve's backend alone
    HISTORY_LENGTH = "history_length"  # native_session: the histories' fixed length
    RULES_FILE = "rules_file"  # native under rules: the rule bank's file in the version
    HIDDEN_STORE = "hidden_store"  # native under rules: the store whose hidden items it reads
    INTRA_OP_THREAD_COUNT = "intra_op_thread_count"  # threads an instance (CPUs)
    STEP_SUMMARY_S = "step_summary_s"  # seconds between the batches' step summaries in the log (0: none)
    WARMUP = "warmup"  # calls that warm each captured graph up before it serves
    BUCKETS = "buckets"  # the batch sizes captured as CUDA graphs ("1,2,4,...")
    EVENTS_ONLY = "events_only"  # "true": the events contract, appends alone, no graph (native_session's)
    FLOOR = "floor"  # "true": the native contract answered without a graph (the floor layout)


BACKEND_PARAMETERS = frozenset(
    (
        Parameter.PADDING_ID,
        Parameter.MAX_K,
        Parameter.SESSION_STORE,
        Parameter.HISTORY_LENGTH,
        Parameter.RULES_FILE,
        Parameter.HIDDEN_STORE,
        Parameter.INTRA_OP_THREAD_COUNT,
        Parameter.STEP_SUMMARY_S,
        Parameter.WARMUP,
        Parameter.BUCKETS,
        Parameter.EVENTS_ONLY,
        Parameter.FLOOR,
    )
)


def config_parameters(config: str | Mapping) -> dict[str, str]:
    """A model config's parameters by name, each its string value: from the JSON text Triton hands a python
    model's ``initialize`` (``args["model_config"]``), or a config as a dict (HTTP's JSON, gRPC's ``as_json``,
    either bare or under "config")."""
    parsed: Mapping = json.loads(config) if isinstance(config, str) else config
    parsed = parsed.get("config", parsed)
    return {key: value.get("string_value") for key, value in (parsed.get("parameters") or {}).items()}


@dataclass(frozen=True)
class TensorSpec:
    name: str
    data_type: str  # Triton's type name without the prefix: INT64, INT32, BOOL, FP32, BYTES
    dims: tuple[int, ...]
    optional: bool = False
    allow_ragged_batch: bool = False


@dataclass(frozen=True)
class Contract:
    """One served model's tensors, as its config.pbtxt declares them and its clients send and read them."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    @property
    def output_names(self) -> list[str]:
        return [spec.name for spec in self.outputs]


def recommender(id_type: str, counts_unknown: bool = True) -> Contract:
    """The ``recommender`` contract: ragged item IDs (``id_type``: INT64 or BYTES), optional k and
    exclude_seen, and the optional business rules (a stored rule's name, a rule written out, items to exclude,
    items to keep to); IDs and scores out, and the count of unknown IDs dropped where the model counts them."""
    outputs = (TensorSpec(OUTPUT_ITEM_IDS, id_type, (-1,)), TensorSpec(OUTPUT_SCORES, "FP32", (-1,)))
    return Contract(
        (
            TensorSpec(INPUT_ITEM_IDS, id_type, (-1,), allow_ragged_batch=True),
            TensorSpec(INPUT_K, "INT32", (1,), optional=True),
            TensorSpec(INPUT_EXCLUDE_SEEN, "BOOL", (1,), optional=True),
            *rules(id_type),
        ),
        outputs + ((TensorSpec(OUTPUT_UNKNOWN_IDS, "INT32", (1,)),) if counts_unknown else ()),
    )


def rules(id_type: str) -> tuple[TensorSpec, ...]:
    """A request's business rules (``recserve.rules``), every one optional."""
    return (
        TensorSpec(INPUT_RULE, "BYTES", (1,), optional=True),
        TensorSpec(INPUT_WHERE, "BYTES", (1,), optional=True),
        TensorSpec(INPUT_EXCLUDE_ITEMS, id_type, (-1,), optional=True, allow_ragged_batch=True),
        TensorSpec(INPUT_INCLUDE_ITEMS, id_type, (-1,), optional=True, allow_ragged_batch=True),
    )


def _by_session(contract: Contract) -> Contract:
    """A contract by session: a session ID a row, the items to append to it first optional; where the history
    came from and how long it was added to the answer."""
    item_ids = dataclasses.replace(contract.inputs[0], optional=True)
    return Contract(
        (TensorSpec(INPUT_SESSION_ID, "BYTES", (1,)), item_ids, *contract.inputs[1:]),
        contract.outputs
        + (TensorSpec(OUTPUT_HISTORY_SOURCE, "INT32", (1,)), TensorSpec(OUTPUT_HISTORY_LENGTH, "INT32", (1,))),
    )


def by_session(id_type: str) -> Contract:
    """The ``recommender`` contract by session (the session layout), the client's event IDs beside the items
    to append (optional)."""
    contract = _by_session(recommender(id_type))
    event_ids = TensorSpec(INPUT_EVENT_IDS, "BYTES", (-1,), optional=True)
    return dataclasses.replace(contract, inputs=(*contract.inputs[:2], event_ids, *contract.inputs[2:]))


def events(id_type: str) -> Contract:
    """The session layout's events-only model: a session a row, its items to append (and their event IDs,
    optional), how many the store acknowledged back."""
    return Contract(
        (
            TensorSpec(INPUT_SESSION_ID, "BYTES", (1,)),
            TensorSpec(INPUT_ITEM_IDS, id_type, (-1,)),
            TensorSpec(INPUT_EVENT_IDS, "BYTES", (-1,), optional=True),
        ),
        (TensorSpec(OUTPUT_STORED, "INT32", (1,)),),
    )


def native(history_length: int, onnx: bool = False, ruled: bool = False) -> Contract:
    """The ``recommender`` contract as native batching allows it: integer histories padded on the left to one
    length (with ``NATIVE_PAD_ID``), k and exclude_seen required, answers as wide as the batch's largest k (or
    ``max_k``), padded with ``NATIVE_PAD_ID`` past each request's k. An ONNX graph cannot name an output like
    its input, so its IDs come out as ``NATIVE_ONNX_OUTPUT_IDS``. ``ruled`` (recserve's backend): the
    business rules that need no parsing: a stored rule's name and the items to exclude or keep to (padded
    with ``NATIVE_PAD_ID``)."""
    return Contract(
        (
            TensorSpec(INPUT_ITEM_IDS, "INT64", (history_length,)),
            TensorSpec(INPUT_K, "INT32", (1,)),
            TensorSpec(INPUT_EXCLUDE_SEEN, "BOOL", (1,)),
            *(spec for spec in rules("INT64") if ruled and spec.name != INPUT_WHERE),
        ),
        (
            TensorSpec(NATIVE_ONNX_OUTPUT_IDS if onnx else OUTPUT_ITEM_IDS, "INT64", (-1,)),
            TensorSpec(OUTPUT_SCORES, "FP32", (-1,)),
            TensorSpec(OUTPUT_UNKNOWN_IDS, "INT32", (1,)),
        ),
    )


def native_by_session(history_length: int, ruled: bool = False) -> Contract:
    """The native contract by session (recserve's backend): the items to append as wide as a request's, and
    the client's event IDs beside them (optional), as the session layout takes them."""
    contract = _by_session(native(history_length, ruled=ruled))
    item_ids = dataclasses.replace(contract.inputs[1], dims=(-1,))
    event_ids = TensorSpec(INPUT_EVENT_IDS, "BYTES", (-1,), optional=True)
    return dataclasses.replace(contract, inputs=(contract.inputs[0], item_ids, event_ids, *contract.inputs[2:]))


def seed(id_type: str) -> Contract:
    """The PoC's ensemble: exactly ``SEED_HISTORY_LENGTH`` IDs in, the top ``SEED_K`` IDs and scores out."""
    return Contract(
        (TensorSpec(SEED_INPUT, id_type, (SEED_HISTORY_LENGTH,)),),
        (TensorSpec(SEED_OUTPUT_IDS, id_type, (SEED_K,)), TensorSpec(SEED_OUTPUT_SCORES, "FP32", (SEED_K,))),
    )


@dataclass(frozen=True)
class ServedLayout:
    """A layout as its clients see it: the models it serves (the one they call first) and how they ask it.

    ``request``: ``items`` (a history of any length), ``seed`` (exactly ``SEED_HISTORY_LENGTH`` IDs),
    ``native`` (a history padded to the model's length, every input sent) or ``session`` (a session ID, items
    optional)."""

    models: tuple[str, ...]
    request: str = "items"
    native: bool = False  # a native model: fixed shapes read from its config, every input sent
    about: str = ""  # what the help of `recserve repo --layout` says of it

    @property
    def entry(self) -> str:
        return self.models[0]

    @property
    def by_session(self) -> bool:
        return self.request == "session"

    @property
    def ids_input(self) -> str:
        return SEED_INPUT if self.request == "seed" else INPUT_ITEM_IDS

    @property
    def ids_output(self) -> str:
        return SEED_OUTPUT_IDS if self.request == "seed" else OUTPUT_ITEM_IDS


# every layout, in the order a repository writes them; each has a module of its name in
# recserve.serving.triton_repository.layouts with its writer, checks and description
LAYOUTS: dict[str, ServedLayout] = {
    "fused": ServedLayout((FUSED_MODEL,), about=f"model `{FUSED_MODEL}`, python"),
    "native": ServedLayout(
        (NATIVE_MODEL,),
        "native",
        native=True,
        about=f"`{NATIVE_MODEL}`: TorchScript or ONNX on Triton's own backends, integer IDs, no Python",
    ),
    "seed": ServedLayout(
        (SEED_ENSEMBLE, SEED_PREPROCESSING, SEED_MODEL, SEED_POSTPROCESSING), "seed", about="the PoC's ensemble"
    ),
    "session": ServedLayout(
        (SESSION_MODEL, EVENTS_MODEL),
        "session",
        about=f"`{SESSION_MODEL}`: a session ID in, its history read from the store; `{EVENTS_MODEL}` beside it",
    ),
    "native_session": ServedLayout(
        (NATIVE_SESSION_MODEL, NATIVE_EVENTS_MODEL),
        "session",
        native=True,
        about=f"`{NATIVE_SESSION_MODEL}`: the same on recserve's own backend, the store read in C++ and the native "
        f"graph scored in one call; `{NATIVE_EVENTS_MODEL}` beside it, appends in C++",
    ),
    "echo": ServedLayout((ECHO_MODEL,), about="a fixed answer, the python server stack's ceiling"),
    "floor": ServedLayout(
        (FLOOR_MODEL,),
        "native",
        native=True,
        about=f"`{FLOOR_MODEL}`: the native contract answered on recserve's backend without a graph, the "
        "server's own cost that the native model's figures are read against",
    ),
}


def layouts_help() -> str:
    """The help's list of the layouts: each with what it serves."""
    return "; ".join(f"{name} ({layout.about})" for name, layout in LAYOUTS.items())


@dataclass(frozen=True)
class NativeShape:
    """What a native-layout model takes (read from its config): the fixed history length, the padding ID,
    the largest k, the name of its item-ID output and whether it takes business rules."""

    length: int
    padding_id: int
    max_k: int
    ids_output: str
    rules: bool = False

    @classmethod
    def from_config(cls, config: dict) -> NativeShape | None:
        """From the model config as JSON (HTTP) or a dict of it (gRPC ``as_json``); None for python models."""
        config = config.get("config", config)
        parameters = config_parameters(config)
        if Parameter.PADDING_ID not in parameters:
            return None
        dims = next(i["dims"] for i in config["input"] if i["name"] == INPUT_ITEM_IDS)
        rules = any(i["name"] == INPUT_RULE for i in config["input"])
        padding, max_k = int(parameters[Parameter.PADDING_ID]), int(parameters[Parameter.MAX_K])
        return cls(int(dims[0]), padding, max_k, config["output"][0]["name"], rules)

    def history(self, ids: np.ndarray) -> np.ndarray:
        """The most recent ``length`` IDs, left-padded with the padding ID to ``length``: (1, length) int64.

        Raises:
            RequestError: IDs that are not integers (the native layout serves integer catalogues only).
        """
        import numpy as np  # here: the CLI reads the contracts without numpy

        if ids.dtype.kind not in "iu":
            raise RequestError(f"{INPUT_ITEM_IDS}: the native layout takes integer IDs, got {ids.dtype}")
        out = np.full((1, self.length), self.padding_id, dtype=np.int64)
        recent = ids[-self.length :] if self.length else ids[:0]
        out[0, self.length - len(recent) :] = recent
        return out

    def check_k(self, k: int) -> None:
        """Raises RequestError for a k the model cannot answer (it cannot fail one request of a batch)."""
        if not 1 <= k <= self.max_k:
            raise RequestError(f"{INPUT_K}: {k} is out of range; allowed 1..{self.max_k}")


def id_array(item_ids) -> np.ndarray:
    """Item IDs as Triton takes them: INT64, or BYTES for string IDs."""
    import numpy as np

    ids = np.asarray(item_ids)
    if ids.dtype.kind in "US" or ids.dtype == object:
        return np.array([str(x).encode() if not isinstance(x, bytes) else x for x in ids.reshape(-1)], dtype=np.object_)
    return ids.astype(np.int64)


def _listed(text: str) -> list[str]:
    """Comma-separated item IDs, as the command line gives them (a model's integer IDs are made so after)."""
    return [part.strip() for part in text.split(",") if part.strip()]


@dataclass(frozen=True)
class Rules:
    """What a request keeps out of its answer (docs/rules.md): a rule the repository stores by name, a rule
    written out over the item attributes, item IDs never to recommend, the only item IDs to recommend."""

    rule: str | None = option(None, "Only items the rule stored with the repository by this name lets through.")
    where: str | None = option(
        None, "Only items this rule lets through, as in 'category == \"games\" and price < 50' (docs/rules.md)."
    )
    exclude: Sequence | None = option(
        None, "Comma-separated item IDs never to recommend (already on the page, say).", cli_type=str, parse=_listed
    )
    include: Sequence | None = option(
        None, "Comma-separated item IDs: the only ones to recommend.", cli_type=str, parse=_listed
    )

    @property
    def given(self) -> bool:
        return any(x is not None for x in (self.rule, self.where, self.exclude, self.include))

    def tensors(self) -> list[tuple[str, np.ndarray]]:
        """The request's rule inputs: only those given."""
        import numpy as np

        out = []
        for name, text in ((INPUT_RULE, self.rule), (INPUT_WHERE, self.where)):
            if text:
                out.append((name, np.array([[text.encode()]], dtype=np.object_)))
        for name, ids in ((INPUT_EXCLUDE_ITEMS, self.exclude), (INPUT_INCLUDE_ITEMS, self.include)):
            if ids is not None and len(ids):
                out.append((name, id_array(ids).reshape(1, -1)))
        return out
