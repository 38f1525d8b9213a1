"""Seed layout, step 3 (``bert4rec_postprocessing``): vocabulary indices back to item IDs."""

from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

from recserve.artifacts.catalogue import read_catalogue
from recserve.constants import SEED_INDICES, SEED_OUTPUT_IDS, SEED_OUTPUT_SCORES, SEED_TOP_SCORES
from recserve.data.vocab import Vocab, as_bytes_ids


class TritonPythonModel:
    def initialize(self, args):
        folder = Path(args["model_repository"]) / args["model_version"]
        self.vocab = Vocab(read_catalogue(folder))

    def execute(self, requests):
        responses = []
        for request in requests:
            indices = pb_utils.get_input_tensor_by_name(request, SEED_INDICES).as_numpy().reshape(-1)
            scores = pb_utils.get_input_tensor_by_name(request, SEED_TOP_SCORES).as_numpy().reshape(-1)
            ids = self.vocab.to_ids(indices)
            ids = as_bytes_ids(ids)
            responses.append(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor(SEED_OUTPUT_IDS, ids),
                        pb_utils.Tensor(SEED_OUTPUT_SCORES, scores.astype(np.float32)),
                    ]
                )
            )
        return responses
