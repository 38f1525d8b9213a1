"""The SageMaker PyTorch runtime's local endpoint under load, beside Triton's native layout, one run, one host.

Endpoints, each alone on the machine while it is measured, all driven by one client: wrk where it is installed
(``--client wrk``, the default then: C, one thread, a Lua script cycling through the bodies), else
``recserve.bench.http_load`` (Python: its own cost per request is several times wrk's, so on 2 cores it caps
what it can show); either way closed loop, keep-alive HTTP/1.1, JSON bodies:
- ``pytorch``: ``recserve sagemaker serve`` of the run's pytorch package with recserve's container settings
  (TorchServe batching, the handler's batch transform, one thread a worker: ``package.pytorch_environment``);
- ``pytorch-unbatched``: the same package with the container's own defaults for batching and threads
  (``SAGEMAKER_TS_BATCH_SIZE=1``, torch's default of a thread a core), what an endpoint got before;
- ``triton-native``: ``recserve serve`` of the run's native layout (the model SageMaker's Triton runtime
  serves), the KServe v2 JSON body of ``recserve sagemaker invoke`` posted to its HTTP endpoint.

One JSON file: {"device", "model", "settings", "results": {endpoint: [LoadResult per concurrency]}}.

    python benchmarks/sagemaker_endpoint.py --run runs/demo/run \
        --out benchmarks/results/cpu-2core-sagemaker/endpoints.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import tempfile
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from recserve.artifacts.served import NativeShape
from recserve.bench.http_load import measure
from recserve.bench.synthetic import synthetic_histories
from recserve.constants import ITEM_TABLE_FILE, NATIVE_MODEL
from recserve.pipeline import package_from_run, repository_from_run
from recserve.processes import free_ports
from recserve.serving.sagemaker.endpoint import LocalEndpoint
from recserve.serving.sagemaker.invocations import pytorch_request, triton_request
from recserve.serving.triton_repository.repository_settings import RepositorySettings
from recserve.serving.triton_server.launcher import ServerSettings, TritonServer

ENDPOINTS = ("pytorch", "pytorch-unbatched", "triton-native")
# one request a message, torch with a thread a core (its default): what the container does by itself
UNBATCHED = {"SAGEMAKER_TS_BATCH_SIZE": "1", "OMP_NUM_THREADS": str(len(os.sched_getaffinity(0)))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", type=Path, required=True, help="a training run (recserve train --out)")
    parser.add_argument("--out", type=Path, required=True, help="the JSON file to write")
    parser.add_argument("--concurrency", default="1,16,64", help="connections, comma-separated")
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds a level (after 1 s warm-up)")
    parser.add_argument("--endpoints", default=",".join(ENDPOINTS), help=f"of {', '.join(ENDPOINTS)}")
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--client", choices=("wrk", "python"), default="wrk" if shutil.which("wrk") else "python")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    endpoints = args.endpoints.split(",")
    if unknown := set(endpoints) - set(ENDPOINTS):
        parser.error(f"unknown endpoints {sorted(unknown)}; expected some of {', '.join(ENDPOINTS)}")
    table = np.load(args.run / ITEM_TABLE_FILE, allow_pickle=False)
    histories = [table[h - 1].tolist() for h in synthetic_histories(len(table), count=500, max_length=40)]
    results = {}
    with tempfile.TemporaryDirectory(prefix="sagemaker-bench-") as tmp:
        package = Path(tmp) / "model.tar.gz"
        package_from_run(args.run, "pytorch", package)
        for name in endpoints:
            if name == "triton-native":
                with native_server(args.run, Path(tmp) / "repo") as (port, shape):
                    bodies = [triton_request(h, args.k, shape) for h in histories]
                    results[name] = sweep("127.0.0.1", port, f"/v2/models/{NATIVE_MODEL}/infer", bodies, levels, args)
            else:
                bodies = [pytorch_request(h, args.k) for h in histories]
                with environment(UNBATCHED if name == "pytorch-unbatched" else {}):
                    [port] = free_ports(1)
                    with LocalEndpoint(package, port=port):
                        results[name] = sweep("127.0.0.1", port, "/invocations", bodies, levels, args)
            for row in results[name]:
                print(
                    f"{name:18} c={row['connections']:<3} {row['throughput_rps']:8.0f} req/s"
                    f"  p50 {row['p50_ms']:6.2f} ms  p99 {row['p99_ms']:7.2f} ms  {row['statuses']}",
                    flush=True,
                )
    result = {
        "device": f"{platform.processor() or platform.machine()}, {len(os.sched_getaffinity(0))} cores",
        "model": json.loads((args.run / "model_config.json").read_text()) | {"items": len(table)},
        "settings": vars(args) | {"run": str(args.run), "out": str(args.out)},
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


def sweep(host: str, port: int, path: str, bodies, levels: list[int], args) -> list[dict]:
    if args.client == "python":
        return [measure(host, port, path, bodies, c, args.seconds).to_dict() for c in levels]
    return [wrk(host, port, path, bodies, c, args.seconds) for c in levels]


WRK_SCRIPT = """
local bodies = {%s}
local types = {%s}
local n = 0
request = function()
  n = n %% #bodies + 1
  return wrk.format("POST", "%s", {["Content-Type"] = types[n], ["Accept"] = "application/json"}, bodies[n])
end
done = function(summary, latency, requests)
  local statuses = summary.errors.status
  io.write(string.format("WRK-JSON {\\"requests\\": %%d, \\"non2xx\\": %%d, \\"socket_errors\\": %%d, " ..
    "\\"p50_us\\": %%d, \\"p90_us\\": %%d, \\"p99_us\\": %%d, \\"duration_us\\": %%d}\\n",
    summary.requests, statuses, summary.errors.connect + summary.errors.read + summary.errors.write +
    summary.errors.timeout, latency:percentile(50), latency:percentile(90), latency:percentile(99), summary.duration))
end
"""


def wrk(host: str, port: int, path: str, bodies, connections: int, seconds: float) -> dict:
    """One wrk measurement (after a 1 s warm-up run) in ``LoadResult``'s keys."""
    quote = lambda text: "[==[" + text + "]==]"  # noqa: E731 - Lua long strings hold any JSON
    script = WRK_SCRIPT % (
        ",".join(quote(body.decode()) for body, _ in bodies),
        ",".join(quote(kind) for _, kind in bodies),
        path,
    )
    with tempfile.NamedTemporaryFile("w", suffix=".lua") as lua:
        lua.write(script)
        lua.flush()
        url = f"http://{host}:{port}{path}"
        base = ["wrk", "-t1", f"-c{connections}", "-s", lua.name, "--timeout", "30s", url]
        subprocess.run([*base[:3], "-d1s", *base[3:]], capture_output=True, check=True)
        out = subprocess.run([*base[:3], f"-d{seconds:g}s", *base[3:]], capture_output=True, text=True, check=True)
    line = next(x for x in out.stdout.splitlines() if x.startswith("WRK-JSON "))
    raw = json.loads(line.removeprefix("WRK-JSON "))
    took = raw["duration_us"] / 1e6
    ok = raw["requests"] - raw["non2xx"]
    statuses = {"2xx": ok, "non-2xx": raw["non2xx"], "error": raw["socket_errors"]}
    return {
        "connections": connections,
        "seconds": took,
        "requests": raw["requests"],
        "throughput_rps": raw["requests"] / took,
        **{f"p{q}_ms": raw[f"p{q}_us"] / 1e3 for q in (50, 90, 99)},
        "statuses": {key: value for key, value in statuses.items() if value},
    }


@contextmanager
def environment(changes: dict[str, str]):
    saved = dict(os.environ)
    os.environ.update(changes)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextmanager
def native_server(run: Path, repo: Path):
    """The run's native layout served on loopback: its HTTP port and the model's shape."""
    repository_from_run(run, repo, ("native",), RepositorySettings(device="cpu"))
    http, grpc, metrics = free_ports(3)
    settings = ServerSettings(http_port=http, grpc_port=grpc, metrics_port=metrics)
    server = TritonServer(repo, settings, log_path=repo.parent / "tritonserver.log").start()
    try:
        server.wait_ready(180)
        with urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/models/{NATIVE_MODEL}/config") as reply:
            shape = NativeShape.from_config(json.loads(reply.read()))
        assert shape is not None
        yield http, shape
    finally:
        server.stop()


if __name__ == "__main__":
    main()
