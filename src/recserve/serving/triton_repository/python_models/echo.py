"""Triton python model ``echo``: the ``recommender`` contract (all three outputs) with a fixed top-k and no compute.

The ceiling that the server stack (protocol, batching, python backend) allows, for benchmarks.
"""

import numpy as np
import triton_python_backend_utils as pb_utils

from recserve.artifacts.served import Parameter, config_parameters
from recserve.constants import OUTPUT_ITEM_IDS, OUTPUT_SCORES, OUTPUT_UNKNOWN_IDS
from recserve.data.vocab import as_bytes_ids
from recserve.errors import RequestError
from recserve.serving.requests import parse_triton_request


class TritonPythonModel:
    def initialize(self, args):
        parameters = config_parameters(args["model_config"])
        self.max_k = int(parameters[Parameter.MAX_K])
        self.string_ids = parameters[Parameter.ITEM_ID_TYPE] == "string"
        ids = np.arange(1, self.max_k + 1)
        self.ids = as_bytes_ids(ids.astype(str)) if self.string_ids else ids
        self.scores = np.linspace(1.0, 0.0, self.max_k, dtype=np.float32)

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                p = parse_triton_request(request, self.max_k, self.string_ids)
            except RequestError as err:
                error = pb_utils.TritonError(str(err), pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            rows = len(p.histories)
            ids = np.broadcast_to(self.ids[: p.k], (rows, p.k))
            scores = np.broadcast_to(self.scores[: p.k], (rows, p.k))
            responses.append(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor(OUTPUT_ITEM_IDS, np.ascontiguousarray(ids)),
                        pb_utils.Tensor(OUTPUT_SCORES, np.ascontiguousarray(scores)),
                        pb_utils.Tensor(OUTPUT_UNKNOWN_IDS, np.zeros((rows, 1), dtype=np.int32)),
                    ]
                )
            )
        return responses
