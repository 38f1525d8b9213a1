"""``recserve events``: shoppers' events into the session store, one by one, from a file, or a prepared data
folder's histories in bulk; and what the store holds of a session."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from recserve.cli.console import console, err_console, handle_errors
from recserve.cli.store_access import PasswordEnvOption, StoreOption, open_store

app = typer.Typer(
    help="Events into the session store (a view, a cart, a purchase), and what it holds of a session.",
    no_args_is_help=True,
)


def repository_id_type(repo: Path | None) -> str | None:
    """The item ID type of ``repo``'s catalogue (None without a repository, or where its record does not say).

    Raises:
        typer.BadParameter: a folder that `recserve repo` did not write.
    """
    if repo is None:
        return None
    from recserve.artifacts.repository_record import catalogue_id_type, has_record

    if not has_record(repo):
        raise typer.BadParameter(f"{repo}: not a repository written by `recserve repo`", param_hint="--repo")
    return catalogue_id_type(repo)


def read_events(path: Path) -> tuple[list, list[int], list[tuple[int, str]]]:
    """Events of a JSON-lines file ({"session", "item", "time"?, "kind"?} a line): the events, the line
    number of each, and each unreadable line by its number with the reason."""
    from recserve.sessions.session_store import Event

    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        reason = err.strerror if isinstance(err, OSError) else "not UTF-8 text"
        raise typer.BadParameter(f"{path}: cannot read events from it ({reason})", param_hint="--file") from None
    events, lines, errors = [], [], []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            events.append(Event(row["session"], row["item"], row.get("time"), row.get("kind"), row.get("event_id")))
            lines.append(number)
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            errors.append((number, f"not an event ({type(err).__name__}: {err})"))
    return events, lines, errors


@app.command()
@handle_errors
def send(
    session: Annotated[str | None, typer.Argument(help="The session (or user) ID.")] = None,
    items: Annotated[list[str] | None, typer.Argument(help="Item IDs, in the order they happened.")] = None,
    kind: Annotated[str | None, typer.Option(help="view, cart or purchase.")] = None,
    file: Annotated[
        Path | None,
        typer.Option(
            help='Instead: a JSON-lines file of events, {"session", "item", "time", "kind", "event_id"}; an event '
            "sent again with its event_id is stored once."
        ),
    ] = None,
    repo: Annotated[
        Path | None,
        typer.Option(
            help="Check the item IDs against the type of this repository's catalogue (integers: int64 in decimal, "
            "not -1; or strings); without it, any ID the store's contract allows is stored, and the served models "
            "drop one of the other type as an unknown ID."
        ),
    ] = None,
    store: StoreOption = None,
    password_env: PasswordEnvOption = None,
) -> None:
    """Send events: SESSION ITEM..., or --file. A bad event gets its own error; the good ones are stored."""
    from recserve.sessions.session_store import Event

    if (file is None) == (session is None):
        raise typer.BadParameter("give SESSION ITEM... or --file, one of them", param_hint="SESSION")
    if file is not None:
        events, lines, errors = read_events(file)
        where = "line"
    else:
        if session is None or not items:
            raise typer.BadParameter("no item IDs after the session", param_hint="ITEMS")
        events = [Event(session, item, kind=kind) for item in items]
        lines, errors, where = list(range(1, len(events) + 1)), [], "event"
    with open_store(store, password_env, repository_id_type(repo)) as sessions:
        result = sessions.append(events)
    for number, problem in sorted(errors + [(lines[n], p) for n, p in result.errors]):
        err_console.print(f"[red]{where} {number}:[/] {problem}", highlight=False)
    console.print(f"{result.accepted} events stored, {len(errors) + len(result.errors)} refused")
    if errors or result.errors:
        raise typer.Exit(1)


@app.command()
@handle_errors
def load(
    data: Annotated[Path, typer.Argument(help="A folder written by `recserve data`.")],
    users: Annotated[int | None, typer.Option(help="The first N users only (default: all).")] = None,
    session_prefix: Annotated[str, typer.Option(help="Each user's session ID is this plus the user ID.")] = "user-",
    holdout: Annotated[
        int, typer.Option(help="Leave each user's last N items out (to ask for them after) (default: 0).", min=0)
    ] = 0,
    store: StoreOption = None,
    password_env: PasswordEnvOption = None,
) -> None:
    """Load a prepared folder's histories (each user's newest items, up to the store's window) in bulk."""
    from rich.progress import Progress

    from recserve.data.datasets import load_prepared

    prepared = load_prepared(data)
    sequences = prepared.sequences.truncated(holdout) if holdout else prepared.sequences
    count = min(users or sequences.num_users, sequences.num_users)
    ids = prepared.vocab.to_ids(sequences.items[: sequences.offsets[count]]).tolist()
    histories = [ids[a:b] for a, b in zip(sequences.offsets[:count], sequences.offsets[1 : count + 1])]
    names = [f"{session_prefix}{user}" for user in prepared.user_ids[:count].tolist()]
    with open_store(store, password_env) as sessions, Progress(console=console, transient=True) as progress:
        task = progress.add_task("loading sessions", total=count)
        stored = sessions.append_histories(names, histories, progress=lambda done: progress.advance(task, done))
    console.print(f"{count:,} sessions, {stored:,} events stored")


@app.command()
@handle_errors
def show(
    session: Annotated[str, typer.Argument(help="The session ID.")],
    store: StoreOption = None,
    password_env: PasswordEnvOption = None,
    as_json: Annotated[bool, typer.Option("--json", help='Print {"session", "items"} as JSON.')] = False,
) -> None:
    """Print the items the store holds of a session, oldest first."""
    with open_store(store, password_env) as sessions:
        (items,) = sessions.recent([session])
    if as_json:
        print(json.dumps({"session": session, "items": items}))
        return
    console.print(" ".join(items) if items else f"no events of session {session!r} (new, or expired)")
