"""A command's options drawn from settings classes: every field made with ``recserve.option_fields.option``
becomes one option, its help and default taken from the field, and the command receives the settings as
one keyword (the dataclass built, or what was given). A new setting is written once, in its class.

The deployment settings (Kubernetes, SageMaker) are pydantic-settings classes, also read from their
environment variables and settings file: the fields a group names become options the same way, their help
the field's description, and the command receives what was given, to lay over the rest (``read_settings``)."""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable, Mapping
from dataclasses import MISSING, Field, dataclass, fields, is_dataclass
from typing import Annotated, Any, Literal

import typer
from rich.markup import escape

from recserve.option_fields import has_option, option

EXPLORE_NEW_HELP = (
    "The share of the answer's columns reserved for the best-scored new items (items no training event holds, "
    "ranked by their attributes: a run trained with --item-attributes on data with an item table), every "
    "1/share-th column; 0: none."
)


@dataclass(frozen=True)
class Settings:
    """The options of one or more settings dataclasses, handed to the command as its keyword ``keyword``.

    With ``build``, the command gets the first class built from the options; otherwise a dict of them. The
    options named in ``unset`` (every one where it is True) default to None, and a None is left out, so the
    command knows what a person chose. ``titles`` names each class in the help
    of an option several classes share ("BERT4Rec, SASRec: ..."); ``shown`` gives an unset option's defaults
    as text ("(bert4rec 60, sasrec 100)").
    """

    keyword: str
    classes: tuple[type, ...]
    build: bool = True
    unset: frozenset[str] | bool = False
    titles: Mapping[type, str] | None = None
    shown: Callable[[str], str] | None = None
    names: tuple[str, ...] = ()  # a pydantic-settings class: the fields that are options

    def fields(self) -> dict[str, list[tuple[type, Field]]]:
        """Each option's name and the classes (with their field) that have it, in the classes' order."""
        by_name: dict[str, list[tuple[type, Field]]] = {}
        for cls in self.classes:
            for item in fields(cls) if is_dataclass(cls) else _settings_fields(cls, self.names):
                if has_option(item):
                    by_name.setdefault(item.name, []).append((cls, item))
        return by_name

    def is_unset(self, name: str) -> bool:
        return self.unset if isinstance(self.unset, bool) else name in self.unset

    def parameter(self, name: str, owners: list[tuple[type, Field]]) -> inspect.Parameter:
        cls, item = owners[0]
        meta = item.metadata
        kind = meta["cli_type"] or typing.get_type_hints(cls)[name]
        if self.is_unset(name):
            kind, default = kind | None, None
        elif meta["cli_default"] is not MISSING:
            default = meta["cli_default"]
        else:
            default = item.default if item.default is not MISSING else item.default_factory()  # type: ignore[operator]
        if default is None:
            kind = kind | None
        text = self.help(name, owners) if self.is_unset(name) else meta["help"] + _shown(meta)
        info = typer.Option(*meta["flags"], help=escape(text), **meta["cli"])
        return inspect.Parameter(
            name, inspect.Parameter.KEYWORD_ONLY, annotation=Annotated[kind, info], default=default
        )

    def help(self, name: str, owners: list[tuple[type, Field]]) -> str:
        """An unset option's help: each class's own words with its default, classes of the same words together."""
        if self.shown is not None:
            return owners[0][1].metadata["help"] + " " + self.shown(name)
        if self.titles is None:
            return owners[0][1].metadata["help"] + _shown(owners[0][1].metadata)
        said: dict[str, list[tuple[type, Field]]] = {}
        for cls, item in owners:
            said.setdefault(item.metadata["help"], []).append((cls, item))
        parts = []
        for words, alike in said.items():
            defaults = ", ".join(_default_text(item) for _, item in alike)
            parts.append(f"{', '.join(self.titles[cls] for cls, _ in alike)}: {words} [{defaults}].")
        return " ".join(parts)

    def collect(self, given: dict[str, Any], names: list[str]) -> Any:
        """The command's value from its options' values (``given``, popped)."""
        values = {}
        for name in names:
            value = given.pop(name)
            meta = self.fields()[name][0][1].metadata
            if value is not None and meta["parse"] is not None:
                value = _parse(meta, name, value)
            if value is not None or not self.is_unset(name):
                values[name] = value
        return self.classes[0](**values) if self.build else values


def takes(*groups: Settings) -> Callable[[Callable], Callable]:
    """Gives a command the options of ``groups`` beside its own parameters; each group arrives as its keyword."""

    def decorate(command: Callable) -> Callable:
        signature = inspect.signature(command, eval_str=True)
        keywords = {group.keyword for group in groups}
        own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in signature.parameters.values()]
        own = [p for p in own if p.name not in keywords]
        names: dict[str, list[str]] = {}
        drawn: list[inspect.Parameter] = []
        for group in groups:
            for name, owners in group.fields().items():
                if name in {p.name for p in own + drawn}:
                    raise TypeError(f"{command.__name__}: option {name!r} is drawn twice")
                drawn.append(group.parameter(name, owners))
                names.setdefault(group.keyword, []).append(name)

        @functools.wraps(command)
        def run(**given: Any) -> Any:
            for group in groups:
                given[group.keyword] = group.collect(given, names.get(group.keyword, []))
            return command(**given)

        run.__signature__ = signature.replace(parameters=own + drawn)  # type: ignore[attr-defined]
        return run

    return decorate


def _settings_fields(cls: Any, names: tuple[str, ...]) -> list[Field]:
    """The fields ``names`` of a pydantic-settings class as options: the help its description and the variable
    that also sets it, the default shown (the command receives only what was given)."""
    prefix = cls.model_config.get("env_prefix", "")
    drawn = []
    for name in names:
        info = cls.model_fields[name]
        if not info.description:
            raise TypeError(f"{cls.__name__}.{name}: an option needs the field's description")
        literal = typing.get_origin(info.annotation) is Literal
        default = info.default
        shown = "not set" if default is None else ("on" if default else "off") if isinstance(default, bool) else default
        item = option(
            default,
            f"{info.description} (or {prefix}{name.upper()})",
            cli_type=str if literal else None,
            shown=str(shown),
        )
        item.name = name
        drawn.append(item)
    return drawn


def _parse(meta: Mapping[str, Any], name: str, value: Any) -> Any:
    try:
        return meta["parse"](value)
    except ValueError as err:  # a RecserveError goes on, to the command's own error line
        flag = meta["flags"][0] if meta["flags"] else "--" + name.replace("_", "-")
        raise typer.BadParameter(str(err), param_hint=flag) from err


def _default_text(item: Field) -> str:
    if item.metadata["shown"] is not None:
        return item.metadata["shown"]
    value = item.default
    return ("on" if value else "off") if isinstance(value, bool) else str(value)


def _shown(meta: Mapping[str, Any]) -> str:
    return f" [{meta['shown']}]" if meta["shown"] is not None else ""
