"""``recserve data``: an interaction log in, vocabulary, sequences and the split out."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from recserve.cli.console import console, handle_errors
from recserve.cli.options import Settings, takes
from recserve.data.io import Columns
from recserve.data.splits import SplitSettings


@handle_errors
@takes(Settings("columns", (Columns,)), Settings("split", (SplitSettings,)))
def data(
    source: Annotated[
        str,
        typer.Argument(
            help="'ml-100k' (shipped in the recbole wheel), a MovieLens ratings.dat or u.data, a .csv/.parquet "
            "table with user, item and timestamp columns, or a .txt file of 'user item' lines in time order."
        ),
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder to write (replaced atomically).")],
    min_user_interactions: Annotated[int, typer.Option(help="Drop users with fewer interactions (>= 3).")] = 5,
    min_item_interactions: Annotated[int, typer.Option(help="Drop items with fewer interactions.")] = 1,
    rating_threshold: Annotated[
        float | None, typer.Option(help="Keep only ratings at or above this (implicit feedback).")
    ] = None,
    dedup: Annotated[bool, typer.Option(help="Keep only the first interaction of each (user, item) pair.")] = False,
    items: Annotated[
        Path | None,
        typer.Option(
            help="The shop's item table (CSV, Parquet or JSON lines): the item column (--items-id-col) and any "
            "attributes (category, brand, price, flags), which business rules filter on; kept in items.parquet."
        ),
    ] = None,
    items_id_col: Annotated[
        str | None, typer.Option(help="The item table's ID column (default: the log's, --item-col).")
    ] = None,
    unseen_items: Annotated[
        bool,
        typer.Option(
            help="With --items: the table's items that no event names join the catalogue (today's new items: a "
            "model trained with --item-attributes ranks them by their attributes)."
        ),
    ] = False,
    columns: Columns = Columns(),
    split: SplitSettings = SplitSettings(),
) -> None:
    """Prepare an interaction log: item vocabulary, per-user sequences, the split (leave-one-out or by time),
    popularity."""
    from rich.table import Table

    from recserve.data.datasets import PrepareOptions, prepare

    options = PrepareOptions(
        min_user_interactions=min_user_interactions,
        min_item_interactions=min_item_interactions,
        rating_threshold=rating_threshold,
        dedup=dedup,
        columns=columns,
        items=str(items) if items is not None else None,
        items_id_col=items_id_col,
        unseen_items=unseen_items,
        split=split,
    )
    with console.status(f"preparing {source}"):
        info = prepare(source, out, options)
    table = Table(title=f"{source} -> {out}", show_header=False)
    for key in ("users", "items", "interactions", "raw_interactions", "item_id_type"):
        table.add_row(key, f"{info[key]:,}" if isinstance(info[key], int) else str(info[key]))
    described = info["attributes"]
    kinds = ", ".join(f"{name} ({kind})" for name, kind in described["kinds"].items()) or "none"
    table.add_row("attributes", kinds)
    if "items_described" in described:
        table.add_row("items described", f"{described['items_described']:,} of {info['items']:,}")
    cut = info["split"]
    if cut["kind"] == "time":
        table.add_row("split", f"time: test after {cut['test_after']:.15g}, validation after {cut['valid_after']:.15g}")
        table.add_row("held-out users", f"{cut['test_users']:,} test, {cut['valid_users']:,} validation")
    console.print(table)
