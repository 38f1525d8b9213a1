"""A command's settings from a file (``recserve train --config FILE``): TOML or YAML, the same names as the
options (``hidden = 64`` or ``hidden: 64``; ``relative-positions`` and ``relative_positions`` alike), each
value checked against its option's type. Options given on the command line override the file."""

from __future__ import annotations

import difflib
import json
import types
import typing
from dataclasses import Field
from pathlib import Path
from typing import Any

import tomllib

from recserve.errors import ConfigError

SUFFIXES = (".toml", ".yaml", ".yml", ".json")


def read_settings_file(path: Path, options: dict[str, list[tuple[type, Field]]], extra: dict[str, type]) -> dict:
    """The settings a file holds, by option name, each of its option's type.

    Args:
        options: the command's setting options (``cli.options.Settings.fields``), by name.
        extra: further names the file may hold and their types (the command's own options, such as model).

    Raises:
        ConfigError: a file that cannot be read, a name that is no option (with the closest ones), or a value of
            another type than its option's.
    """
    path = Path(path)
    if path.suffix.lower() not in SUFFIXES:
        raise ConfigError(f"{path}: a settings file is TOML (.toml), YAML (.yaml, .yml) or JSON (.json)")
    try:
        text = path.read_text()
        if path.suffix.lower() == ".toml":
            values = tomllib.loads(text)
        elif path.suffix.lower() == ".json":
            values = json.loads(text)
        else:
            import yaml

            values = yaml.safe_load(text) or {}
    except (OSError, ValueError) as err:
        raise ConfigError(f"{path}: cannot be read ({err})") from err
    except Exception as err:  # yaml.YAMLError, which is no ValueError
        if type(err).__module__.split(".")[0] != "yaml":
            raise
        raise ConfigError(f"{path}: cannot be read as YAML ({err})") from err
    if not isinstance(values, dict):
        raise ConfigError(f"{path}: expected name = value lines, as in epochs = 40")
    known = {name: _type_of(owners) for name, owners in options.items()} | extra
    out: dict[str, Any] = {}
    for key, value in values.items():
        name = str(key).replace("-", "_")
        if name not in known:
            close = difflib.get_close_matches(name, known, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise ConfigError(f"{path}: {key!r} is not a setting{hint} (the command's --help lists them)")
        out[name] = _checked(path, key, value, known[name])
        parse = options[name][0][1].metadata.get("parse") if name in options else None
        if parse is not None and out[name] is not None:  # as the option reads its text
            try:
                out[name] = parse(out[name])
            except ValueError as err:
                raise ConfigError(f"{path}: {key} = {value!r}: {err}") from err
    return out


def _type_of(owners: list[tuple[type, Field]]) -> type:
    cls, item = owners[0]
    return item.metadata.get("cli_type") or typing.get_type_hints(cls)[item.name]


def _checked(path: Path, key: str, value: Any, kind: Any) -> Any:
    """``value`` where it is of ``kind`` (an int is a float too; None where ``kind`` allows it)."""
    union = isinstance(kind, types.UnionType) or typing.get_origin(kind) is typing.Union
    allowed = typing.get_args(kind) if union else (kind,)
    for option in allowed:
        if option is type(None) and value is None:
            return None
        if option is bool and isinstance(value, bool):
            return value
        if option is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        if option is float and isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if option is str and isinstance(value, str):
            return value
    names = " or ".join(getattr(option, "__name__", str(option)) for option in allowed)
    raise ConfigError(f"{path}: {key} = {value!r} is not a {names}")
