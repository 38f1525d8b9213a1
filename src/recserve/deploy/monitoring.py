"""Prometheus scrape configuration, alerting rules and a Grafana dashboard for Triton's metrics.

Triton (2.51) counts requests and cumulative microseconds per model (``nv_inference_request_success``,
``nv_inference_request_failure``, ``nv_inference_request_duration_us``, ``nv_inference_queue_duration_us``,
...): the mean latency and queue time come from those. Started with latency quantiles (``recserve serve
--latency-quantiles``, ``RECSERVE_K8S_LATENCY_QUANTILES``) it also keeps ``nv_inference_request_summary_us``,
what the p50 and p99 panels and the p99 alert read; they cost the server a stall each 500 requests under
load, so they are off by default.
"""

from __future__ import annotations

from typing import Any

from recserve.constants import METRICS_PORT

JOB = "recserve-triton"

# Grafana panels and alert expressions share these queries (PromQL; per model)
QUERIES = {
    "requests_per_s": "sum by (model) (rate(nv_inference_request_success[1m]))",
    "mean_ms": "sum by (model) (rate(nv_inference_request_duration_us[1m]))"
    " / clamp_min(sum by (model) (rate(nv_inference_request_success[1m])), 1e-9) / 1000",
    "queue_ms": "sum by (model) (rate(nv_inference_queue_duration_us[1m]))"
    " / clamp_min(sum by (model) (rate(nv_inference_request_success[1m])), 1e-9) / 1000",
    "failure_ratio": "sum by (model) (rate(nv_inference_request_failure[5m]))"
    " / clamp_min(sum by (model) (rate(nv_inference_request_success[5m]))"
    " + sum by (model) (rate(nv_inference_request_failure[5m])), 1e-9)",
    "batch_size": "sum by (model) (rate(nv_inference_count[1m]))"
    " / clamp_min(sum by (model) (rate(nv_inference_exec_count[1m])), 1e-9)",
    "gpu_utilization": "avg by (gpu_uuid) (nv_gpu_utilization)",
}
QUANTILE_QUERIES = {  # only where the server keeps latency quantiles
    "p50_ms": 'max by (model) (nv_inference_request_summary_us{quantile="0.5"}) / 1000',
    "p99_ms": 'max by (model) (nv_inference_request_summary_us{quantile="0.99"}) / 1000',
}


def queries(quantiles: bool = False) -> dict[str, str]:
    """The dashboard's queries: ``QUERIES``, and ``QUANTILE_QUERIES`` where the server keeps quantiles."""
    return QUERIES | (QUANTILE_QUERIES if quantiles else {})


def scrape_config(
    targets: list[str] | None = None, pods_dns: str | None = None, interval_s: int = 15
) -> dict[str, Any]:
    """prometheus.yml: Triton's metrics port from ``targets`` (host:port), else every pod behind the headless
    Service ``pods_dns`` (DNS discovery: one A record per ready pod; works with any Prometheus build)."""
    job: dict[str, Any] = {"job_name": JOB, "scrape_interval": f"{interval_s}s", "metrics_path": "/metrics"}
    if targets:
        job["static_configs"] = [{"targets": targets}]
    else:
        job["dns_sd_configs"] = [{"names": [pods_dns], "type": "A", "port": METRICS_PORT}]
    return {"global": {"evaluation_interval": f"{interval_s}s"}, "rule_files": ["alerts.yml"], "scrape_configs": [job]}


def alert_rules(
    mean_ms: float = 5.0,
    queue_ms: float = 5.0,
    failure_ratio: float = 0.01,
    p99_ms: float = 10.0,
    quantiles: bool = False,
) -> dict[str, Any]:
    """alerts.yml: mean latency, queue time, failure rate and a target that stopped answering; with
    ``quantiles`` (the server keeps latency quantiles) p99 latency too."""

    def alert(name: str, expr: str, duration: str, summary: str) -> dict[str, Any]:
        return {
            "alert": name,
            "expr": expr,
            "for": duration,
            "labels": {"severity": "page"},
            "annotations": {"summary": summary},
        }

    return {
        "groups": [
            {
                "name": "recserve",
                "rules": [
                    alert(
                        "RecserveLatencyHigh",
                        f"{QUERIES['mean_ms']} > {mean_ms:g}",
                        "5m",
                        f"mean latency of {{{{ $labels.model }}}} above {mean_ms:g} ms",
                    ),
                    *(
                        [
                            alert(
                                "RecserveP99LatencyHigh",
                                f"{QUANTILE_QUERIES['p99_ms']} > {p99_ms:g}",
                                "5m",
                                f"p99 latency of {{{{ $labels.model }}}} above {p99_ms:g} ms",
                            )
                        ]
                        if quantiles
                        else []
                    ),
                    alert(
                        "RecserveQueueTimeHigh",
                        f"{QUERIES['queue_ms']} > {queue_ms:g}",
                        "5m",
                        f"requests of {{{{ $labels.model }}}} wait more than {queue_ms:g} ms in the queue",
                    ),
                    alert(
                        "RecserveFailureRateHigh",
                        f"{QUERIES['failure_ratio']} > {failure_ratio:g}",
                        "5m",
                        f"more than {failure_ratio:.0%} of {{{{ $labels.model }}}}'s requests fail",
                    ),
                    alert(
                        "RecserveTargetDown",
                        f'up{{job="{JOB}"}} == 0',
                        "1m",
                        "a Triton replica stopped answering scrapes",
                    ),
                ],
            }
        ]
    }


def grafana_dashboard(title: str = "recserve", quantiles: bool = False) -> dict[str, Any]:
    """A Grafana dashboard (JSON model) with one time-series panel per query in ``queries(quantiles)``."""
    units = {
        "requests_per_s": "reqps",
        "mean_ms": "ms",
        "p50_ms": "ms",
        "p99_ms": "ms",
        "queue_ms": "ms",
        "failure_ratio": "percentunit",
        "batch_size": "none",
        "gpu_utilization": "percentunit",
    }
    panels = []
    for index, (name, expr) in enumerate(queries(quantiles).items()):
        panels.append(
            {
                "id": index + 1,
                "type": "timeseries",
                "title": name.replace("_", " "),
                "datasource": {"type": "prometheus", "uid": "${datasource}"},
                "gridPos": {"h": 8, "w": 12, "x": 12 * (index % 2), "y": 8 * (index // 2)},
                "fieldConfig": {"defaults": {"unit": units[name]}, "overrides": []},
                "targets": [
                    {"refId": "A", "expr": expr, "legendFormat": "{{model}}" if "model" in expr else "{{gpu_uuid}}"}
                ],
            }
        )
    return {
        "title": title,
        "uid": "recserve",
        "schemaVersion": 39,
        "version": 1,
        "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": [{"name": "datasource", "type": "datasource", "query": "prometheus"}]},
        "panels": panels,
    }
