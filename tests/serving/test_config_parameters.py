"""Triton's config parameters are a contract written once (``recserve.artifacts.served.Parameter``): every
parameter the repository's layouts write is one of its names, every python model reads them through
``config_parameters``, and recserve's backend reads exactly ``BACKEND_PARAMETERS`` in C++ (held to its source
here, as the store contract is)."""

import json
import re
from pathlib import Path

from recserve.artifacts.served import BACKEND_PARAMETERS, Parameter, config_parameters

ROOT = Path(__file__).resolve().parents[2]
NAMES = {value for key, value in vars(Parameter).items() if key.isupper()}
# the backends' own settings, which recserve passes through untouched (Triton's PyTorch and ONNX Runtime backends)
THEIRS = {"INFERENCE_MODE", "DISABLE_OPTIMIZED_EXECUTION", "INTRA_OP_THREAD_COUNT", "inter_op_thread_count"}


def test_recserve_backend_reads_exactly_the_parameters_the_contract_gives_it():
    source = (ROOT / "native" / "triton-backend" / "src" / "recserve.cc").read_text()
    read = set(re.findall(r'Parameter\(ModelConfig\(\), "([a-z_]+)"', source))
    assert read == set(BACKEND_PARAMETERS), read ^ set(BACKEND_PARAMETERS)


def test_python_models_read_parameters_only_through_the_contracts_reader():
    models = ROOT / "src" / "recserve" / "serving" / "triton_repository" / "python_models"
    for path in models.glob("*.py"):
        assert '["string_value"]' not in path.read_text(), f"{path.name} reads a parameter by hand"


def test_every_parameter_a_repository_writes_is_a_name_of_the_contract(int_repo):
    written = set()
    for config in int_repo.glob("*/config.pbtxt"):
        written |= set(re.findall(r'parameters\s*\{\s*key: "([A-Za-z_]+)"', config.read_text()))
    assert written and written <= NAMES | THEIRS, written - NAMES - THEIRS
    fused = (int_repo / "recommender" / "config.pbtxt").read_text()
    assert Parameter.EXPORT_DIR in written and '"export_dir"' in fused
    as_json = {"config": {"parameters": {Parameter.MAX_K: {"string_value": "7"}}}}
    assert config_parameters(as_json) == {Parameter.MAX_K: "7"} == config_parameters(json.dumps(as_json))
