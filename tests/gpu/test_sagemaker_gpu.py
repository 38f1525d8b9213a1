"""SageMaker's triton runtime on a GPU (run on a GPU machine; skipped elsewhere): `recserve sagemaker package
--device gpu` traces the graph on this GPU and writes KIND_GPU model instances, and the bundled Triton, run as
the Triton container runs it, loads the package and answers `recserve sagemaker invoke` in both of its
protocols with the model's own top items."""

import numpy as np
import pytest
import torch
from tests.conftest import model_top_ids, require_native
from tests.serving.test_sagemaker_triton import _inside_namespace

from recserve.constants import PACKAGE_INSTANCES
from recserve.serving.sagemaker.package import inspect_package
from recserve.serving.triton_repository.pbtxt import parse_pbtxt, pb

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

# Inside the namespace: loopback up, the endpoint started, each history sent in JSON and in binary form with
# `recserve sagemaker invoke`'s own request and answer code (a GPU host need not have the CLI's packages).
INSIDE = r"""
import fcntl, json, socket, struct, sys
from pathlib import Path
with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:  # SIOCSIFFLAGS lo: up, loopback, running
    fcntl.ioctl(s, 0x8914, struct.pack("16sH", b"lo", 0x1 | 0x8 | 0x40))
from recserve.serving.sagemaker.endpoint import TritonEndpoint, invoke
from recserve.serving.sagemaker.package import inspect_package
from recserve.serving.sagemaker.invocations import triton_answer, triton_request
package, histories = Path(sys.argv[1]), json.loads(sys.argv[2])
shape = inspect_package(package).native_shape(package)
with TritonEndpoint(package, port=18080) as endpoint:
    for history in histories:
        for binary in (False, True):
            status, body = invoke(endpoint.url, *triton_request(history, 10, shape, binary=binary))
            print(json.dumps({"status": status, "answer": triton_answer(body, 10, shape) if status == 200 else None,
                              "body": body.decode(errors="replace")[:500]}))
"""


def test_a_gpu_package_loads_on_the_gpu_and_answers_with_the_models_own_items(tmp_path):
    from recserve.bench.synthetic import make_random_run
    from recserve.pipeline import package_from_run

    require_native("pytorch")
    run = make_random_run(tmp_path / "run", num_items=5_000, hidden=64, layers=2, heads=2, window=20)
    package = tmp_path / "model.tar.gz"
    package_from_run(run, "triton", package, device="gpu")
    info = inspect_package(package)
    assert info.on_gpus
    [group] = parse_pbtxt(info.config or "").instance_group
    assert group.kind == pb.ModelInstanceGroup.Kind.Value("KIND_GPU") and group.count == PACKAGE_INSTANCES["gpu"]

    rng = np.random.default_rng(0)
    histories = [rng.integers(1, 5_001, n).tolist() for n in (1, 5, 12, 19)]
    results = _inside_namespace(package, histories, script=INSIDE)
    want, clear = model_top_ids(run, [np.array(h) for h in histories])
    assert clear.any()
    for row, history in enumerate(histories):
        for result in results[2 * row : 2 * row + 2]:  # JSON, then binary
            assert result["status"] == 200, result["body"]
            if clear[row]:
                assert result["answer"]["item_id"] == want[row].tolist(), history
