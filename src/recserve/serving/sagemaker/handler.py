"""The SageMaker handler: ``model_fn``, ``input_fn``, ``predict_fn``, ``output_fn`` over recserve's predictor.

The contract of SageMaker's PyTorch inference containers. JSON in, ``{"item_id": [...], "k": 10}`` (``k`` and
``exclude_seen`` optional); JSON out, ``{"item_id": [...], "score": [...], "unknown_item_ids": n}``, best
first, the input items excluded. Works for BERT4Rec and Mult-VAE exports, on CUDA when there is one. A bad
request raises the toolkit's error type with a 4xx status and a message that names the problem; the error
body is that message alone (the toolkit would add a traceback). Errors are logged with the request's
context and, when ``RECSERVE_ERROR_HOOK_URL`` is set, posted there as JSON (off by default). ``transform``
replaces the toolkit's for TorchServe's batches: one graph call a batch, each request its own status.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from recserve.artifacts.catalogue import is_int64_text
from recserve.constants import DEFAULT_K
from recserve.errors import RequestError

log = logging.getLogger(__name__)

JSON = "application/json"
ERROR_HOOK_ENV = "RECSERVE_ERROR_HOOK_URL"
HOOK_TIMEOUT_S = 2.0

try:  # the toolkit is in every SageMaker inference container; recserve runs without it too
    from sagemaker_inference.errors import BaseInferenceToolkitError
except ImportError:  # pragma: no cover - exercised where the toolkit is absent

    class BaseInferenceToolkitError(Exception):  # type: ignore[no-redef]
        def __init__(self, status_code, message, phrase):
            self.status_code, self.message, self.phrase = status_code, message, phrase
            super().__init__(status_code, message, phrase)


class HandlerError(BaseInferenceToolkitError):
    """A request the handler refuses: the client gets ``status_code`` and ``message``."""

    def __init__(self, status_code: int, message: str, context: dict | None = None):
        super().__init__(status_code, message, message)
        report_error(status_code, message, context or {})


def model_fn(model_dir: str):
    """Loads the export in ``model_dir`` (written by ``recserve sagemaker package``), on CUDA when available."""
    import torch

    from recserve.serving.predictor import Predictor

    device = "cuda" if torch.cuda.is_available() else "cpu"
    predictor = Predictor.load(Path(model_dir), device=device)
    manifest = predictor.manifest
    assert manifest is not None  # loaded from an export folder
    log.info("loaded %s (%s, %s) on %s", manifest.model, manifest.backend, manifest.precision, device)
    return predictor


def input_fn(request_body, request_content_type: str) -> dict:
    """Parses and checks a JSON request; returns ``{"item_id": array, "k": int, "exclude_seen": bool}``."""
    context = {"content_type": request_content_type, "body_bytes": len(request_body or b"")}
    media_type = (request_content_type or "").split(";")[0].strip().lower()
    if media_type != JSON:
        raise HandlerError(415, f"content type {request_content_type!r} is not supported; send {JSON}", context)
    if isinstance(request_body, (bytes, bytearray)):
        try:
            request_body = request_body.decode("utf-8")
        except UnicodeDecodeError as err:
            raise HandlerError(400, f"the body is not UTF-8: {err}", context) from err
    try:
        payload = json.loads(request_body)
    except json.JSONDecodeError as err:
        raise HandlerError(400, f"malformed JSON: {err}", context) from err
    if not isinstance(payload, dict):
        raise HandlerError(400, f"expected a JSON object with key 'item_id', got {type(payload).__name__}", context)
    if "item_id" not in payload:
        raise HandlerError(400, f"missing key 'item_id'; got keys {sorted(payload)}", context)
    return {
        "item_id": _item_ids(payload["item_id"], context),
        "k": _k(payload.get("k", DEFAULT_K), context),
        "exclude_seen": _flag(payload.get("exclude_seen", True), context),
    }


def _item_ids(value, context: dict) -> np.ndarray:
    if not isinstance(value, list):
        raise HandlerError(400, f"item_id: expected a list of item IDs, got {type(value).__name__}", context)
    if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        if any(not -(2**63) <= v < 2**63 for v in value):
            raise HandlerError(400, "item_id: integer IDs must fit in int64", context)
        return np.asarray(value, dtype=np.int64)
    if all(isinstance(v, str) for v in value):
        return np.asarray(value, dtype=object)
    kinds = sorted({type(v).__name__ for v in value})
    raise HandlerError(400, f"item_id: expected all integers or all strings, got {', '.join(kinds)}", context)


def _k(value, context: dict) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise HandlerError(400, f"k: expected an integer, got {value!r}", context)
    return value


def _flag(value, context: dict) -> bool:
    if not isinstance(value, bool):
        raise HandlerError(400, f"exclude_seen: expected true or false, got {value!r}", context)
    return value


def predict_fn(input_data: dict, model) -> dict:
    """Top-k for one history: ``{"item_id": [...], "score": [...], "unknown_item_ids": n}``."""
    ids = _as_model_ids(input_data["item_id"], model.string_ids)
    try:
        [answer] = model.predict([ids], k=input_data["k"], exclude_seen=input_data["exclude_seen"])
    except RequestError as err:
        raise HandlerError(400, str(err), {"k": input_data["k"], "items": len(input_data["item_id"])}) from err
    return _prediction(answer)


def _as_model_ids(ids: np.ndarray, string_ids: bool) -> np.ndarray:
    """The IDs as the model's catalogue holds them, whichever JSON type a caller sent: 42 is "42" to a model of
    string IDs, and "42" is 42 to a model of integer IDs (a caller need not be told the type)."""
    if string_ids and ids.dtype != object:
        return ids.astype(str).astype(object)
    if not string_ids and ids.dtype == object:
        try:
            return ids.astype(np.int64)
        except (ValueError, OverflowError):
            bad = next(v for v in ids if not is_int64_text(v))
            raise HandlerError(400, f"item_id: integer IDs expected for this model (int64), got {bad!r}", {}) from None
    return ids


def _prediction(answer) -> dict:
    return {
        "item_id": answer.item_ids.tolist(),
        "score": [round(float(s), 6) for s in answer.scores],
        "unknown_item_ids": answer.unknown_ids,
    }


def output_fn(prediction: dict, accept: str | None):
    """Serialises the answer as JSON; returns the body and its content type."""
    media_type = (accept or JSON).split(";")[0].strip().lower()
    if media_type not in (JSON, "*/*"):
        raise HandlerError(406, f"accept {accept!r} is not supported; accept {JSON}", {"accept": accept})
    return json.dumps(prediction), JSON


def report_error(status_code: int, message: str, context: dict) -> None:
    """Logs a refused request with its context and posts it to the error hook when one is configured."""
    log.warning("request refused (%d): %s; context %s", status_code, message, context)
    url = os.environ.get(ERROR_HOOK_ENV)
    if not url:
        return
    body = json.dumps({"status": status_code, "message": message, "context": context}).encode()

    def post() -> None:
        request = urllib.request.Request(url, data=body, headers={"Content-Type": JSON}, method="POST")
        try:
            urllib.request.urlopen(request, timeout=HOOK_TIMEOUT_S).close()
        except OSError as err:  # the hook must never fail a request
            log.warning("error hook %s failed: %s", url, err)

    threading.Thread(target=post, daemon=True).start()


def predict_batch(inputs: Sequence[dict], model) -> list[dict | HandlerError]:
    """``predict_fn`` for several parsed requests in one graph call; where that call refuses the batch (a
    request the model cannot take), each request is answered alone, so only the bad ones get their error."""
    if not inputs:
        return []
    try:
        answers = model.predict(
            [_as_model_ids(x["item_id"], model.string_ids) for x in inputs],
            k=[x["k"] for x in inputs],
            exclude_seen=np.fromiter((x["exclude_seen"] for x in inputs), dtype=bool, count=len(inputs)),
        )
    except (RequestError, HandlerError):
        return [_answer_or_error(predict_fn, x, model) for x in inputs]
    return [_prediction(answer) for answer in answers]


def _answer_or_error(function, *args):
    try:
        return function(*args)
    except HandlerError as err:
        return err


def transform(transformer, data: list[dict], context) -> list:
    """The toolkit's ``Transformer.transform`` for a batch of requests (TorchServe's batching,
    ``SAGEMAKER_TS_BATCH_SIZE``): each request parsed with its own headers and answered with its own status
    and body, the good ones of a batch in one graph call. The toolkit's own reads every request with the first
    one's headers, calls the model once a request, and fails the whole batch (every request gets 503) when one
    request is bad. An error body is the message alone; the traceback goes to the log."""
    try:
        transformer.validate_and_initialize(model_dir=context.system_properties.get("model_dir"), context=context)
        bodies: list = [None] * len(data)
        good, accepts = {}, {}
        for i, request in enumerate(data):
            headers = context.get_all_request_header(i)
            accepts[i] = headers.get("Accept") or headers.get("accept")
            parsed = _answer_or_error(input_fn, request.get("body"), _content_type(headers))
            if isinstance(parsed, HandlerError):
                bodies[i] = _error_body(context, i, parsed)
            else:
                good[i] = parsed
        for i, answer in zip(good, predict_batch(list(good.values()), transformer._model), strict=True):
            reply = answer if isinstance(answer, HandlerError) else _answer_or_error(output_fn, answer, accepts[i])
            if isinstance(reply, HandlerError):
                bodies[i] = _error_body(context, i, reply)
            else:
                bodies[i], media_type = reply
                context.set_response_content_type(i, media_type)
        return bodies
    except Exception as err:  # the endpoint answers 500 and stays up, as the toolkit's does
        log.exception("transform failed for model %s", context.model_name)
        message = json.dumps({"error": f"internal error: {err}"})
        for i in range(len(data)):
            context.set_response_status(code=500, phrase="Internal Server Error", idx=i)
        return [message] * len(data)


def _content_type(headers: dict) -> str | None:
    return next((value for key, value in headers.items() if key.lower() == "content-type"), None)


def _error_body(context, idx: int, err: HandlerError) -> str:
    context.set_response_status(code=err.status_code, phrase=err.phrase.replace("\r", " ").replace("\n", " "), idx=idx)
    return json.dumps({"error": err.message})


def install_transform() -> None:
    """Makes the toolkit answer requests with ``transform`` above (per request: its headers, status and body;
    one graph call a batch)."""
    try:
        from sagemaker_inference.transformer import Transformer
    except ImportError:
        return
    Transformer.transform = transform
