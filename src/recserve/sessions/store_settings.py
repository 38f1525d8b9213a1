"""Where the session store is and how recserve uses it; read without redis-py."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from recserve.errors import ConfigError
from recserve.sessions import store_contract

PREFIX_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,64}:")  # one tenant's namespace: no ':' inside, one at the end
MAX_WINDOW, MAX_TTL_S, MAX_TIMEOUT_S = 1_000_000, 10**10, 3600  # the bounds recserve's backend checks too
SENTINEL_PATTERN = re.compile(r"[A-Za-z0-9.-]{1,253}:[0-9]{1,5}")
SERVICE_PATTERN = re.compile(r"[A-Za-z0-9_.-]{1,64}")
ACKNOWLEDGE = ("primary", "replica")  # an append acknowledged once the primary holds it, or a replica too


@dataclass(frozen=True)
class StoreSettings:
    """A session store: its address, credentials, key prefix and what it keeps of each session.

    The password is never part of ``url`` or of ``repr``: it comes from ``password`` (kept out of every
    record recserve writes) or from the file ``password_file`` (a Kubernetes Secret mounted as a file).
    """

    url: str = "redis://127.0.0.1:6379/0"  # redis:// or rediss:// (TLS); host, port and database
    username: str | None = None  # an ACL user; None: the server's default user
    password: str | None = field(default=None, repr=False)
    password_file: str | None = None
    prefix: str = "recserve:"  # every key is this prefix plus "h:" plus the session ID (store_contract)
    window: int = 200  # most recent items kept per session (the model reads at most its own window)
    ttl_s: int = 7 * 24 * 3600  # a session expires this long after its last event; 0: never
    timeout_s: float = 0.25  # per store call: a slow or unreachable store is an error, never a hang
    # high availability: Sentinels ("HOST:PORT") that name the primary of `service`; url's host and port are
    # then only where it was first, its database the one used
    sentinels: tuple[str, ...] = ()
    service: str = store_contract.SENTINEL_SERVICE
    acknowledge: str = "primary"  # "replica": an append is acknowledged once a replica holds it too (WAIT)

    def __post_init__(self):
        object.__setattr__(self, "sentinels", tuple(self.sentinels))  # a record's JSON list
        problems = []
        for address in self.sentinels:
            if not isinstance(address, str) or not SENTINEL_PATTERN.fullmatch(address):
                problems.append(f"sentinels: {address!r} is not HOST:PORT")
        if not SERVICE_PATTERN.fullmatch(self.service):
            problems.append(f"service={self.service!r}: letters, digits, '_', '.' or '-' (at most 64)")
        if self.acknowledge not in ACKNOWLEDGE:
            problems.append(f"acknowledge={self.acknowledge!r}: one of {', '.join(ACKNOWLEDGE)}")
        if not self.url.startswith(("redis://", "rediss://", "unix://")):
            problems.append(f"url={self.url!r}: expected redis://HOST:PORT/DB, rediss:// or unix://")
        if "@" in self.url:
            problems.append("url: give the credentials as username and password (or password_file), not in the URL")
        if not PREFIX_PATTERN.fullmatch(self.prefix):
            problems.append(f"prefix={self.prefix!r}: letters, digits, '_' or '-' (at most 64), then one ':'")
        if not 1 <= self.window <= MAX_WINDOW:
            problems.append(f"window={self.window}: must be 1 to {MAX_WINDOW:,}")
        if not 0 <= self.ttl_s <= MAX_TTL_S:
            problems.append(f"ttl_s={self.ttl_s}: must be 0 (no expiry) to {MAX_TTL_S:.0e}")
        if not 0 < self.timeout_s <= MAX_TIMEOUT_S:
            problems.append(f"timeout_s={self.timeout_s}: must be above 0, at most {MAX_TIMEOUT_S}")
        if problems:
            raise ConfigError("; ".join(problems))

    def secret(self) -> str | None:
        """The password: ``password``, else the first line of ``password_file`` (read anew each call, so a
        rotated Secret is taken up at the next connection), else None.

        Raises:
            ConfigError: the file cannot be read, or its password is empty or padded (``password_problem``).
        """
        if self.password is not None:
            password, where = self.password, "password"
        elif self.password_file is None:
            return None
        else:
            where = f"password_file={self.password_file}"
            try:
                password = read_password(Path(self.password_file))
            except (OSError, UnicodeDecodeError) as err:
                raise ConfigError(f"{where}: cannot read a password from it ({err})") from err
        if problem := password_problem(password):
            raise ConfigError(f"{where}: {problem}")
        return password

    def key(self, session: str) -> str:
        """The store key of a session: within this prefix whatever the ID holds (the ID is checked first)."""
        return store_contract.history_key(self.prefix, session)

    def describe(self) -> dict:
        """What a record may say of the store: never the password."""
        return {
            "url": self.url,
            "username": self.username,
            "password_file": self.password_file,
            "prefix": self.prefix,
            "window": self.window,
            "ttl_s": self.ttl_s,
            "timeout_s": self.timeout_s,
            "sentinels": list(self.sentinels),
            "service": self.service,
            "acknowledge": self.acknowledge,
        }

    def sentinel_addresses(self) -> list[tuple[str, int]]:
        """The Sentinels as (host, port) pairs."""
        return [(host, int(port)) for host, _, port in (address.rpartition(":") for address in self.sentinels)]

    @classmethod
    def from_record(cls, record: dict, password: str | None = None) -> StoreSettings:
        return cls(**{k: v for k, v in record.items() if k in cls.__dataclass_fields__}, password=password)


def read_store_record(path: str | Path) -> dict:
    """A store's record, checked: a store folder's store.json (`recserve store start`), or a JSON file of
    ``StoreSettings`` fields. A record holding a password is refused: it names a password_file instead.

    Raises:
        ConfigError: no record there, or one that is malformed or holds a password.
    """
    import json

    path = Path(path)
    path = path / "store.json" if path.is_dir() else path
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ConfigError(
            f"{path}: no session store record to read ({err}); start one with `recserve store start`"
        ) from err
    if not isinstance(record, dict):
        raise ConfigError(f"{path}: a store record is a JSON object")
    if "password" in record:
        raise ConfigError(f"{path}: holds a password; name the file that holds it instead (password_file)")
    try:
        return StoreSettings.from_record(record).describe()
    except TypeError as err:
        raise ConfigError(f"{path}: {err}") from err


def read_password(path: Path) -> str:
    """A password file's password, read as every recserve part reads it (the C++ backend too): its first
    line, without the line's end ("\n" or "\r\n"); "" for an empty file."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return lines[0] if lines else ""


def password_problem(password: str) -> str | None:
    """Why ``password`` is refused (empty, or blanks around it that one reader would strip and another
    keep), or None."""
    if not password:
        return "the password is empty"
    if password != password.strip():
        return "the password begins or ends with a blank (a space, a tab); write it without"
    return None


def password_from_env(name: str | None) -> str | None:
    """The password in the environment variable ``name`` (None: not asked); a named but unset one is an error."""
    if not name:
        return None
    if name not in os.environ:
        raise ConfigError(f"the store's password was to come from ${name}, which is not set")
    return os.environ[name]
