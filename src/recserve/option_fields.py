"""Settings fields that say how a person sets them: ``option`` is a dataclass field whose metadata holds the
command-line help (and, where the command line speaks another unit or spelling, the flag and the parse).
A setting is then written once, in its dataclass; the CLI draws its options from these fields
(``recserve.cli.options``). No typer here: the core's settings stay framework-free."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, Field, field
from typing import Any


def option(
    default: Any = MISSING,
    help: str = "",
    *,
    flags: tuple[str, ...] = (),
    cli_type: Any = None,
    cli_default: Any = MISSING,
    parse: Callable[[Any], Any] | None = None,
    shown: str | None = None,
    default_factory: Any = MISSING,
    **cli: Any,
) -> Any:
    """A dataclass field with its command-line option.

    Args:
        default: the setting's default.
        help: what the option's help says (the default is added to it).
        flags: the option's names where they are not the field's (``--instances`` for ``instance_count``).
        cli_type: the type the command line takes, where it differs from the field's (``str`` for a tuple).
        cli_default: the command line's default, where it is spelled otherwise than the field's.
        parse: turns the command line's value into the field's (milliseconds into microseconds, "0,1" into
            ``(0, 1)``); its ``ValueError`` is a bad-parameter error naming the flag, a ``RecserveError``
            the command's own error.
        shown: the default as the help shows it, where the value alone would mislead.
        default_factory: as ``dataclasses.field``'s.
        **cli: more of the option's keywords (``min``, ``envvar``).
    """
    metadata = dict(help=help, flags=flags, cli_type=cli_type, cli_default=cli_default, parse=parse, shown=shown)
    return field(default=default, default_factory=default_factory, metadata=metadata | {"cli": cli})


def has_option(item: Field) -> bool:
    """Whether a dataclass field is set from the command line (``option`` with a help)."""
    return bool(item.metadata.get("help"))


def add_arguments(parser: Any, settings: type, defaults: dict | None = None) -> None:
    """Adds to an ``argparse`` parser (a benchmark script's) one argument a field of ``settings`` that has an
    option, with its help and its default (``defaults`` replacing some); ``from_arguments`` reads them back."""
    import argparse
    import dataclasses
    import typing

    hints = typing.get_type_hints(settings)
    for item in dataclasses.fields(settings):
        if not has_option(item):
            continue
        kind = item.metadata.get("cli_type") or hints[item.name]
        kind = next((a for a in typing.get_args(kind) if a is not type(None)), kind)  # X | None: X
        default = (defaults or {}).get(item.name, item.default)
        flags = item.metadata.get("flags") or ("--" + item.name.replace("_", "-"),)
        if kind is bool:
            parser.add_argument(
                *flags,
                dest=item.name,
                action=argparse.BooleanOptionalAction,
                default=default,
                help=item.metadata["help"],
            )
        else:
            parser.add_argument(*flags, dest=item.name, type=kind, default=default, help=item.metadata["help"])


def from_arguments(settings: type, arguments: Any, **more: Any) -> Any:
    """The ``settings`` made of what ``add_arguments`` added to a parser, and ``more`` fields."""
    import dataclasses

    given = {f.name: getattr(arguments, f.name) for f in dataclasses.fields(settings) if has_option(f)}
    return settings(**given, **more)
