"""``recommend(item_ids, k, exclude_seen)`` against the ``recommender`` model, built on tritonclient.

The same call serves the native layout (``model="recommender_native"``): the client reads that model's
config once and pads each history on the left to its fixed length with the padding ID, refuses a k outside
1..max_k before sending (the native model cannot fail one request of a batch), and trims the answer to k.

Rejections for overload (HTTP 503 / gRPC UNAVAILABLE, a full queue or a queue timeout) raise
``ServerBusyError``, which is retryable: ``retries`` > 0 retries them with exponential backoff.

``recommend_session(session, item_ids)`` asks the session layout (``recommender_session``) for a session's
answer, the items given appended to it first; a session store that is down answers a request that brought
items from those alone (``history_source`` 1) and refuses one that did not (``SessionStoreError``).
"""

from __future__ import annotations

import random
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import cast

import numpy as np
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from recserve.artifacts import served
from recserve.artifacts.served import NativeShape, Rules, id_array
from recserve.constants import (
    DEFAULT_K,
    EVENTS_MODEL,
    FUSED_MODEL,
    GRPC_PORT,
    HTTP_PORT,
    INPUT_EVENT_IDS,
    INPUT_EXCLUDE_SEEN,
    INPUT_ITEM_IDS,
    INPUT_K,
    INPUT_SESSION_ID,
    NATIVE_SESSION_MODEL,
    OUTPUT_HISTORY_LENGTH,
    OUTPUT_HISTORY_SOURCE,
    OUTPUT_ITEM_IDS,
    OUTPUT_SCORES,
    OUTPUT_STORED,
    OUTPUT_UNKNOWN_IDS,
    SESSION_MODEL,
)
from recserve.data.vocab import as_str_ids
from recserve.errors import RequestError, ServingError

BUSY_STATUSES = {"503", "StatusCode.UNAVAILABLE", "UNAVAILABLE"}


class RecommendError(ServingError):
    """The server refused or failed a request; ``status`` is its HTTP status or gRPC code."""

    def __init__(self, message: str, status: str | None = None):
        super().__init__(message)
        self.status = status


class ServerBusyError(RecommendError):
    """The server shed the request under load (queue full or queue timeout): retry later."""


class ServerUnreachableError(ServerBusyError):
    """Nothing answers at the address (no server, or one still starting): retried like a busy server."""


class SessionStoreError(RecommendError):
    """The session model's store is down or slow and the request brought no items to answer from."""


UNREACHABLE_SIGNS = ("failed to connect", "connection refused", "name resolution", "dns resolution")


def _unreachable(url: str, protocol: str, detail: str) -> ServerUnreachableError:
    if protocol == "grpc" and _answers_http(url):  # Triton's HTTP port asked over gRPC, the usual slip
        return ServerUnreachableError(
            f"{url} answers HTTP, not gRPC: pass --protocol http for this port, or its gRPC port ({GRPC_PORT} by "
            f"default; `recserve serve` prints both)",
            "UNAVAILABLE",
        )
    return ServerUnreachableError(
        f"no server answers at {url} ({protocol}): start one with `recserve serve --repo REPO` (gRPC on "
        f"{GRPC_PORT}, HTTP on {HTTP_PORT} by default) or pass --url host:port; {detail}",
        "UNAVAILABLE",
    )


def _answers_http(url: str) -> bool:
    """Whether an HTTP server answers at ``url`` (any status: it spoke HTTP), within a second."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://{url}/v2/health/live", timeout=1):
            return True
    except urllib.error.HTTPError:
        return True
    except (urllib.error.URLError, OSError, ValueError):
        return False


@dataclass(frozen=True)
class Recommendations:
    item_ids: np.ndarray
    scores: np.ndarray
    unknown_ids: int = 0


@dataclass(frozen=True)
class SessionRecommendations(Recommendations):
    history_source: int = 0  # 0: the session's history in the store; 1: the request's items alone (store down)
    history_length: int = 0  # the items the answer was computed from


def _as_json(protocol: str) -> dict:
    """get_model_config's argument that makes the gRPC client answer JSON like the HTTP one."""
    return {"as_json": True} if protocol == "grpc" else {}


def _module(protocol: str, aio: bool = False):
    if protocol == "grpc":
        import tritonclient.grpc as module

        if aio:
            import tritonclient.grpc.aio as module
    elif protocol == "http":
        import tritonclient.http as module

        if aio:
            import tritonclient.http.aio as module
    else:
        raise ServingError(f"protocol {protocol!r}: expected grpc or http")
    return module


def default_url(protocol: str) -> str:
    return f"127.0.0.1:{GRPC_PORT}" if protocol == "grpc" else f"127.0.0.1:{HTTP_PORT}"


def _text_row(values: list[str]) -> np.ndarray:
    """One row of BYTES (a session ID, event IDs) as Triton takes it: (1, len) UTF-8."""
    return np.array([[v.encode() for v in values]], dtype=np.object_)


def _tensor(module, name: str, value: np.ndarray):
    tensor = module.InferInput(name, list(value.shape), np_to_triton_dtype(value.dtype))
    tensor.set_data_from_numpy(value)
    return tensor


def _inputs(
    module, item_ids, k: int, exclude_seen: bool, native: NativeShape | None = None, rules: Rules | None = None
):
    ids = id_array(item_ids)
    extra = rules.tensors() if rules is not None else []
    if native is not None:
        try:
            native.check_k(k)
            ids = native.history(ids.reshape(-1))
        except RequestError as err:  # refused here, before sending: the native model cannot fail one request
            raise RecommendError(str(err)) from err
        if rules is not None and extra:
            _check_native_rules(rules, native.rules)
    ids = ids.reshape(1, -1)
    tensors = [
        (INPUT_ITEM_IDS, ids),
        (INPUT_K, np.array([[k]], dtype=np.int32)),
        (INPUT_EXCLUDE_SEEN, np.array([[exclude_seen]], dtype=bool)),
        *extra,
    ]
    return [_tensor(module, name, value) for name, value in tensors]


def _check_native_rules(rules: Rules, takes_rules: bool = True) -> None:
    """A native model takes the rules that need no parsing, and only on recserve's backend (``takes_rules``).

    Raises:
        RecommendError: rules it cannot take, naming what it can.
    """
    if not takes_rules:
        raise RecommendError(
            "this native model takes no business rules (Triton's own backends run it): serve it on recserve's "
            "backend (recserve repo --native-runtime recserve, from a torchscript export), or ask the fused or "
            "session layout"
        )
    if rules.where is not None:
        raise RecommendError(
            "the native layout takes rules stored by name, not written out: store it with recserve repo --rules "
            "FILE and ask for it with rule=NAME (--rule NAME), or ask the fused or session layout"
        )


def _error(err: InferenceServerException, url: str, protocol: str) -> RecommendError:
    status = str(err.status()) if err.status() is not None else None
    message = err.message() or str(err)
    if "session store" in message:
        return SessionStoreError(message, status)
    if status in BUSY_STATUSES and any(sign in message.lower() for sign in UNREACHABLE_SIGNS):
        return _unreachable(url, protocol, message)
    cls = ServerBusyError if status in BUSY_STATUSES else RecommendError
    return cls(message, status)


def _result(reply, native: NativeShape | None = None, k: int = 0) -> Recommendations:
    ids = reply.as_numpy(native.ids_output if native else OUTPUT_ITEM_IDS)[0]
    scores = reply.as_numpy(OUTPUT_SCORES)[0]
    if native is not None:  # the batch's widest k
        ids, scores = ids[:k], scores[:k]
    kept = scores > -np.inf  # padding where fewer items remain (past a row's k, or its rules let fewer through)
    ids, scores = ids[kept], scores[kept]
    if ids.dtype == object:
        ids = as_str_ids(ids)
    return Recommendations(ids, scores, int(reply.as_numpy(OUTPUT_UNKNOWN_IDS)[0, 0]))


def _outputs(module, native: NativeShape | None = None):
    """The answer's tensors: the ``recommender`` contract's, or a native model's (its IDs output named in its
    config)."""
    if native is not None:
        names = [native.ids_output, *served.native(native.length).output_names[1:]]
    else:
        names = served.recommender("INT64").output_names
    return [module.InferRequestedOutput(n) for n in names]


class _ModelClient:
    """What the synchronous and the asyncio client share: the model, its native shape once asked, the
    request's tensors and the answer's reading."""

    def __init__(self, url: str | None, protocol: str, model: str, aio: bool, version: str = ""):
        self.module = _module(protocol, aio=aio)
        self.protocol, self.model, self.version = protocol, model, version  # version "": the newest served
        self.url = url or default_url(protocol)
        self.client = self.module.InferenceServerClient(self.url)
        self._native: NativeShape | None | bool = False  # False: not asked yet

    def _remember_shape(self, config) -> NativeShape | None:
        self._native = NativeShape.from_config(config)
        return self._native

    def _request(
        self, item_ids, k: int, exclude_seen: bool, native: NativeShape | None, rules: Rules | None = None
    ) -> dict:
        """The ``infer`` arguments after the model's name."""
        return {
            "inputs": _inputs(self.module, item_ids, k, exclude_seen, native, rules),
            "outputs": _outputs(self.module, native),
        }

    def _answer(self, reply, native: NativeShape | None, k: int) -> Recommendations:
        return _result(reply, native, k)

    @contextmanager
    def _errors(self):
        """Triton's errors as recserve's (``_error``), and the transport's as an unreachable server."""
        try:
            yield
        except InferenceServerException as err:
            raise _error(err, self.url, self.protocol) from err
        except RecommendError:  # refused here, before sending (a k the native model cannot answer)
            raise
        except Exception as err:  # the HTTP client's connection errors: OSError, its own parse errors, gevent's
            raise _unreachable(self.url, self.protocol, f"{type(err).__name__}: {err}") from err


class RecommenderClient(_ModelClient):
    """Synchronous client. ``url`` is host:port (gRPC 8001, HTTP 8000 by default)."""

    def __init__(
        self,
        url: str | None = None,
        protocol: str = "grpc",
        model: str = FUSED_MODEL,
        timeout_s: float = 10.0,
        retries: int = 0,
        backoff_s: float = 0.05,
        version: str = "",
    ):
        super().__init__(url, protocol, model, aio=False, version=version)
        self.timeout_s, self.retries, self.backoff_s = timeout_s, retries, backoff_s

    def recommend(
        self, item_ids, k: int = DEFAULT_K, exclude_seen: bool = True, rules: Rules | None = None
    ) -> Recommendations:
        """Top-k item IDs and scores for one history, best first; under ``rules``, only items they allow (fewer
        than k where fewer pass)."""
        for attempt in range(self.retries + 1):
            try:
                return self._once(item_ids, k, exclude_seen, rules)
            except ServerBusyError:
                if attempt == self.retries:
                    raise
                time.sleep(self.backoff_s * 2**attempt * (1 + random.random()))
        raise AssertionError("unreachable")

    def recommend_session(
        self,
        session: str,
        item_ids=None,
        k: int = DEFAULT_K,
        exclude_seen: bool = True,
        model: str = SESSION_MODEL,
        rules: Rules | None = None,
        event_ids: list[str] | None = None,
    ) -> SessionRecommendations:
        """Top-k for a session of the session layout, ``item_ids`` (in order) appended to it first (``event_ids``:
        the caller's ID of each, so that the request sent again stores them once; the session layout); under
        ``rules``, only items they allow.

        Raises:
            SessionStoreError: the store is down and no ``item_ids`` were given.
        """
        if model == NATIVE_SESSION_MODEL and rules is not None and rules.given:
            _check_native_rules(rules)
        tensors = [(INPUT_SESSION_ID, _text_row([session]))]
        if item_ids is not None and len(item_ids):
            tensors.append((INPUT_ITEM_IDS, id_array(item_ids).reshape(1, -1)))
            if event_ids is not None:
                tensors.append((INPUT_EVENT_IDS, _text_row(event_ids)))
        tensors += [
            (INPUT_K, np.array([[k]], dtype=np.int32)),
            (INPUT_EXCLUDE_SEEN, np.array([[exclude_seen]], dtype=bool)),
            *(rules.tensors() if rules is not None else []),
        ]
        outputs = served.by_session("BYTES").output_names
        kwargs = {"client_timeout": self.timeout_s} if self.protocol == "grpc" else {}
        with self._errors():
            reply = self.client.infer(
                model,
                inputs=[_tensor(self.module, name, value) for name, value in tensors],
                outputs=[self.module.InferRequestedOutput(n) for n in outputs],
                **kwargs,
            )
        base = _result(reply)
        return SessionRecommendations(
            base.item_ids,
            base.scores,
            base.unknown_ids,
            int(reply.as_numpy(OUTPUT_HISTORY_SOURCE)[0, 0]),
            int(reply.as_numpy(OUTPUT_HISTORY_LENGTH)[0, 0]),
        )

    def send_events(self, session: str, item_ids, event_ids: list[str] | None = None, model: str = EVENTS_MODEL) -> int:
        """Appends ``item_ids`` (in order) to ``session`` through the session layout's ``events`` model (or
        ``events_native``, the native session layout's on recserve's backend) (``event_ids``: the caller's ID of
        each, so that sending them again stores them once); returns how many the store acknowledged.

        Raises:
            SessionStoreError: the store is down (nothing was acknowledged).
        """
        tensors = [(INPUT_SESSION_ID, _text_row([session])), (INPUT_ITEM_IDS, id_array(item_ids).reshape(1, -1))]
        if event_ids is not None:
            tensors.append((INPUT_EVENT_IDS, _text_row(event_ids)))
        kwargs = {"client_timeout": self.timeout_s} if self.protocol == "grpc" else {}
        with self._errors():
            reply = self.client.infer(
                model,
                inputs=[_tensor(self.module, name, value) for name, value in tensors],
                outputs=[self.module.InferRequestedOutput(OUTPUT_STORED)],
                **kwargs,
            )
        return int(reply.as_numpy(OUTPUT_STORED)[0, 0])

    def native_shape(self) -> NativeShape | None:
        """What the model takes if it is a native-layout model (asked of the server once), else None."""
        if self._native is False:
            config = self.client.get_model_config(self.model, self.version, **_as_json(self.protocol))
            return self._remember_shape(config)
        return cast(NativeShape | None, self._native)

    def _once(self, item_ids, k: int, exclude_seen: bool, rules: Rules | None = None) -> Recommendations:
        kwargs = {"client_timeout": self.timeout_s} if self.protocol == "grpc" else {}
        with self._errors():
            native = self.native_shape()
            request = self._request(item_ids, k, exclude_seen, native, rules)
            reply = self.client.infer(self.model, model_version=self.version, **request, **kwargs)
        return self._answer(reply, native, k)

    def id_type(self, model: str | None = None) -> str:
        """The item IDs ``model`` (default: the client's) takes, from its metadata: "string" (BYTES) or "int64"
        (INT64), so that a caller never has to be told."""
        with self._errors():
            metadata = self.client.get_model_metadata(model or self.model, **_as_json(self.protocol))
        inputs = {t["name"]: t["datatype"] for t in metadata.get("inputs", [])}
        return "string" if inputs.get(INPUT_ITEM_IDS) == "BYTES" else "int64"

    def is_ready(self) -> bool:
        try:
            return bool(self.client.is_model_ready(self.model))
        except InferenceServerException:
            return False

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> RecommenderClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class AsyncRecommenderClient(_ModelClient):
    """asyncio client: many ``recommend`` calls in flight at once (``asyncio.gather``), which the server
    batches."""

    def __init__(self, url: str | None = None, protocol: str = "grpc", model: str = FUSED_MODEL):
        super().__init__(url, protocol, model, aio=True)

    async def recommend(
        self, item_ids, k: int = DEFAULT_K, exclude_seen: bool = True, rules: Rules | None = None
    ) -> Recommendations:
        with self._errors():
            native = cast(NativeShape | None, self._native)
            if self._native is False:
                config = await self.client.get_model_config(self.model, **_as_json(self.protocol))
                native = self._remember_shape(config)
            reply = await self.client.infer(self.model, **self._request(item_ids, k, exclude_seen, native, rules))
        return self._answer(reply, native, k)

    async def close(self) -> None:
        await self.client.close()
