"""The training curves of a run: each logged metric per epoch from Lightning's CSV log, and ``curves.png``."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)


def curves(csv_path: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each logged metric (``train_loss``, ``val_*``) per epoch from Lightning's CSV log: name -> (epochs
    counted from 1, values); empty when there is no log."""
    import polars as pl

    if not csv_path.exists():
        return {}
    frame = pl.read_csv(csv_path, infer_schema_length=None)
    out = {}
    for column in sorted(c for c in frame.columns if c == "train_loss" or c.startswith("val_")):
        rows = frame.filter(pl.col(column).is_not_null())
        out[column] = (rows["epoch"].to_numpy() + 1, rows[column].to_numpy())
    return out


def plot_curves(csv_path: Path, png_path: Path) -> None:
    """Training loss and the validation metrics per epoch, from Lightning's CSV log."""
    try:
        import matplotlib
    except ImportError:
        log.warning("no %s: matplotlib is not installed (pip install 'recserve[train]')", png_path.name)
        return

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = curves(csv_path)
    if not series:
        return
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    if "train_loss" in series:
        ax1.plot(*series.pop("train_loss"), marker="o")
    ax1.set(title="training loss", xlabel="epoch", ylabel="loss")
    for column, (epochs, values) in series.items():
        ax2.plot(epochs, values, marker="o", label=column.removeprefix("val_"))
    if series:
        ax2.legend()
    ax2.set(title="validation (full ranking, seen items excluded)", xlabel="epoch")
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    plt.close(fig)
