"""The store contract (``store_contract.py``), written once: its rules decide each of its cases, and recserve's
backend restates the same keys, members, limits, commands and client message in C++ (checked here against
its source; its behaviour on the cases is checked through a real server in test_session_serving.py)."""

import re
from pathlib import Path

import numpy as np
import pytest

from recserve.constants import NATIVE_PAD_ID, STORE_UNAVAILABLE
from recserve.sessions import store_contract
from recserve.sessions.store_settings import MAX_TIMEOUT_S, MAX_TTL_S, MAX_WINDOW, StoreSettings

SOURCE = Path(__file__).resolve().parents[2] / "native" / "triton-backend" / "src"
CPP = (SOURCE / "session_store.cc").read_text() + (SOURCE / "session_store.h").read_text()


@pytest.mark.parametrize(("what", "text", "accepted"), store_contract.CASES, ids=lambda v: repr(v)[:24])
def test_each_case_of_the_contract_is_decided_by_its_rule(what, text, accepted):
    if what == "integer":
        assert store_contract.is_integer_id(text) is accepted
        assert (store_contract.item_problem(text, "int64") is None) is accepted
        assert len(store_contract.stored_ids([store_contract.member("e1", text)], string_ids=False)) == int(accepted)
    else:
        assert (store_contract.session_problem(text) is None) is accepted


def test_stored_members_are_read_in_one_pass_whatever_they_hold():
    members = ["a 5", "b +5", "c 05", "d \u0663", "e -1", "no-id", "f 9223372036854775808", "g 7", "h -0"]
    assert store_contract.stored_ids(members, string_ids=False).tolist() == [5, 7]
    assert store_contract.stored_ids(["a x y", "b", "c z"], string_ids=True).tolist() == ["x y", "z"]
    assert store_contract.stored_ids([], string_ids=False).dtype == np.int64


def test_items_are_checked_against_the_catalogues_type():
    assert store_contract.item_problem(42, "int64") is None and store_contract.item_problem("42", "int64") is None
    assert "strings" in store_contract.item_problem(42, "string")
    assert store_contract.item_problem("sku-1", "string") is None and store_contract.item_problem("sku-1", None) is None
    assert "integers" in store_contract.item_problem("sku-1", "int64")
    assert store_contract.item_problem(NATIVE_PAD_ID, "int64") and store_contract.item_problem(2**63, "int64")
    assert "bits" in store_contract.item_problem(10**5000, "int64")  # past what str() of an int may print
    assert store_contract.item_problem("\ud800", "string")  # a lone surrogate is no UTF-8


def test_recserves_backend_restates_the_contract():
    prefix, _, rest = store_contract.HISTORY_KEY.partition("{session}")[0].partition("{prefix}")
    assert f'"{rest}"' in CPP, "the key's part after the prefix"
    assert "memchr(member->str, ' '" in CPP and store_contract.MEMBER_SEPARATOR == " "
    assert f"characters > {store_contract.MAX_SESSION_ID}" in CPP
    assert f'kStoreUnavailable = "{STORE_UNAVAILABLE}"' in CPP
    for key in (store_contract.HIDDEN_KEY, store_contract.HIDDEN_VERSION_KEY, store_contract.HIDDEN_CHANGES_KEY):
        assert f'"{key.replace("{prefix}", "")}"' in CPP, key  # the hidden items' keys, after the prefix
    # a change's kind: hidden, shown, or too large to keep as items (the whole set read instead)
    assert f"kind == '{store_contract.HIDE}'" in CPP and f"kind != '{store_contract.WHOLE_SET}'" in CPP
    sent = set(re.findall(r'\{"([A-Z]+)"', CPP)) | set(re.findall(r'"([A-Z]+)", keys\[i\]', CPP))
    assert {c.upper() for c in store_contract.COMMANDS} >= sent - {"AUTH", "SELECT", "SENTINEL"}, sent
    assert {"ZADD", "ZREMRANGEBYRANK", "ZRANGE", "EXPIRE", "MULTI", "EXEC"} <= sent
    bounds = re.search(r"window >= 1 && window <= ([0-9e.]+)\).*ttl <= ([0-9e.]+)\).*timeout <= ([0-9e.]+)\)", CPP)
    assert bounds and [float(b) for b in bounds.groups()] == [MAX_WINDOW, MAX_TTL_S, MAX_TIMEOUT_S]
    fields = set(StoreSettings().describe())
    assert fields == {f for f in StoreSettings.__dataclass_fields__ if f != "password"}
    for field in fields:
        assert f'"{field}"' in CPP, f"recserve's backend does not read the record's field {field}"


def test_each_roles_acl_line_is_the_one_docs_security_gives_and_allows_its_commands_only():
    # the lines docs/security.md gives a team for a store of its own are these ones
    doc = " ".join((Path(__file__).parents[2] / "docs" / "security.md").read_text().split())
    users = {"serving": "recserve", "writer": "recserve-writer", "operator": "recserve-operator"}
    for role, user in users.items():
        line = store_contract.acl_line(role, user, "<sha256>", "<prefix>").strip()
        assert line in doc, line
        assert f"-@all {' '.join(f'+{c}' for c in store_contract.ROLE_COMMANDS[role])}" in line
        assert "@all" not in line.replace("-@all", "") and "resetchannels resetkeys" in line
    assert store_contract.acl_rules("recserve", "0" * 64, "shop:").startswith("user default off\n")
    # serving reads the catalogue's keys only; writers never read; the operator never reaches a session
    assert "%R~shop:items:*" in store_contract.acl_line("serving", "u", "0", "shop:")
    assert not {"zrange", "del", "get", "smembers"} & set(store_contract.ROLE_COMMANDS["writer"])
    assert "h:*" not in store_contract.ROLE_KEYS["operator"]


# What store contract version 1 published (docs/integration.md): a change to any of these is a new version
PUBLISHED = {
    1: {
        "HISTORY_KEY": "{prefix}h:{session}",
        "HIDDEN_KEY": "{prefix}items:hidden",
        "HIDDEN_VERSION_KEY": "{prefix}items:version",
        "HIDDEN_CHANGES_KEY": "{prefix}items:changes",
        "HIDDEN_CHANGES_KEPT": 1024,
        "HIDDEN_CHANGE_MAX_ITEMS": 1000,
        "HIDE": "+",
        "SHOW": "-",
        "WHOLE_SET": "=",
        "WHOLE_SET_ITEM": "*",
        "MEMBER_SEPARATOR": " ",
        "MAX_SESSION_ID": 256,
        "MAX_ITEM_ID": 256,
        "EVENT_ID_PATTERN": r"[A-Za-z0-9._:-]{1,64}",
        "INTEGER_ID_PATTERN": r"0|-?[1-9][0-9]{0,18}",
    }
}


def test_the_store_contract_is_what_its_version_published():
    """A key, member or ID rule changed without a new version (and its docs) fails here, naming it."""
    version = store_contract.CONTRACT_VERSION
    assert version in PUBLISHED, f"contract version {version}: add what it publishes to PUBLISHED and the docs"
    for name, published in PUBLISHED[version].items():
        value = getattr(store_contract, name)
        value = value.pattern if isinstance(value, re.Pattern) else value
        assert value == published, f"{name} changed under contract version {version}: raise CONTRACT_VERSION"
    docs = (Path(__file__).resolve().parents[2] / "docs" / "integration.md").read_text()
    assert f"## Store contract, version {version}" in docs
    for key in ("h:SESSION", "items:hidden", "items:version", "items:changes"):
        assert f"PREFIX {key}" in docs, key
