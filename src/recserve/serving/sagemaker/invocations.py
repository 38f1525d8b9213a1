"""What each SageMaker runtime's ``/invocations`` takes and answers, framework-free.

- pytorch (the PyTorch container, our handler): ``{"item_id": [...], "k": k, "exclude_seen": bool}`` as
  application/json; the answer ``{"item_id": [...], "score": [...], "unknown_item_ids": n}``.
- triton (the Triton container's SageMaker frontend): a KServe v2 inference request for the package's one
  model, the native contract (``item_ids`` INT64 [1, length] left-padded, ``k`` INT32 [1, 1],
  ``exclude_seen`` BOOL [1, 1]), as JSON or in Triton's binary form
  (``application/vnd.sagemaker-triton.binary+json;json-header-size=N``: the JSON header, then the raw
  tensors); the answer's outputs are read back into the pytorch runtime's answer shape, so a caller sees
  one shape from both.
"""

from __future__ import annotations

import json

import numpy as np

from recserve.artifacts.served import NativeShape
from recserve.constants import INPUT_EXCLUDE_SEEN, INPUT_ITEM_IDS, INPUT_K, OUTPUT_SCORES, OUTPUT_UNKNOWN_IDS
from recserve.errors import ServingError

JSON = "application/json"
TRITON_BINARY = "application/vnd.sagemaker-triton.binary+json;json-header-size="


def pytorch_request(history: list, k: int, exclude_seen: bool = True) -> tuple[bytes, str]:
    return json.dumps({"item_id": list(history), "k": k, "exclude_seen": exclude_seen}).encode(), JSON


def triton_request(
    history: list, k: int, shape: NativeShape, exclude_seen: bool = True, binary: bool = False
) -> tuple[bytes, str]:
    """The native model's inputs for one history (the most recent ``shape.length`` IDs).

    Raises:
        ServingError: string IDs (the native layout takes integers) or k outside 1..max_k.
    """
    ids = np.asarray(history)
    if ids.size and ids.dtype.kind not in "iu":
        raise ServingError("the triton runtime serves the native layout, which takes integer IDs")
    if not 1 <= k <= shape.max_k:
        raise ServingError(f"k: {k} is out of range; allowed 1..{shape.max_k}")
    tensors = [
        (INPUT_ITEM_IDS, "INT64", shape.history(ids.astype(np.int64).reshape(-1))),
        (INPUT_K, "INT32", np.array([[k]], dtype=np.int32)),
        (INPUT_EXCLUDE_SEEN, "BOOL", np.array([[exclude_seen]], dtype=bool)),
    ]
    outputs = [{"name": name, "parameters": {"binary_data": False}} for name in answer_names(shape)]
    if not binary:
        inputs = [
            {"name": name, "shape": list(array.shape), "datatype": dtype, "data": array.reshape(-1).tolist()}
            for name, dtype, array in tensors
        ]
        return json.dumps({"inputs": inputs, "outputs": outputs}).encode(), JSON
    inputs = [
        {"name": name, "shape": list(array.shape), "datatype": dtype, "parameters": {"binary_data_size": array.nbytes}}
        for name, dtype, array in tensors
    ]
    header = json.dumps({"inputs": inputs, "outputs": outputs}).encode()
    return header + b"".join(array.tobytes() for _, _, array in tensors), f"{TRITON_BINARY}{len(header)}"


def answer_names(shape: NativeShape) -> tuple[str, str, str]:
    return shape.ids_output, OUTPUT_SCORES, OUTPUT_UNKNOWN_IDS


def triton_answer(body: bytes, k: int, shape: NativeShape) -> dict:
    """The native model's KServe v2 answer as the pytorch runtime's: its first k items (the rest is padding).

    Raises:
        ServingError: a body that is not such an answer (an error reply's message included).
    """
    try:
        reply = json.loads(body)
        outputs = {o["name"]: o["data"] for o in reply["outputs"]}
        ids, scores, unknown = (outputs[name] for name in answer_names(shape))
    except (ValueError, KeyError, TypeError) as err:
        raise ServingError(f"not an answer of the native model: {body[:300].decode(errors='replace')}") from err
    return {
        "item_id": [int(x) for x in ids[:k]],
        "score": [round(float(s), 6) for s in scores[:k]],
        "unknown_item_ids": int(unknown[0]),
    }
