"""Triton python model ``events``: a shopper's events into the session store, and nothing else. Each row a
session ID, the items to append in order (padded on the right with -1, or empty strings) and, optionally, the
client's ID of each (``event_ids``: the request sent again stores them once); how many of the row's items the
store acknowledged comes back (``stored``).

One append for the whole dynamic batch; a bad request gets INVALID_ARG, a store that is down UNAVAILABLE for
every request of the batch (nothing of it acknowledged), and neither harms another request.
"""

import sys
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

if (Path(__file__).parent / "recserve").is_dir():  # a packaged repository carries its own copy of recserve
    sys.path.insert(0, str(Path(__file__).parent))

from recserve.constants import (
    DEFAULT_MAX_K,
    INPUT_EVENT_IDS,
    INPUT_ITEM_IDS,
    INPUT_SESSION_ID,
    OUTPUT_STORED,
    STORE_UNAVAILABLE,
)
from recserve.errors import RequestError, StoreError
from recserve.serving.requests import parse_each, parse_session_request
from recserve.serving.triton_repository.python_models.served_model import load_store
from recserve.sessions.session_histories import row_events


class TritonPythonModel:
    def initialize(self, args):
        self.store, id_type = load_store(args)
        self.string_ids = id_type == "string"

    def finalize(self):
        self.store.close()

    def _parse(self, request):
        inputs = {tensor.name(): tensor.as_numpy() for tensor in request.inputs()}
        for name in (INPUT_SESSION_ID, INPUT_ITEM_IDS):
            if name not in inputs:
                raise RequestError(f"missing input '{name}'")
        return parse_session_request(
            inputs[INPUT_SESSION_ID],
            inputs[INPUT_ITEM_IDS],
            None,
            None,
            DEFAULT_MAX_K,
            self.string_ids,
            inputs.get(INPUT_EVENT_IDS),
        )

    def execute(self, requests):
        parsed, good = parse_each(requests, self._parse)
        events = row_events(
            [s for p in good for s in p.sessions],
            [e for p in good for e in p.events],
            [ids for p in good for ids in p.rows_event_ids()],
        )
        owner = [(n, row) for n, p in enumerate(good) for row, items in enumerate(p.events) for _ in range(len(items))]
        try:
            result = self.store.append(events)
        except StoreError as err:
            pb_utils.Logger.log_warn(f"events: {err}")
            result = None
        acknowledged = np.ones(len(events), dtype=bool)
        if result is not None and result.errors:
            acknowledged[[position for position, _ in result.errors]] = False
        owners = np.array(owner, dtype=np.int64).reshape(-1, 2)  # (events, 2): request, row
        responses, n = [], 0
        for p in parsed:
            if isinstance(p, RequestError):
                responses.append(self._error(p, pb_utils.TritonError.INVALID_ARG))
                continue
            if result is None:  # the client learns that the store failed, never its address or keys
                responses.append(self._error(STORE_UNAVAILABLE, pb_utils.TritonError.UNAVAILABLE))
                n += 1
                continue
            mine = (owners[:, 0] == n) & acknowledged
            stored = np.bincount(owners[mine, 1], minlength=len(p.sessions)).astype(np.int32)[:, None]
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(OUTPUT_STORED, stored)]))
            n += 1
        return responses

    @staticmethod
    def _error(message, code):
        return pb_utils.InferenceResponse(error=pb_utils.TritonError(str(message), code))
