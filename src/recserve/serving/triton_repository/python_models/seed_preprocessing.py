"""Seed layout, step 1 (``bert4rec_preprocessing``): item IDs to vocabulary indices, mask token appended.

The PoC's design, kept for compatibility and as the baseline: one request at a time, no batching.
"""

from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

from recserve.artifacts.catalogue import read_catalogue
from recserve.artifacts.served import Parameter, config_parameters
from recserve.constants import SEED_INPUT, SEED_TOKENS
from recserve.data.vocab import Vocab


class TritonPythonModel:
    def initialize(self, args):
        folder = Path(args["model_repository"]) / args["model_version"]
        self.vocab = Vocab(read_catalogue(folder))
        self.history_limit = int(config_parameters(args["model_config"])[Parameter.WINDOW]) - 1

    def execute(self, requests):
        responses = []
        for request in requests:
            ids = pb_utils.get_input_tensor_by_name(request, SEED_INPUT).as_numpy().reshape(-1)[-self.history_limit :]
            tokens = np.append(self.vocab.lookup(ids), self.vocab.mask_index)[None, :]  # (1, L + 1)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor(SEED_TOKENS, tokens.astype(np.int64))]))
        return responses
