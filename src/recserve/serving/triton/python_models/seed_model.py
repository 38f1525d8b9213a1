"""Seed layout, step 2 (``bert4rec``): tokens in, top-k vocabulary indices and scores out (eager PyTorch)."""

from pathlib import Path

import numpy as np
import torch
import triton_python_backend_utils as pb_utils

from recserve.constants import POPULARITY_FILE, SEED_K, SEED_MODEL_INPUT, SEED_OUTPUT_IDS, SEED_OUTPUT_SCORES
from recserve.models.inference import TopKHead
from recserve.models.runs import load_run
from recserve.serving.triton.placement import instance_device


class TritonPythonModel:
    def initialize(self, args):
        folder = Path(args["model_repository"]) / args["model_version"]
        self.device = torch.device(instance_device(args))
        popularity = np.load(folder / POPULARITY_FILE)
        self.head = TopKHead(load_run(folder), popularity, SEED_K).to(self.device).eval()

    def execute(self, requests):
        responses = []
        for request in requests:
            tokens = torch.from_numpy(pb_utils.get_input_tensor_by_name(request, SEED_MODEL_INPUT).as_numpy())
            tokens = tokens.reshape(1, -1).to(self.device)
            with torch.inference_mode():
                indices, scores = self.head(tokens, torch.zeros(1, dtype=torch.bool, device=self.device))
            responses.append(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor(SEED_OUTPUT_IDS, indices.cpu().numpy()),
                        pb_utils.Tensor(SEED_OUTPUT_SCORES, scores.float().cpu().numpy()),
                    ]
                )
            )
        return responses
