"""``recserve recommend``: top-k for a history from a running server."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Annotated

import typer

from recserve.artifacts.served import Rules
from recserve.cli.console import console, err_console, handle_errors, history_ids
from recserve.cli.options import Settings, takes
from recserve.constants import (
    FUSED_MODEL,
    GRPC_PORT,
    HISTORY_FROM_REQUEST,
    HTTP_PORT,
    NATIVE_MODEL,
    NATIVE_SESSION_MODEL,
    OUTPUT_UNKNOWN_IDS,
    SESSION_MODEL,
)


def _titles(path: Path | None) -> dict:
    if path is None or not path.exists():
        return {}
    import polars as pl

    items = pl.read_parquet(path)
    return dict(zip(items["item_id"].to_list(), items["title"].to_list())) if "title" in items.columns else {}


def _say_values_no_item_holds(where: str, items: Path) -> None:
    """A line for each value of the written rule that no item of ``items`` (an items.parquet) holds, naming the
    closest ones: an answer short for that reason is said, not left to look like the model's."""
    import polars as pl
    from rich.markup import escape

    from recserve.artifacts.item_table import attributes_of
    from recserve.rules.language import RuleError, parse, values_no_item_holds

    try:
        lines = values_no_item_holds(parse(where), attributes_of(pl.read_parquet(items)))
    except (RuleError, OSError, pl.exceptions.PolarsError):
        return  # the server has said what is wrong with the rule; a table that cannot be read checks nothing
    for line in lines:
        err_console.print(f"[yellow]warning:[/] {escape(line)}", highlight=False, soft_wrap=True)


@handle_errors
@takes(Settings("rules", (Rules,)))
def recommend(
    item_ids: Annotated[
        list[str] | None,
        typer.Argument(help="The shopper's recent item IDs, oldest first (with --session: appended to it first)."),
    ] = None,
    k: Annotated[int, typer.Option("--k", "-k", help="How many items to return.")] = 10,
    url: Annotated[
        str | None, typer.Option(help=f"host:port (default 127.0.0.1:{GRPC_PORT} gRPC, :{HTTP_PORT} HTTP).")
    ] = None,
    protocol: Annotated[str, typer.Option(help="grpc or http.")] = "grpc",
    include_seen: Annotated[bool, typer.Option(help="Allow items of the history in the answer.")] = False,
    items: Annotated[Path | None, typer.Option(help="items.parquet for titles (a data or run folder's).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    model: Annotated[
        str,
        typer.Option(
            help=f"The served model: {FUSED_MODEL} (fused layout) or {NATIVE_MODEL} (native layout); with --session "
            f"{SESSION_MODEL} (session layout, the default) or {NATIVE_SESSION_MODEL} (native_session layout)."
        ),
    ] = FUSED_MODEL,
    session: Annotated[
        str | None,
        typer.Option(help="Ask by session instead: the session model answers from its store, ITEM_IDS appended first."),
    ] = None,
    rules: Rules = Rules(),
) -> None:
    """Ask the `recommender` model (or another of its contract, --model) for the next items after ITEM_IDS,
    or, with --session, the session layout for the next items of that session."""
    from rich.table import Table

    from recserve.client import RecommenderClient
    from recserve.client.triton import Recommendations

    extra: dict = {}
    with RecommenderClient(url, protocol, model=model) as client:
        if session is not None:
            model = SESSION_MODEL if model == FUSED_MODEL else model
        string_ids = client.id_type(model) == "string"  # the model says which IDs it takes
        history = history_ids(item_ids or [], string_ids)
        asked = None
        if rules.given:  # the listed IDs as the model takes them
            as_model = lambda ids: history_ids(list(ids), string_ids) if ids else None  # noqa: E731
            asked = dataclasses.replace(rules, exclude=as_model(rules.exclude), include=as_model(rules.include))
        if session is not None:
            by_session = client.recommend_session(
                session, history, k=k, exclude_seen=not include_seen, model=model, rules=asked
            )
            extra = {"history_source": by_session.history_source, "history_length": by_session.history_length}
            answer: Recommendations = by_session
        else:
            answer = client.recommend(history, k=k, exclude_seen=not include_seen, rules=asked)
    if session is not None and history:  # the request's items went into the session: say so
        extra["appended"] = len(history)
    if asked is not None and len(answer.item_ids) < k:  # the rules let fewer through: said, never silent
        extra["note"] = f"the rules let {len(answer.item_ids)} of the {k} items asked for through"
    if extra.get("history_source") == HISTORY_FROM_REQUEST:
        extra["note"] = "the session store is down: answered from the request's items alone"
    if rules.where and items is not None:
        _say_values_no_item_holds(rules.where, items)
    if as_json:
        print(
            json.dumps(
                {
                    "item_id": answer.item_ids.tolist(),
                    "score": answer.scores.tolist(),
                    OUTPUT_UNKNOWN_IDS: answer.unknown_ids,
                }
                | extra
            )
        )
        return
    if extra.get("appended"):
        console.print(f"{extra['appended']} item(s) appended to session {session!r} first", highlight=False)
    if asked is not None and extra.get("note"):
        console.print(extra["note"], highlight=False)
    titles = _titles(items)
    length = extra.get("history_length", len(history))
    source = {0: "", 1: ", the store down: the request's items alone"}.get(extra.get("history_source", 0), "")
    table = Table(
        title=f"top {len(answer.item_ids)} after {length} items"
        + (f" of session {session}{source}" if session is not None else "")
        + (f" ({answer.unknown_ids} unknown dropped)" if answer.unknown_ids else "")
    )
    for column in ("rank", "item_id", "score", *(("title",) if titles else ())):
        table.add_column(column)
    for rank, (item, score) in enumerate(zip(answer.item_ids.tolist(), answer.scores.tolist()), 1):
        table.add_row(str(rank), str(item), f"{score:.3f}", *((str(titles.get(item, "")),) if titles else ()))
    console.print(table)
