"""Triton's native PyTorch and ONNX Runtime backends (built from source by scripts/build_triton_backends.sh,
which `make test` runs) serve TorchScript and ONNX models in the bundled server beside the python backend."""

import numpy as np
import pytest
import torch
import tritonclient.http as httpclient
from tests.conftest import server_settings

from recserve.serving.triton.launcher import TritonServer, native_backends
from recserve.serving.triton.model_config import InstanceGroup, ModelConfig, TensorSpec, to_pbtxt


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


def test_the_pytorch_backend_serves_a_torchscript_model_like_python_runs_it(tmp_path):
    if not any(p.name == "pytorch" for p in native_backends()):
        pytest.skip("the native PyTorch backend is not built: scripts/build_triton_backends.sh (make test runs it)")
    torch.manual_seed(0)
    module = torch.jit.trace(TopItems().eval(), torch.ones(2, 4, dtype=torch.int64))
    model_dir = tmp_path / "repo" / "top_items"
    (model_dir / "1").mkdir(parents=True)
    torch.jit.save(module, model_dir / "1" / "model.pt")
    config = ModelConfig(
        "top_items",
        (TensorSpec("INPUT__0", "INT64", (-1,)),),
        (TensorSpec("OUTPUT__0", "INT64", (5,)), TensorSpec("OUTPUT__1", "FP32", (5,))),
        backend="pytorch",
        max_batch_size=8,
        instance_groups=(InstanceGroup(count=1, kind="KIND_CPU"),),
    )
    (model_dir / "config.pbtxt").write_text(to_pbtxt(config))
    history = np.array([[3, 17, 42, 0], [5, 0, 0, 0]], dtype=np.int64)
    with TritonServer(tmp_path / "repo", server_settings()) as server:
        client = httpclient.InferenceServerClient(server.http_url)
        tensor = httpclient.InferInput("INPUT__0", list(history.shape), "INT64")
        tensor.set_data_from_numpy(history)
        reply = client.infer("top_items", [tensor])
    expected_ids, expected_scores = module(torch.from_numpy(history))
    np.testing.assert_array_equal(reply.as_numpy("OUTPUT__0"), expected_ids.numpy())
    np.testing.assert_allclose(reply.as_numpy("OUTPUT__1"), expected_scores.detach().numpy(), rtol=1e-5)


def test_the_onnxruntime_backend_serves_an_onnx_model_like_onnxruntime_runs_it(tmp_path):
    import onnxruntime

    if not any(p.name == "onnxruntime" for p in native_backends()):
        pytest.skip(
            "the native ONNX Runtime backend is not built: scripts/build_triton_backends.sh (make test runs it)"
        )
    torch.manual_seed(0)
    model_dir = tmp_path / "repo" / "top_items"
    (model_dir / "1").mkdir(parents=True)
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
    config = ModelConfig(
        "top_items",
        (TensorSpec("history", "INT64", (-1,)),),
        (TensorSpec("top", "INT64", (5,)), TensorSpec("top_scores", "FP32", (5,))),
        backend="onnxruntime",
        max_batch_size=8,
        instance_groups=(InstanceGroup(count=1, kind="KIND_CPU"),),
    )
    (model_dir / "config.pbtxt").write_text(to_pbtxt(config))
    history = np.array([[3, 17, 42, 0], [5, 0, 0, 0]], dtype=np.int64)
    with TritonServer(tmp_path / "repo", server_settings()) as server:
        client = httpclient.InferenceServerClient(server.http_url)
        tensor = httpclient.InferInput("history", list(history.shape), "INT64")
        tensor.set_data_from_numpy(history)
        reply = client.infer("top_items", [tensor])
    session = onnxruntime.InferenceSession(str(model_dir / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    expected_ids, expected_scores = session.run(None, {"history": history})
    np.testing.assert_array_equal(reply.as_numpy("top"), expected_ids)
    np.testing.assert_allclose(reply.as_numpy("top_scores"), expected_scores, rtol=1e-5)
