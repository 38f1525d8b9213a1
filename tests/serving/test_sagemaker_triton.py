"""The triton runtime as SageMaker's Triton container runs it: `recserve sagemaker serve` starts the bundled
Triton with its SageMaker frontend on the package, and `recserve sagemaker invoke` speaks KServe v2 to
/invocations (JSON and Triton's binary form), printing the pytorch runtime's answer shape.

Triton 2.51's SageMaker frontend binds every interface and has no address option, so each test runs the
server and its clients inside a network namespace of their own (``unshare --net``), where the loopback
interface is the only one: nothing listens beyond this machine.
"""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tests.conftest import model_top_ids, require_native

# Run inside the namespace: loopback up, the endpoint started, each case's CLI output as JSON lines.
INSIDE = r"""
import fcntl, json, os, socket, struct, subprocess, sys, urllib.request
from pathlib import Path
with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:  # SIOCSIFFLAGS lo: up, loopback, running
    fcntl.ioctl(s, 0x8914, struct.pack("16sH", b"lo", 0x1 | 0x8 | 0x40))
from recserve.serving.sagemaker.endpoint import TritonEndpoint
package, cases = Path(sys.argv[1]), json.loads(sys.argv[2])
recserve = str(Path(sys.executable).parent / "recserve")
with TritonEndpoint(package, port=18080) as endpoint:
    for case in cases:
        if case[0] == "raw":  # a body of our own, straight to /invocations
            request = urllib.request.Request(endpoint.url + "/invocations", data=case[1].encode(),
                                             headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=30) as reply:
                    print(json.dumps({"status": reply.status, "body": reply.read().decode()}))
            except urllib.error.HTTPError as err:
                print(json.dumps({"status": err.code, "body": err.read().decode()}))
            continue
        done = subprocess.run([recserve, "sagemaker", *case, "--url", endpoint.url], capture_output=True, text=True,
                              env=os.environ | {"COLUMNS": "200"})
        print(json.dumps({"rc": done.returncode, "out": done.stdout, "err": done.stderr}))
"""


@pytest.fixture(scope="module")
def triton_package(tiny_run, tmp_path_factory) -> Path:
    from recserve.pipeline import package_from_run

    require_native("pytorch")
    out = tmp_path_factory.mktemp("sagemaker-triton") / "model.tar.gz"
    package_from_run(tiny_run, "triton", out)
    return out


def _inside_namespace(package: Path, cases: list, script: str = INSIDE) -> list[dict]:
    """Runs ``script`` (``INSIDE`` or one like it: the package and the cases as JSON its arguments) in a
    network namespace of its own; its JSON lines back."""
    if shutil.which("unshare") is None:
        pytest.fail("unshare (util-linux) is needed to keep Triton's SageMaker frontend off the network")
    probe = subprocess.run(["unshare", "--net", "--map-root-user", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"no network namespace can be made here ({probe.stderr.strip()}); the frontend binds 0.0.0.0")
    done = subprocess.run(
        ["unshare", "--net", "--map-root-user", sys.executable, "-c", script, str(package), json.dumps(cases)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def test_the_triton_runtime_answers_invoke_in_its_own_protocol(triton_package, tiny_run):
    ids = np.load(tiny_run / "item_ids.npy")
    history = [int(x) for x in ids[[3, 17, 42, 5]]]
    invoke = ["invoke", *map(str, history), "--k", "10", "--package", str(triton_package)]
    cases = [
        invoke,  # KServe v2 JSON
        [*invoke, "--binary"],  # Triton's binary form
        ["invoke", *map(str, history), "--k", "0", "--package", str(triton_package)],  # refused before sending
        ["invoke", "1", "--k", "3"],  # the pytorch runtime's body: Triton's frontend refuses it
        ["raw", json.dumps({"inputs": [{"name": "k", "shape": [1, 1], "datatype": "INT32", "data": [3]}]})],
        ["raw", "{not json"],
    ]
    json_answer, binary_answer, bad_k, wrong_protocol, missing, broken = _inside_namespace(triton_package, cases)
    expected, clear = model_top_ids(tiny_run, [history])
    for answer in (json_answer, binary_answer):
        assert answer["rc"] == 0, answer
        body = json.loads(answer["out"])
        assert set(body) == {"item_id", "score", "unknown_item_ids"} and body["unknown_item_ids"] == 0
        if clear[0]:
            assert body["item_id"] == expected[0].tolist()
        assert len(body["item_id"]) == 10 and body["score"] == sorted(body["score"], reverse=True)
    assert json.loads(json_answer["out"]) == json.loads(binary_answer["out"])
    assert bad_k["rc"] != 0 and "k: 0 is out of range; allowed 1..100" in bad_k["out"] + bad_k["err"]
    # Triton 2.51's frontend answers a body without "inputs" with a 500 that names the member
    said = wrong_protocol["out"] + wrong_protocol["err"]
    assert wrong_protocol["rc"] != 0 and "answered 500" in said and "non-existing object member 'inputs'" in said
    assert missing["status"] == 400 and "missing required input(s) ['item_ids','exclude_seen']" in missing["body"]
    assert broken["status"] == 500 and "error" in json.loads(broken["body"])  # not JSON: Triton's 500 too


def test_invoke_of_a_triton_endpoint_needs_its_package_and_serve_refuses_what_is_no_package(tmp_path):
    from typer.testing import CliRunner

    from recserve.cli.main import app

    runner = CliRunner()
    missing = runner.invoke(app, ["sagemaker", "serve", "--model", str(tmp_path / "none.tar.gz")])
    assert missing.exit_code != 0 and "not a readable model.tar.gz" in missing.output
    (tmp_path / "env").write_text(
        "RECSERVE_SAGEMAKER_RUNTIME=triton\n"
        "RECSERVE_SAGEMAKER_ROLE_ARN=arn:aws:iam::123456789012:role/recserve\n"
        "RECSERVE_SAGEMAKER_IMAGE_URI=785573368785.dkr.ecr.us-east-1.amazonaws.com/sagemaker-tritonserver:24.10-py3\n"
        "RECSERVE_SAGEMAKER_MODEL_DATA=s3://models/recserve/model.tar.gz\n"
    )
    result = runner.invoke(
        app, ["sagemaker", "invoke", "1", "--env-file", str(tmp_path / "env")], env={"COLUMNS": "200"}
    )
    assert result.exit_code != 0 and "pass the package it serves (--package model.tar.gz)" in result.output
