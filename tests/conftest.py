"""Shared fixtures: the prepared ML-100K folder and small synthetic logs."""

from __future__ import annotations

from pathlib import Path

import pytest

from recserve.data.datasets import prepare


@pytest.fixture(scope="session")
def ml100k_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ml100k") / "data"
    prepare("ml-100k", out)
    return out
