"""Triton python model ``recommender``: item IDs in, top-k IDs and scores out, over recserve's predictor.

One predictor call for the whole dynamic batch; one response per request; a bad request gets an
INVALID_ARG error response and leaves the rest of the batch unharmed.
"""

import json
import sys
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

if (Path(__file__).parent / "recserve").is_dir():  # a packaged repository carries its own copy of recserve
    sys.path.insert(0, str(Path(__file__).parent))

from recserve.constants import (  # noqa: E402
    INPUT_EXCLUDE_SEEN,
    INPUT_ITEM_IDS,
    INPUT_K,
    OUTPUT_ITEM_IDS,
    OUTPUT_SCORES,
    OUTPUT_UNKNOWN_IDS,
)
from recserve.errors import RequestError  # noqa: E402
from recserve.serving.predictor import Predictor
from recserve.serving.requests import parse_request
from recserve.serving.triton.placement import instance_device


def _input(request, name):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        folder = Path(args["model_repository"]) / args["model_version"] / config["parameters"]["export_dir"]["string_value"]
        self.predictor = Predictor.load(folder, instance_device(args))

    def _parse(self, request):
        try:
            return parse_request(_input(request, INPUT_ITEM_IDS), _input(request, INPUT_K),
                                 _input(request, INPUT_EXCLUDE_SEEN), self.predictor.max_k, self.predictor.string_ids)
        except RequestError as err:
            return err

    def execute(self, requests):
        parsed = [self._parse(r) for r in requests]
        histories, ks, excludes, owners = [], [], [], []
        for i, p in enumerate(parsed):
            if not isinstance(p, RequestError):
                histories += p.histories
                ks += [p.k] * len(p.histories)
                excludes.append(p.exclude_seen)
                owners += [i] * len(p.histories)
        answers = self.predictor.predict(histories, ks, np.concatenate(excludes)) if histories else []
        by_request = {}
        for owner, answer in zip(owners, answers):
            by_request.setdefault(owner, []).append(answer)
        return [self._response(p, by_request.get(i, [])) for i, p in enumerate(parsed)]

    def _response(self, parsed, answers):
        if isinstance(parsed, RequestError):
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(str(parsed), pb_utils.TritonError.INVALID_ARG))
        if len(answers) == 1:  # the common case: one history per request
            ids, scores = answers[0].item_ids[None], answers[0].scores[None]
        else:
            width = min(len(a.item_ids) for a in answers)  # rows differ only when the catalogue runs out
            ids = np.stack([a.item_ids[:width] for a in answers])
            scores = np.stack([a.scores[:width] for a in answers])
        if ids.dtype.kind == "U":
            ids = np.char.encode(ids, "utf-8").astype(np.object_)
        unknown = np.array([[a.unknown_ids] for a in answers], dtype=np.int32)  # Triton 2.51 has no response parameters
        outputs = [pb_utils.Tensor(OUTPUT_ITEM_IDS, ids), pb_utils.Tensor(OUTPUT_SCORES, scores),
                   pb_utils.Tensor(OUTPUT_UNKNOWN_IDS, unknown)]
        return pb_utils.InferenceResponse(output_tensors=outputs)
