"""The SageMaker path: the handler's four functions, packaging for both containers, a local endpoint run by
the SageMaker PyTorch toolkit over TorchServe, and deployment against a moto server over real HTTP."""

import json
import os
import socket
import subprocess
import sys
import tarfile
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import numpy as np
import pytest
from tests.conftest import model_top_ids, needs_native_backends, server_settings
from typer.testing import CliRunner

from recserve.cli.main import app
from recserve.client import RecommenderClient
from recserve.errors import ServingError
from recserve.export.exporter import export_run
from recserve.pipeline import package_from_run
from recserve.processes import free_ports
from recserve.serving.predictor import Predictor
from recserve.serving.sagemaker import handler
from recserve.serving.sagemaker.endpoint import LocalEndpoint, invoke, ping
from recserve.serving.sagemaker.handler import HandlerError, input_fn, model_fn, output_fn, predict_fn
from recserve.serving.sagemaker.package import package, pytorch_environment, unpack
from recserve.serving.triton_server.launcher import TritonServer

JSON = "application/json"


@pytest.fixture(scope="module")
def bert_package(tiny_export, tmp_path_factory):
    return package(tiny_export, "pytorch", tmp_path_factory.mktemp("pkg") / "model.tar.gz")["package"]


@pytest.fixture(scope="module")
def bert_model(bert_package, tmp_path_factory):
    return model_fn(str(unpack(bert_package, tmp_path_factory.mktemp("unpacked"))))


def handle(model, body, content_type=JSON, accept=JSON):
    return json.loads(output_fn(predict_fn(input_fn(body, content_type), model), accept)[0])


def test_the_four_functions_answer_a_json_request(bert_model, tiny_run):
    history = np.load(tiny_run / "item_ids.npy")[:3].tolist()
    answer = handle(bert_model, json.dumps({"item_id": history, "k": 7}).encode())
    assert len(answer["item_id"]) == len(answer["score"]) == 7
    assert not set(history) & set(answer["item_id"]) and answer["score"] == sorted(answer["score"], reverse=True)
    assert len(handle(bert_model, json.dumps({"item_id": history}))["item_id"]) == 10  # k defaults to 10
    assert output_fn({"item_id": [1]}, "application/json; charset=utf-8")[1] == JSON
    # IDs as strings, to a model of integer IDs: read as its catalogue holds them (no type to be told)
    assert handle(bert_model, json.dumps({"item_id": [str(i) for i in history], "k": 7}).encode()) == answer
    with pytest.raises(HandlerError, match="integer IDs expected for this model .int64., got 'sku-1'") as err:
        handle(bert_model, json.dumps({"item_id": ["sku-1"]}).encode())
    assert err.value.status_code == 400


@pytest.mark.parametrize(("run", "name"), [("vae_run", "multvae"), ("sasrec_run", "sasrec")])
def test_multvae_and_sasrec_run_through_the_same_handler(run, name, request, tmp_path):
    run = request.getfixturevalue(run)
    model = model_fn(str(unpack(package_from_run(run, "pytorch", tmp_path / "m.tar.gz")["package"], tmp_path / "u")))
    history = np.load(run / "item_ids.npy")[[1, 10, 100]].tolist()
    answer = handle(model, json.dumps({"item_id": history, "k": 20}))
    assert len(answer["item_id"]) == 20 and not set(history) & set(answer["item_id"])
    assert model.manifest.model == name
    export_run(run, "eager", "fp32", tmp_path / "export")  # the framework-free predictor, in this process
    [own] = Predictor.load(tmp_path / "export").predict([np.array(history)], k=20)
    assert answer["item_id"] == own.item_ids.tolist()
    np.testing.assert_allclose(answer["score"], own.scores, rtol=1e-5)
    if name == "sasrec":  # and the model's own scores, mapped through the run's ID table
        want, clear = model_top_ids(run, [np.array(history)])
        assert clear[0] and answer["item_id"][:10] == want[0].tolist()


@pytest.mark.parametrize(
    ("body", "content_type", "status", "message"),
    [
        (b'{"item_id": [1]}', "text/csv", 415, "content type 'text/csv' is not supported"),
        (b'{"item_id": [1', JSON, 400, "malformed JSON"),
        (b"[1, 2]", JSON, 400, "expected a JSON object"),
        (b'{"items": [1]}', JSON, 400, "missing key 'item_id'"),
        (b'{"item_id": 5}', JSON, 400, "item_id: expected a list"),
        (b'{"item_id": [1, "a"]}', JSON, 400, "all integers or all strings"),
        (b'{"item_id": [1.5]}', JSON, 400, "got float"),
        (b'{"item_id": [1], "k": "3"}', JSON, 400, "k: expected an integer"),
        (b'{"item_id": [1], "k": true}', JSON, 400, "k: expected an integer"),
        (b'{"item_id": [1], "exclude_seen": 1}', JSON, 400, "exclude_seen: expected true or false"),
        (b"\xff\xfe", JSON, 400, "not UTF-8"),
    ],
)
def test_bad_requests_get_a_4xx_naming_the_problem(body, content_type, status, message):
    with pytest.raises(HandlerError) as err:
        input_fn(body, content_type)
    assert err.value.status_code == status and message in err.value.message


def test_k_out_of_range_and_an_unsupported_accept_are_client_errors(bert_model):
    with pytest.raises(HandlerError, match="k: 0 is out of range") as err:
        predict_fn(input_fn(b'{"item_id": [1], "k": 0}', JSON), bert_model)
    assert err.value.status_code == 400
    with pytest.raises(HandlerError, match="accept 'text/csv'") as err:
        output_fn({"item_id": [1], "score": [0.5]}, "text/csv")
    assert err.value.status_code == 406


def test_errors_are_posted_to_the_hook_when_one_is_configured(monkeypatch):
    received = []

    class Hook(BaseHTTPRequestHandler):
        def do_POST(self):
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv(handler.ERROR_HOOK_ENV, f"http://127.0.0.1:{server.server_port}/errors")
        with pytest.raises(HandlerError):
            input_fn(b'{"items": []}', JSON)
        deadline = time.monotonic() + 5
        while not received and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        server.shutdown()
    assert received and received[0]["status"] == 400 and "missing key 'item_id'" in received[0]["message"]
    assert received[0]["context"] == {"content_type": JSON, "body_bytes": 13}


def test_pytorch_package_has_the_container_layout(bert_package, tmp_path):
    with tarfile.open(bert_package) as tar:
        names = set(tar.getnames())
    assert {
        "export.json",
        "model.pt",
        "model_config.json",
        "item_ids.npy",
        "code/inference.py",
        "code/requirements.txt",
        "code/recserve/serving/sagemaker/handler.py",
    } <= names
    assert not any("__pycache__" in n for n in names)
    unpacked = unpack(bert_package, tmp_path / "u")
    # as the container runs it: code/ first on the path, the handler module loaded from there, the model
    # directory the package's root; the recserve it imports is the package's own copy
    script = (
        "import json, sys; sys.path.insert(0, 'code'); import inference, recserve; "
        "model = inference.model_fn('.'); "
        "body = inference.input_fn(json.dumps({'item_id': [1, 2, 3], 'k': 4}), 'application/json'); "
        "print(recserve.__file__); print(inference.output_fn(inference.predict_fn(body, model), 'application/json')[0])"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=unpacked, capture_output=True, text=True, check=True)
    where, body = done.stdout.strip().splitlines()[-2:]
    assert Path(where).resolve().is_relative_to((unpacked / "code").resolve())
    assert len(json.loads(body)["item_id"]) == 4


@needs_native_backends
def test_triton_package_is_the_native_layout_that_a_real_triton_serves(tiny_run, tmp_path):
    summary = package_from_run(tiny_run, "triton", tmp_path / "model.tar.gz")  # through a torchscript export
    assert summary["backend"] == "torchscript" and summary["layout"] == "native"
    assert summary["environment"] == {"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "recommender_native"}
    repo = unpack(tmp_path / "model.tar.gz", tmp_path / "repo")
    assert sorted(p.name for p in repo.iterdir()) == ["recommender_native"]  # model folders only
    assert sorted(p.name for p in (repo / "recommender_native" / "1").iterdir()) == ["model.pt"]  # no Python at all
    history = np.load(tiny_run / "item_ids.npy")[:4].tolist()
    with (
        TritonServer(repo, server_settings()) as server,
        RecommenderClient(server.grpc_url, model="recommender_native") as client,
    ):
        answer = client.recommend(history, k=5)
    assert len(answer.item_ids) == 5 and not set(history) & set(answer.item_ids.tolist())


def test_a_triton_package_of_string_ids_is_refused_naming_the_runtime_that_serves_them(string_run, tmp_path):
    """SageMaker's Triton container installs no Python packages, so the fused layout would fail to load."""
    from recserve.export.exporter import export_run

    with pytest.raises(ServingError, match="string IDs.*would fail to load.*--runtime pytorch"):
        package_from_run(string_run, "triton", tmp_path / "model.tar.gz")  # before anything is exported
    export_run(string_run, "onnx", "fp32", tmp_path / "onnx")
    with pytest.raises(ServingError, match="no native model \\(string IDs\\).*--runtime pytorch"):
        package(tmp_path / "onnx", "triton", tmp_path / "model.tar.gz")
    assert not (tmp_path / "model.tar.gz").exists()
    assert package_from_run(string_run, "pytorch", tmp_path / "model.tar.gz")["runtime"] == "pytorch"


def test_deploy_names_the_model_the_triton_package_holds(tiny_run, bert_package, tmp_path):
    from recserve.serving.sagemaker.package import triton_model_name

    summary = package_from_run(tiny_run, "triton", tmp_path / "model.tar.gz")
    assert (
        triton_model_name(tmp_path / "model.tar.gz")
        == "recommender_native"
        == summary["environment"]["SAGEMAKER_TRITON_DEFAULT_MODEL_NAME"]
    )
    with pytest.raises(ServingError, match="not a triton-runtime package.*code"):
        triton_model_name(bert_package)  # a pytorch package


def test_a_triton_package_asks_for_the_endpoints_instances_not_this_machines_cores(tiny_run, tmp_path):
    """The packaging machine's cores say nothing of the endpoint's; the container runs Triton's own backends."""
    from recserve.constants import PACKAGE_INSTANCES
    from recserve.serving.sagemaker.package import inspect_package
    from recserve.serving.triton_repository.pbtxt import parse_pbtxt

    def config(count):
        out = tmp_path / f"model-{count}.tar.gz"
        package_from_run(tiny_run, "triton", out, instances=count)
        info = inspect_package(out)
        assert not info.on_gpus
        return parse_pbtxt(info.config)

    default, three = config(None), config(3)
    assert [g.count for g in default.instance_group] == [PACKAGE_INSTANCES["cpu"]]
    assert [g.count for g in three.instance_group] == [3]
    assert default.platform == "pytorch_libtorch" and not default.backend  # Triton's PyTorch backend
    export_run(tiny_run, "onnx", "fp32", tmp_path / "onnx")  # an onnx native model: its one backend
    package(tmp_path / "onnx", "triton", tmp_path / "onnx.tar.gz")
    onnx = parse_pbtxt(inspect_package(tmp_path / "onnx.tar.gz").config)
    assert onnx.platform == "onnxruntime_onnx" and [g.count for g in onnx.instance_group] == [PACKAGE_INSTANCES["cpu"]]
    with pytest.raises(ServingError, match="instances 0: must be at least 1"):
        package(tmp_path / "nowhere", "triton", tmp_path / "m.tar.gz", instances=0)


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a GPU is here: the package can be made")
def test_a_gpu_package_needs_a_gpu_to_trace_on_and_says_so(tiny_run, tmp_path):
    from recserve.errors import ExportError

    with pytest.raises(ExportError, match="no CUDA device is available here; use --device cpu"):
        package_from_run(tiny_run, "triton", tmp_path / "model.tar.gz", device="gpu")
    assert not (tmp_path / "model.tar.gz").exists()


def test_an_unknown_device_is_refused_for_either_source_and_runtime(tiny_export, tiny_run, tmp_path):
    from recserve.errors import ConfigError
    from recserve.pipeline import package as package_either

    for source in ({"export": tiny_export}, {"run": tiny_run}):
        with pytest.raises(ConfigError, match="device 'tpu': expected cpu or gpu"):
            package_either(tmp_path / "m.tar.gz", "pytorch", device="tpu", **source)
    assert not (tmp_path / "m.tar.gz").exists()


@pytest.mark.parametrize(
    ("on_gpus", "instance_type", "level"),
    [
        (True, "ml.c5.xlarge", "error"),
        (False, "ml.g5.xlarge", "warning"),
        (True, "ml.p4d.24xlarge", None),
        (False, "ml.m5.large", None),
    ],
)
def test_a_package_and_an_instance_type_that_disagree_are_named(on_gpus, instance_type, level):
    from recserve.deploy.sagemaker.cloud import instance_mismatch

    found = instance_mismatch(on_gpus, instance_type)
    assert (found and found[0]) == level
    if found:
        assert instance_type in found[1] and "--device" in found[1]


@pytest.mark.parametrize(
    ("runtime", "out", "message"),
    [("tensorflow", "m.tar.gz", "runtime 'tensorflow'"), ("pytorch", "m.zip", "must be a .tar.gz")],
)
def test_bad_package_requests_are_refused(tiny_export, tiny_run, tmp_path, runtime, out, message):
    with pytest.raises(ServingError, match=message):
        package(tiny_export, runtime, tmp_path / out)
    with pytest.raises(ServingError, match=message):  # refused before the run is exported
        package_from_run(tiny_run, runtime, tmp_path / out)
    assert not (tmp_path / out).exists()


def test_a_package_takes_only_exports_its_container_can_run(tiny_run, string_run, tmp_path):
    from recserve.errors import ExportError
    from recserve.export.exporter import export_run

    export_run(tiny_run, "onnx", "fp32", tmp_path / "onnx")
    with pytest.raises(
        ServingError, match="the pytorch runtime serves eager exports, not onnx; export with --backend eager"
    ):
        package(tmp_path / "onnx", "pytorch", tmp_path / "m.tar.gz")
    with pytest.raises(ExportError, match="no export.json"):
        package(tiny_run, "pytorch", tmp_path / "m.tar.gz")
    export_run(string_run, "torchscript", "fp32", tmp_path / "strings")
    with pytest.raises(ServingError, match="no native model \\(string IDs\\).*package it with --runtime pytorch"):
        package(tmp_path / "strings", "triton", tmp_path / "m.tar.gz")
    assert not (tmp_path / "m.tar.gz").exists()


def test_a_broken_package_is_refused_clearly(tmp_path):
    (tmp_path / "model.tar.gz").write_bytes(b"not a tarball")
    with pytest.raises(ServingError, match="not a readable model.tar.gz"):
        unpack(tmp_path / "model.tar.gz", tmp_path / "out")


@pytest.fixture(scope="module")
def endpoint(bert_package):
    [port] = free_ports(1)
    with LocalEndpoint(bert_package, port=port) as running:
        yield running


def test_local_endpoint_answers_ping_and_invocations(endpoint, tiny_run):
    assert ping(endpoint.url) == 200
    history = np.load(tiny_run / "item_ids.npy")[:3].tolist()
    status, body = invoke(endpoint.url, json.dumps({"item_id": history, "k": 5}).encode())
    answer = json.loads(body)
    want, clear = model_top_ids(tiny_run, [np.array(history)])  # the model's own top items
    assert status == 200 and clear[0] and answer["item_id"] == want[0][:5].tolist()


def test_the_endpoint_keeps_torchserves_config_in_its_folder_with_recserves_batching(endpoint):
    """The toolkit would write /etc/sagemaker-ts.properties (root only); here it lands in the work folder,
    with the container settings deploy gives the model: batches of 16 within 1 ms, one worker."""
    config = endpoint.workdir / "sagemaker-ts.properties"
    assert f"'--ts-config', '{config}'" in endpoint.log_path.read_text()
    text = config.read_text()
    assert '"batchSize": 16' in text and '"maxBatchDelay": 1' in text and '"maxWorkers": 1' in text
    assert "inference_address=http://127.0.0.1:" in text


def test_a_batch_answers_each_request_with_its_own_status_and_the_models_answer(endpoint, bert_model, tiny_run):
    """48 requests at once, a quarter of them bad: TorchServe batches them (up to 16), and each gets its own
    answer (the in-process handler's, one request at a time) or its own 4xx; the toolkit's own transform
    would answer a batch holding a bad request with 503 for every request in it."""
    ids = np.load(tiny_run / "item_ids.npy")
    good = [json.dumps({"item_id": ids[i : i + 1 + i % 9].tolist(), "k": 1 + i % 10}).encode() for i in range(36)]
    bad = [
        (b"{oops", JSON, 400, "malformed JSON"),
        (b'{"item_id": [1], "k": 0}', JSON, 400, "out of range"),
        (b'{"item_id": ["sku-1"]}', JSON, 400, "integer IDs"),
        (b'{"item_id": [1]}', "text/csv", 415, "not supported"),
    ] * 3
    requests = [(body, JSON, 200, None) for body in good] + bad
    order = np.random.default_rng(0).permutation(len(requests))
    replies: dict[int, tuple[int, bytes]] = {}

    def send(i: int) -> None:
        body, content_type, _, _ = requests[i]
        replies[i] = invoke(endpoint.url, body, content_type)

    threads = [threading.Thread(target=send, args=(int(i),)) for i in order]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for i, (body, _, status, message) in enumerate(requests):
        got_status, got = replies[i]
        assert got_status == status, (body, got)
        if message is None:  # a batch pads its rows to its longest: scores equal to float32 rounding
            answer, want = json.loads(got), handle(bert_model, body)
            assert answer["item_id"] == want["item_id"] and answer["unknown_item_ids"] == want["unknown_item_ids"]
            np.testing.assert_allclose(answer["score"], want["score"], atol=1e-5)
        else:
            assert message in json.loads(got)["error"]


def test_the_load_generator_counts_every_answer_by_its_status(endpoint):
    """benchmarks/sagemaker_endpoint.py's Python client: closed loop over keep-alive connections, for a
    bounded time, each answer counted under its status."""
    from recserve.bench.http_load import measure

    bodies = [(b'{"item_id": [1, 2], "k": 3}', JSON), (b"{oops", JSON)]
    result = measure("127.0.0.1", endpoint.port, "/invocations", bodies, connections=4, seconds=1.0, warmup_s=0.2)
    assert set(result.statuses) == {"200", "400"} and result.statuses["200"] > 10
    assert result.requests == sum(result.statuses.values()) and result.throughput_rps == result.requests
    assert 0 < result.p50_ms <= result.p99_ms
    with pytest.raises(ValueError, match="connection"):
        measure("127.0.0.1", endpoint.port, "/invocations", bodies, connections=0, seconds=1.0)


@pytest.mark.parametrize(
    ("body", "content_type", "status", "message"),
    [
        (b"{oops", JSON, 400, "malformed JSON"),
        (b'{"x": 1}', JSON, 400, "missing key 'item_id'"),
        (b'{"item_id": [1]}', "text/csv", 415, "not supported"),
        (b'{"item_id": [1], "k": 1000}', JSON, 400, "out of range"),
    ],
)
def test_local_endpoint_refuses_bad_bodies_with_a_short_message(endpoint, body, content_type, status, message):
    got_status, got = invoke(endpoint.url, body, content_type)
    assert got_status == status and message in json.loads(got)["error"]
    assert b"Traceback" not in got
    assert invoke(endpoint.url, b'{"item_id": []}')[0] == 200  # and the endpoint keeps serving


def test_invoke_command_talks_to_the_local_endpoint(endpoint, tiny_run):
    history = [str(i) for i in np.load(tiny_run / "item_ids.npy")[:2]]
    result = CliRunner().invoke(app, ["sagemaker", "invoke", *history, "--k", "3", "--url", endpoint.url])
    assert result.exit_code == 0, result.output
    want, clear = model_top_ids(tiny_run, [np.array(history, dtype=np.int64)])
    assert clear[0] and json.loads(result.output)["item_id"] == want[0][:3].tolist()
    # IDs are sent as typed and read as the model's catalogue holds them: an ID that is no number, for an
    # integer-ID model, is the endpoint's one-line 400, and the endpoint keeps serving
    refused = CliRunner().invoke(app, ["sagemaker", "invoke", history[0], "sku-1", "--url", endpoint.url])
    said = " ".join(refused.output.split())
    assert refused.exit_code == 1 and "answered 400" in said and "integer IDs expected for this model" in said
    assert "--string-ids" not in CliRunner().invoke(app, ["sagemaker", "invoke", "--help"]).output


def _wait_port(port: int, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError(f"nothing listens on {port}")


@pytest.fixture(scope="module")
def moto(tmp_path_factory):
    """moto's server mode on loopback: SageMaker and S3 APIs over real HTTP."""
    [port] = free_ports(1)
    binary = os.path.join(os.path.dirname(sys.executable), "moto_server")
    process = subprocess.Popen(
        [binary, "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        _wait_port(port)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(10)


@pytest.fixture
def aws_env(moto, monkeypatch, tmp_path):
    import boto3

    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(key, value)
    boto3.client("s3", region_name="us-east-1", endpoint_url=moto).create_bucket(Bucket="models")
    env_file = tmp_path / ".env.inference"
    env_file.write_text(
        "RECSERVE_SAGEMAKER_ROLE_ARN=arn:aws:iam::123456789012:role/recserve\n"
        "RECSERVE_SAGEMAKER_IMAGE_URI=763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-inference:2.5-gpu-py311\n"
        "RECSERVE_SAGEMAKER_MODEL_DATA=s3://models/recserve/model.tar.gz\n"
        "RECSERVE_SAGEMAKER_INSTANCE_TYPE=ml.g4dn.xlarge\n"  # moto 5.2.5 predates ml.g5 (the default)
        f"RECSERVE_SAGEMAKER_ENDPOINT_URL={moto}\n"
    )
    return env_file


def test_deploy_uploads_creates_and_waits_for_in_service(aws_env, moto, bert_package):
    import boto3

    runner = CliRunner()
    result = runner.invoke(
        app, ["sagemaker", "deploy", "--package", bert_package, "--env-file", str(aws_env), "--endpoint-name", "recs"]
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["status"] == "InService"
    sm = boto3.client("sagemaker", region_name="us-east-1", endpoint_url=moto)
    endpoint = sm.describe_endpoint(EndpointName="recs")
    config = sm.describe_endpoint_config(EndpointConfigName=endpoint["EndpointConfigName"])
    variant = config["ProductionVariants"][0]
    assert variant["InstanceType"] == "ml.g4dn.xlarge" and variant["InitialInstanceCount"] == 1
    model = sm.describe_model(ModelName=variant["ModelName"])
    assert model["PrimaryContainer"]["Environment"] == pytorch_environment(workers=1)
    assert model["PrimaryContainer"]["Environment"]["SAGEMAKER_PROGRAM"] == "inference.py"
    assert model["PrimaryContainer"]["ModelDataUrl"] == "s3://models/recserve/model.tar.gz"
    s3 = boto3.client("s3", region_name="us-east-1", endpoint_url=moto)
    assert s3.head_object(Bucket="models", Key="recserve/model.tar.gz")["ContentLength"] == os.path.getsize(
        bert_package
    )
    # the invocation reaches the endpoint (moto answers with placeholder text, not a model's answer)
    result = runner.invoke(
        app, ["sagemaker", "invoke", "1", "2", "--env-file", str(aws_env), "--endpoint-name", "recs"]
    )
    assert result.exit_code == 0, result.output


def test_deploy_warns_that_a_cpu_package_leaves_the_instance_types_gpu_idle(
    aws_env, moto, tiny_run, tmp_path, monkeypatch
):
    package_from_run(tiny_run, "triton", tmp_path / "model.tar.gz")
    monkeypatch.setenv("RECSERVE_SAGEMAKER_RUNTIME", "triton")
    result = CliRunner().invoke(
        app,
        [
            "sagemaker",
            "deploy",
            "--package",
            str(tmp_path / "model.tar.gz"),
            "--env-file",
            str(aws_env),
            "--endpoint-name",
            "cpu-on-gpu",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "warning: the package's model runs on CPUs, so the GPU of ml.g4dn.xlarge would sit idle" in " ".join(
        result.output.split()
    )


def test_deploy_settings_come_from_the_environment_before_the_file(aws_env, monkeypatch):
    from recserve.deploy.sagemaker.cloud import load_settings

    monkeypatch.setenv("RECSERVE_SAGEMAKER_INSTANCE_TYPE", "ml.g6.xlarge")
    settings = load_settings(aws_env)
    assert settings.instance_type == "ml.g6.xlarge" and settings.model_data == "s3://models/recserve/model.tar.gz"


def test_missing_or_bad_settings_get_one_error_naming_them(tmp_path, monkeypatch):
    from recserve.deploy.sagemaker.cloud import deploy, load_settings

    monkeypatch.chdir(tmp_path)  # no .env.inference here
    with pytest.raises(ServingError, match="role_arn, model_data"):
        deploy(load_settings())
    with pytest.raises(ServingError, match="model_data.*expected s3://bucket/key.*instance_count"):
        load_settings(model_data="/local/model.tar.gz", instance_count=0)
