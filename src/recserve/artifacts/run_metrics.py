"""A run's ``metrics.json``: what training recorded (the model, the best epoch and its validation, the settings)
and what evaluation added (the test split under each protocol, popularity beside it, the cold targets and the
new items). Updates merge into it; written and read only here."""

from __future__ import annotations

import json
from pathlib import Path

from recserve.constants import METRICS_FILE


def merge_metrics(run_dir: Path, update: dict, replaces: tuple[str, ...] = ()) -> dict:
    """Merges ``update`` into the run's metrics.json (made where there is none) and returns the whole file.
    ``replaces``: keys that ``update`` replaces whole, an earlier value dropped where ``update`` has none (a
    run rerun without its refit keeps no record of the refit)."""
    path = Path(run_dir) / METRICS_FILE
    metrics = read_metrics(run_dir) if path.exists() else {}
    metrics = {key: value for key, value in metrics.items() if key not in replaces} | update
    path.write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n")
    return metrics


def read_metrics(run_dir: Path) -> dict:
    """The run's metrics.json.

    Raises:
        OSError: there is none; ValueError: it is not JSON.
    """
    return json.loads((Path(run_dir) / METRICS_FILE).read_text())
