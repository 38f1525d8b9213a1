"""``recserve status``: the servers ``recserve serve --detach`` started and recserve's embedded stores; ``recserve
stop``: stops detached servers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from recserve.cli.console import console, handle_errors
from recserve.errors import ServingError


def _stores(records) -> list[dict]:
    """The embedded stores to report: the default folder's, and those the detached servers' repositories name."""
    from recserve.artifacts.repository_record import read_repository_info, store_of
    from recserve.cli.store_access import store_dir
    from recserve.sessions import embedded_store

    folders = {store_dir(None)}
    for record in records:
        folder = embedded_store.folder_of(store_of(read_repository_info(Path(record.repo))))
        if folder is not None:
            folders.add(folder)
    out = []
    for folder in sorted(folders):
        running = embedded_store.running(folder)
        url = embedded_store.settings_of(folder).url if running else None
        out.append({"folder": str(folder), "state": "running" if running else "not running", "url": url})
    return out


@handle_errors
def status(
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object: servers and stores.")] = False,
) -> None:
    """What runs: the servers `recserve serve --detach` started (ready or not, their addresses, repository and
    the run it came from, each model's serving versions, logs) and recserve's embedded session stores."""
    from recserve.serving.triton_server.detached import read_records

    records = read_records()
    servers = [record.status() for record in records]
    stores = _stores(records)
    if as_json:
        print(json.dumps({"servers": servers, "stores": stores}, indent=2))
        return
    if not servers:
        console.print("servers: none detached (`recserve serve --repo REPO --detach` starts one)")
    for s in servers:
        console.print(
            f"server {s['host']}:{s['http_port']} (gRPC {s['grpc_port']}, metrics {s['metrics_port']}): {s['state']}, "
            f"process {s['pid']}, since {s['started']}\n  repository {s['repo']}"
            + (f" (from run {s['run']})" if s.get("run") else "")
            + "".join(f"\n  model {m['name']}: version {', '.join(m['versions']) or 'none ready'}" for m in s["models"])
            + f"\n  log {s['triton_log']}",
            markup=False,
            highlight=False,
        )
    for store in stores:
        where = f" at {store['url']}" if store["url"] else ""
        console.print(f"store {store['folder']}: {store['state']}{where}", markup=False, highlight=False)


@handle_errors
def stop(
    http_port: Annotated[
        int | None, typer.Option(help="The HTTP port of the server to stop (needed where more than one runs).")
    ] = None,
    stop_all: Annotated[bool, typer.Option("--all", help="Stop every detached server.")] = False,
    timeout_s: Annotated[float, typer.Option(help="How long in-flight requests get before the server is killed.")] = 60,
) -> None:
    """Stop servers `recserve serve --detach` started: in-flight requests finish first (SIGTERM)."""
    from recserve.serving.triton_server.detached import read_records, stop_server

    records = read_records()
    if http_port is not None:
        records = [r for r in records if r.http_port == http_port]
        if not records:
            raise ServingError(f"no detached server on HTTP port {http_port}; `recserve status` lists them")
    elif not stop_all and len(records) > 1:
        ports = ", ".join(str(r.http_port) for r in records)
        raise ServingError(f"{len(records)} detached servers run (HTTP ports {ports}): give --http-port or --all")
    if not records:
        console.print("no detached server runs")
        return
    for record in records:
        killed = stop_server(record, timeout_s)
        how = "killed after its timeout" if killed else "stopped"
        console.print(f"server on HTTP port {record.http_port} (process {record.pid}): {how}")
