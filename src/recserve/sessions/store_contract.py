"""The session store's wire contract, written once: its keys, the members of a session, which session, event
and item IDs a store may hold, and the commands recserve sends (its ACL allow-list).

recserve's backend (``native/triton-backend/src/session_store.cc``) restates this in C++;
``tests/sessions/test_store_contract.py`` holds the two to the same cases (``CASES``) through a real server.

A session is one sorted set, key ``PREFIX h:SESSION``. Each event is one member, ``EVENT_ID ITEM`` (the
event's ID, one space, the item's ID as text), scored by the event's time in seconds. ZADD NX of a member
that is there already changes nothing, so an append is idempotent by event ID: a retried call, or an event
sent twice by its sender with its ID, is stored once. ZREMRANGEBYRANK keeps the newest ``window``; ZRANGE
reads them, oldest first.
"""

from __future__ import annotations

import re

import numpy as np

from recserve.constants import NATIVE_PAD_ID

# The contract's version, as docs/integration.md publishes it ("store contract, version N") for a team whose own
# services write to the store: every key, member and ID rule below. A change to any of them raises it (and
# tests/sessions/test_store_contract.py, which holds them to what version 1 published, is told so).
CONTRACT_VERSION = 1

HISTORY_KEY = "{prefix}h:{session}"  # one sorted set a session
# the items hidden catalogue-wide (out of stock, withdrawn): a set of item IDs as the store keeps them, and a
# counter raised with every change to it, which serving reads once a batch (and more only when it moved)
HIDDEN_KEY = "{prefix}items:hidden"
HIDDEN_VERSION_KEY = "{prefix}items:version"
# every change also as one entry of a stream (its ID given by the store), of (HIDE or SHOW, item ID) pairs; the
# change, its entry and the raised version are one transaction. A reader holding the set as of one entry reads
# the entries after it (and the version) instead of the whole set. The stream keeps the last
# HIDDEN_CHANGES_KEPT entries: a reader whose entry is gone, or that holds none, reads the whole set again.
# A change of more than HIDDEN_CHANGE_MAX_ITEMS items (a shop's whole availability file, say) is one entry
# (WHOLE_SET_ITEM, WHOLE_SET) instead, and its readers read the whole set: the stream holds at most
# HIDDEN_CHANGES_KEPT x HIDDEN_CHANGE_MAX_ITEMS item IDs, whatever the shop sends.
HIDDEN_CHANGES_KEY = "{prefix}items:changes"
HIDDEN_CHANGES_KEPT = 1024
HIDDEN_CHANGE_MAX_ITEMS = 1000
HIDE, SHOW, WHOLE_SET = "+", "-", "="
WHOLE_SET_ITEM = "*"
MEMBER_SEPARATOR = " "  # a member is EVENT_ID, this, ITEM (an event ID holds no space)
MAX_SESSION_ID = 256  # characters of a session ID (valid UTF-8, at least one)
MAX_ITEM_ID = 256  # characters of an item ID as the store keeps it
EVENT_ID_PATTERN = re.compile(r"[A-Za-z0-9._:-]{1,64}")  # a sender's event ID, or one recserve makes
# an integer item ID as stored: canonical decimal ASCII (no sign but '-', no leading zero, no space), in
# int64's range; -1 is the native layout's padding and never an item
INTEGER_ID_PATTERN = re.compile(r"0|-?[1-9][0-9]{0,18}")
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
RESERVED_INTEGER_IDS = (NATIVE_PAD_ID,)
SENTINEL_SERVICE = "recserve"  # the primary's name to the Sentinels of a replicated store

# The store's roles, each an ACL user with the allow-list its work needs and no more (docs/security.md):
# - serving: the served models and recserve's own event verbs: sessions read, appended and forgotten; the hidden
#   items' set, version and stream read only (their keys read-only, so no write command reaches them);
# - writer: a shop's event writers: sessions appended only (no read, no removal, no catalogue key);
# - operator: `recserve items`: the hidden items' set, version, stream and change IDs, and no session.
SERVING, WRITER, OPERATOR = "serving", "writer", "operator"
ROLE_COMMANDS: dict[str, tuple[str, ...]] = {
    # appends, reads, forgetting, a ping, WAIT for a replica's copy (acknowledge "replica"); the catalogue's state
    SERVING: (
        "ping",
        "multi",
        "exec",
        "discard",
        "zadd",
        "zremrangebyrank",
        "zrange",
        "expire",
        "del",
        "wait",
        "smembers",
        "get",
        "xrange",
        "xrevrange",
    ),
    WRITER: ("ping", "multi", "exec", "discard", "zadd", "zremrangebyrank", "expire", "wait"),
    # a change: WATCH of its change ID's key and the version, then SET of the ID, SADD or SREM, XADD and INCR
    # in one MULTI/EXEC (a retried change finds its ID and is not applied again)
    OPERATOR: (
        "ping",
        "multi",
        "exec",
        "discard",
        "watch",
        "unwatch",
        "exists",
        "set",
        "get",
        "sadd",
        "srem",
        "smembers",
        "incrby",
        "xadd",
        "xrange",
        "xrevrange",
    ),
}
# the keys of each role, after the prefix ({p}): every key a session's ("h:"), the catalogue's ("items:"),
# read-only ("%R~") where the role only reads them
ROLE_KEYS = {SERVING: "~{p}h:* %R~{p}items:*", WRITER: "~{p}h:*", OPERATOR: "~{p}items:*"}
# every command recserve sends, whatever the role
COMMANDS = tuple(dict.fromkeys(c for commands in ROLE_COMMANDS.values() for c in commands))
# one role's ACL line: a user who holds the password's SHA-256, may send the role's commands only, touch only
# its keys, and no channel (no scripts, no SELECT, no SCAN, no pub/sub)
ACL_LINE = "user {user} on #{sha256} resetchannels resetkeys {keys} -@all {commands}\n"
ACL_RULES = "user default off\n" + ACL_LINE  # the serving role's file, the default user off
# a change of the hidden items by ID: a change's key says it was applied (kept a day, past any retry)
CHANGE_KEY = "{prefix}items:change:{change}"
CHANGE_KEPT_S = 24 * 3600
CHANGE_ID_PATTERN = re.compile(r"[A-Za-z0-9._:-]{1,64}")

# Cases each side must decide alike: (what, text, accepted). Held against the Python rules by unit tests and
# against recserve's backend and the session model by storing each item and asking for the session.
CASES: tuple[tuple[str, str, bool], ...] = (
    ("integer", "42", True),
    ("integer", "0", True),
    ("integer", "-7", True),
    ("integer", "9223372036854775807", True),
    ("integer", "-9223372036854775808", True),
    ("integer", "9223372036854775808", False),  # past int64
    ("integer", "-9223372036854775809", False),
    ("integer", "99999999999999999999", False),
    ("integer", "1" * 4301, False),  # past Python's int() digit limit
    ("integer", "--5", False),
    ("integer", "+5", False),
    ("integer", "05", False),
    ("integer", "-0", False),
    ("integer", " 5", False),
    ("integer", "5 ", False),
    ("integer", "\u00b2", False),  # superscript two: a digit to str.isdigit
    ("integer", "\u0663", False),  # Arabic-Indic three: int() reads it as 3
    ("integer", "-1", False),  # the native padding
    ("integer", "", False),
    ("integer", "abc", False),
    ("session", "shopper-1", True),
    ("session", "\u00e9t\u00e9", True),
    ("session", "x" * 256, True),
    ("session", "x" * 257, False),
    ("session", "", False),
)


def history_key(prefix: str, session: str) -> str:
    """The store key of a session: within ``prefix`` whatever the ID holds (the ID is checked first)."""
    return HISTORY_KEY.format(prefix=prefix, session=session)


def acl_line(role: str, user: str, sha256: str, prefix: str) -> str:
    """One role's ACL line (``ACL_LINE``) for ``user``, its password by SHA-256 only."""
    commands = " ".join(f"+{c}" for c in ROLE_COMMANDS[role])
    return ACL_LINE.format(user=user, sha256=sha256, keys=ROLE_KEYS[role].format(p=prefix), commands=commands)


def acl_rules(user: str, sha256: str, prefix: str) -> str:
    """The ACL file (``ACL_RULES``) of recserve's serving user alone, the default user off."""
    return "user default off\n" + acl_line(SERVING, user, sha256, prefix)


def session_problem(session: object) -> str | None:
    """Why ``session`` is no session ID (valid UTF-8, 1 to ``MAX_SESSION_ID`` characters), or None."""
    # the same words as recserve's backend (SessionIdProblem), so a client reads one message from both layouts
    if not isinstance(session, str):
        return f"session: a session ID is a string, got {type(session).__name__}"
    if not session:
        return "session: an empty session ID"
    if len(session) > MAX_SESSION_ID:
        return f"session: a session ID over {MAX_SESSION_ID} characters"
    if not _utf8(session):
        return "session: not UTF-8"
    return None


def event_id_problem(event_id: object) -> str | None:
    """Why ``event_id`` is no event ID (``EVENT_ID_PATTERN``), or None."""
    if isinstance(event_id, str) and EVENT_ID_PATTERN.fullmatch(event_id):
        return None
    return f"event_id: 1 to 64 letters, digits or '._:-', got {event_id!r:.80}"


def item_problem(item: object, id_type: str | None) -> str | None:
    """Why ``item`` cannot be stored for a catalogue of ``id_type`` (None: either type), or None.

    An integer catalogue takes ints and their canonical text (``INTEGER_ID_PATTERN``, int64, not -1); a
    string catalogue takes non-empty UTF-8 text of at most ``MAX_ITEM_ID`` characters.
    """
    if isinstance(item, bool) or not isinstance(item, (str, int)):
        return f"item: an item ID (a string or an integer), got {type(item).__name__}"
    if isinstance(item, int):
        if id_type == "string":
            return f"item: this catalogue's IDs are strings, got the integer {item}"
        if not INT64_MIN <= item <= INT64_MAX or item in RESERVED_INTEGER_IDS:
            shown = item if item.bit_length() <= 128 else f"an integer of {item.bit_length()} bits"
            return f"item: an integer ID within int64 other than {NATIVE_PAD_ID}, got {shown}"
        return None
    if not item or len(item) > MAX_ITEM_ID or not _utf8(item):
        return f"item: a non-empty UTF-8 ID of at most {MAX_ITEM_ID} characters, got {item!r:.40}"
    if id_type == "int64" and not is_integer_id(item):
        return f"item: this catalogue's IDs are integers (int64 in decimal, not {NATIVE_PAD_ID}), got {item!r:.40}"
    return None


def is_integer_id(text: str) -> bool:
    """Whether ``text`` is an integer item ID as the store keeps it (the C++ side's rule too)."""
    if not INTEGER_ID_PATTERN.fullmatch(text):
        return False
    value = int(text)
    return INT64_MIN <= value <= INT64_MAX and value not in RESERVED_INTEGER_IDS


def member(event_id: str, item: str | int) -> str:
    """A session's member for one event (its ID checked first)."""
    return f"{event_id}{MEMBER_SEPARATOR}{item}"


def stored_ids(members: list[str], string_ids: bool) -> np.ndarray:
    """The item IDs of a session's members, in the catalogue's type; what breaks the rules (an item that
    is no integer of int64 in an integer catalogue, a member without an event ID) is left out, as an unknown
    ID would be, whatever it holds."""
    values = np.asarray(members, dtype=np.str_)
    if values.size == 0:
        return np.zeros(0, dtype=object if string_ids else np.int64)
    parts = np.char.partition(values, MEMBER_SEPARATOR)
    items = parts[:, 2][parts[:, 1] == MEMBER_SEPARATOR]
    if string_ids:
        return items[items != ""].astype(object)
    try:  # the usual case: every stored ID canonical; the round trip finds '+5', '05', Arabic-Indic digits
        ids = items.astype(np.int64)
        keep = (ids.astype(np.str_) == items) & ~np.isin(ids, RESERVED_INTEGER_IDS)
        return ids[keep]
    except (ValueError, OverflowError):
        keep = np.fromiter((is_integer_id(text) for text in items.tolist()), dtype=bool, count=items.size)
        return items[keep].astype(np.int64)


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
