"""Triton python model ``recommender_session``: a session ID in (with, optionally, items to append to it
first), that session's top-k IDs and scores out, its history read from the session store.

One append and one read of the store for the whole dynamic batch, then one predictor call. A request
whose session store is down is answered from the items it brought (``history_source`` 1) or refused with
UNAVAILABLE; a bad request gets INVALID_ARG; neither harms the rest of the batch.
"""

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

if (Path(__file__).parent / "recserve").is_dir():  # a packaged repository carries its own copy of recserve
    sys.path.insert(0, str(Path(__file__).parent))

from recserve.constants import (
    INPUT_EVENT_IDS,
    INPUT_EXCLUDE_SEEN,
    INPUT_ITEM_IDS,
    INPUT_K,
    INPUT_SESSION_ID,
    OUTPUT_HISTORY_LENGTH,
    OUTPUT_HISTORY_SOURCE,
    OUTPUT_ITEM_IDS,
    OUTPUT_SCORES,
    OUTPUT_UNKNOWN_IDS,
    STORE_UNAVAILABLE,
)
from recserve.errors import RequestError
from recserve.serving.requests import parse_each, parse_rules, parse_session_request
from recserve.serving.triton_repository.python_models.served_model import load_served
from recserve.sessions.session_histories import session_histories


class TritonPythonModel:
    def initialize(self, args):
        self.predictor, self.store, self.hidden = load_served(args)
        self.window = min(self.store.settings.window, self.predictor.history_limit)

    def finalize(self):
        self.store.close()

    def _parse(self, request):
        inputs = {tensor.name(): tensor.as_numpy() for tensor in request.inputs()}
        if INPUT_SESSION_ID not in inputs:
            raise RequestError(f"missing input '{INPUT_SESSION_ID}'")
        parsed = parse_session_request(
            inputs[INPUT_SESSION_ID],
            inputs.get(INPUT_ITEM_IDS),
            inputs.get(INPUT_K),
            inputs.get(INPUT_EXCLUDE_SEEN),
            self.predictor.max_k,
            self.predictor.string_ids,
            inputs.get(INPUT_EVENT_IDS),
        )
        rules = parse_rules(inputs.get, self.predictor.string_ids)
        if rules is not None:
            self.predictor.rules.check(rules)
        return replace(parsed, rules=rules)

    def execute(self, requests):
        parsed, good = parse_each(requests, self._parse)
        if not good:
            return [self._error(p) for p in parsed]
        if problem := self.hidden.refresh():
            pb_utils.Logger.log_warn(f"recommender_session: the hidden items stay as last read: {problem}")
        found = session_histories(
            self.store,
            [s for p in good for s in p.sessions],
            [e for p in good for e in p.events],
            self.window,
            self.predictor.string_ids,
            [ids for p in good for ids in p.rows_event_ids()],
        )
        exclude = np.concatenate(
            [np.ones(len(p.sessions), dtype=bool) if p.exclude_seen is None else p.exclude_seen for p in good]
        )
        problem = next((err for err in found.failed if err is not None), None)
        if problem is not None:  # once a batch, as recserve's backend logs it, not once a request
            pb_utils.Logger.log_warn(f"recommender_session: {problem}")
        answerable = [i for i, err in enumerate(found.failed) if err is None]
        answers = None
        if answerable:
            histories = [found.histories[i] for i in answerable]
            rules = [r for p in good for r in p.rows_rules()]
            answers = self.predictor.answer(
                histories, max(p.k for p in good), exclude[answerable], [rules[i] for i in answerable]
            ).for_triton()
        position = {row: n for n, row in enumerate(answerable)}  # batch row -> row of the answers
        responses, row = [], 0
        for p in parsed:
            if isinstance(p, RequestError):
                responses.append(self._error(p))
                continue
            rows = range(row, row + len(p.sessions))
            row = rows.stop
            if any(found.failed[r] is not None for r in rows):
                responses.append(self._unavailable())
                continue
            first, stop = position[rows.start], position[rows.stop - 1] + 1
            ids, scores = answers.rows(first, stop, p.k)
            lengths = np.array([[len(found.histories[r])] for r in rows], dtype=np.int32)
            outputs = [
                pb_utils.Tensor(OUTPUT_ITEM_IDS, ids),
                pb_utils.Tensor(OUTPUT_SCORES, scores),
                pb_utils.Tensor(OUTPUT_UNKNOWN_IDS, answers.unknown.astype(np.int32)[first:stop, None]),
                pb_utils.Tensor(OUTPUT_HISTORY_SOURCE, found.sources[rows.start : rows.stop, None]),
                pb_utils.Tensor(OUTPUT_HISTORY_LENGTH, lengths),
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses

    @staticmethod
    def _error(err: RequestError):
        return pb_utils.InferenceResponse(error=pb_utils.TritonError(str(err), pb_utils.TritonError.INVALID_ARG))

    @staticmethod
    def _unavailable():
        # the client learns that the store failed, never its address or keys; the server's log says why
        return pb_utils.InferenceResponse(
            error=pb_utils.TritonError(STORE_UNAVAILABLE, pb_utils.TritonError.UNAVAILABLE)
        )
