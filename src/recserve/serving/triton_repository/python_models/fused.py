"""Triton python model ``recommender``: item IDs in, top-k IDs and scores out, over recserve's predictor.

One predictor call for the whole dynamic batch; one response per request; a bad request gets an
INVALID_ARG error response and leaves the rest of the batch unharmed.
"""

import sys
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

if (Path(__file__).parent / "recserve").is_dir():  # a packaged repository carries its own copy of recserve
    sys.path.insert(0, str(Path(__file__).parent))

from recserve.constants import OUTPUT_ITEM_IDS, OUTPUT_SCORES, OUTPUT_UNKNOWN_IDS
from recserve.errors import RequestError
from recserve.serving.requests import exclude_flags, parse_each, parse_triton_request
from recserve.serving.triton_repository.python_models.served_model import load_served


class TritonPythonModel:
    def initialize(self, args):
        self.predictor, self.store, self.hidden = load_served(args)

    def finalize(self):
        if self.store is not None:
            self.store.close()

    def _parse(self, request):
        parsed = parse_triton_request(request, self.predictor.max_k, self.predictor.string_ids)
        if parsed.rules is not None:
            self.predictor.rules.check(parsed.rules)
        return parsed

    def execute(self, requests):
        parsed, good = parse_each(requests, self._parse)
        if not good:
            return [self._error(p) for p in parsed]
        if self.hidden is not None and (problem := self.hidden.refresh()):
            pb_utils.Logger.log_warn(f"recommender: the hidden items stay as last read: {problem}")
        histories = [h for p in good for h in p.histories]
        rules = [r for p in good for r in p.rows_rules()]
        answers = self.predictor.answer(histories, max(p.k for p in good), exclude_flags(good), rules).for_triton()
        unknown = answers.unknown.astype(np.int32)[:, None]  # Triton 2.51 has no response parameters
        responses, row = [], 0
        for p in parsed:
            if isinstance(p, RequestError):
                responses.append(self._error(p))
                continue
            stop = row + len(p.histories)
            ids, scores = answers.rows(row, stop, p.k)
            outputs = [
                pb_utils.Tensor(OUTPUT_ITEM_IDS, ids),
                pb_utils.Tensor(OUTPUT_SCORES, scores),
                pb_utils.Tensor(OUTPUT_UNKNOWN_IDS, unknown[row:stop]),
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
            row = stop
        return responses

    @staticmethod
    def _error(err: RequestError):
        return pb_utils.InferenceResponse(error=pb_utils.TritonError(str(err), pb_utils.TritonError.INVALID_ARG))
