"""Reading a pydantic-settings object (SageMaker deployment, Kubernetes manifests) with one clear error."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

from pydantic_settings import BaseSettings

from recserve.errors import ServingError

S = TypeVar("S", bound=BaseSettings)


def read_settings(cls: type[S], env_file: Path | str | None, **overrides: Any) -> S:
    """``cls`` from ``overrides`` (None: not given), then its environment variables and ``env_file``, then its
    defaults; every missing or bad setting is reported in a single ServingError."""
    from pydantic import ValidationError

    try:
        given = {k: v for k, v in overrides.items() if v is not None}
        return cls(_env_file=env_file, **given)
    except ValidationError as err:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors())
        prefix = cls.model_config.get("env_prefix", "")
        raise ServingError(
            f"bad deployment settings ({problems}); set them as {prefix}<NAME> or in {env_file}"
        ) from err
