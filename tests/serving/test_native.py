"""Triton's native PyTorch and ONNX Runtime backends (built from source by scripts/build_triton_backends.sh,
which `make test` runs) serve TorchScript and ONNX models in the bundled server beside the python backend."""

from pathlib import Path

import numpy as np
import pytest
import torch
import tritonclient.http as httpclient
from tests.conftest import server_settings

from recserve.serving.triton.launcher import TritonServer, native_backends
from recserve.serving.triton.model_config import InstanceGroup, ModelConfig, TensorSpec, to_pbtxt

HISTORY = np.array([[3, 17, 42, 0], [5, 0, 0, 0]], dtype=np.int64)


class TopItems(torch.nn.Module):
    """Histories of item indices (padding 0) in, the top 5 of 50 items out: the shape of a serving graph."""

    def __init__(self):
        super().__init__()
        self.items = torch.nn.Embedding(51, 8, padding_idx=0)

    def forward(self, history: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        query = self.items(history).sum(1)  # (B, 8)
        scores = query @ self.items.weight[1:].T  # (B, 50)
        top_scores, top = scores.topk(5, dim=1)
        return top + 1, top_scores


def _model_dir(tmp_path: Path, backend: str) -> Path:
    if not any(p.name == backend for p in native_backends()):
        pytest.skip(f"the native {backend} backend is not built: scripts/build_triton_backends.sh (make test runs it)")
    torch.manual_seed(0)
    folder = tmp_path / "repo" / "top_items"
    (folder / "1").mkdir(parents=True)
    return folder


def _serve_once(model_dir: Path, backend: str, names: tuple[str, str, str]) -> tuple[np.ndarray, np.ndarray]:
    """Writes the model's config, serves the repository, and asks once for ``HISTORY``'s top items."""
    source, ids, scores = names
    config = ModelConfig(
        "top_items",
        (TensorSpec(source, "INT64", (-1,)),),
        (TensorSpec(ids, "INT64", (5,)), TensorSpec(scores, "FP32", (5,))),
        backend=backend,
        max_batch_size=8,
        instance_groups=(InstanceGroup(count=1, kind="KIND_CPU"),),
    )
    (model_dir / "config.pbtxt").write_text(to_pbtxt(config))
    with TritonServer(model_dir.parent, server_settings()) as server:
        tensor = httpclient.InferInput(source, list(HISTORY.shape), "INT64")
        tensor.set_data_from_numpy(HISTORY)
        reply = httpclient.InferenceServerClient(server.http_url).infer("top_items", [tensor])
    return reply.as_numpy(ids), reply.as_numpy(scores)


def test_the_pytorch_backend_serves_a_torchscript_model_like_python_runs_it(tmp_path):
    model_dir = _model_dir(tmp_path, "pytorch")
    module = torch.jit.trace(TopItems().eval(), torch.ones(2, 4, dtype=torch.int64))
    torch.jit.save(module, model_dir / "1" / "model.pt")
    ids, scores = _serve_once(model_dir, "pytorch", ("INPUT__0", "OUTPUT__0", "OUTPUT__1"))
    expected_ids, expected_scores = module(torch.from_numpy(HISTORY))
    np.testing.assert_array_equal(ids, expected_ids.numpy())
    np.testing.assert_allclose(scores, expected_scores.detach().numpy(), rtol=1e-5)


def test_the_onnxruntime_backend_serves_an_onnx_model_like_onnxruntime_runs_it(tmp_path):
    import onnxruntime

    model_dir = _model_dir(tmp_path, "onnxruntime")
    batch, length = torch.export.Dim("batch", min=1, max=64), torch.export.Dim("length", min=1, max=32)
    torch.onnx.export(
        TopItems().eval(),
        (torch.ones(2, 4, dtype=torch.int64),),
        model_dir / "1" / "model.onnx",
        dynamo=True,
        input_names=["history"],
        output_names=["top", "top_scores"],
        dynamic_shapes={"history": {0: batch, 1: length}},
    )
    ids, scores = _serve_once(model_dir, "onnxruntime", ("history", "top", "top_scores"))
    session = onnxruntime.InferenceSession(str(model_dir / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    expected_ids, expected_scores = session.run(None, {"history": HISTORY})
    np.testing.assert_array_equal(ids, expected_ids)
    np.testing.assert_allclose(scores, expected_scores, rtol=1e-5)
