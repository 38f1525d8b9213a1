"""Rules stored by name: a TOML or JSON file of ``name = "rule"``, which ``recserve repo --rules`` checks and
stores with the repository, and which requests then name (so the hot path never parses them)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import tomllib

from recserve.errors import ConfigError

NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def read_named_rules(path: Path) -> dict[str, str]:
    """The rules of a file, by name.

    Raises:
        ConfigError: a file that cannot be read as TOML or JSON, a name that is not 1 to 64 letters, digits,
            '_', '.' or '-', or a rule that is not a string.
    """
    path = Path(path)
    try:
        text = path.read_text()
        rules = json.loads(text) if path.suffix.lower() == ".json" else tomllib.loads(text)
    except (OSError, ValueError) as err:
        raise ConfigError(f"{path}: cannot be read as a file of named rules ({err})") from err
    if not isinstance(rules, dict) or not rules:
        raise ConfigError(f'{path}: expected name = "rule" lines, as in in_stock = "stock > 0"')
    for name, rule in rules.items():
        if not NAME.match(name):
            raise ConfigError(f"{path}: {name!r} is not a rule name: 1 to 64 letters, digits, '_', '.' or '-'")
        if not isinstance(rule, str):
            raise ConfigError(f'{path}: rule {name!r} is {rule!r}; a rule is a string, as in {name} = "stock > 0"')
    return dict(rules)
