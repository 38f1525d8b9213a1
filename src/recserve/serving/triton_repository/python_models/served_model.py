"""What the python models of the fused and session layouts load alike: the export's predictor (with the rules
the repository stores by name), and where the repository names a session store, the store and the hidden
items it keeps. Imported by their model.py, never written into a repository itself."""

from __future__ import annotations

import json
from pathlib import Path

from recserve.serving.hidden_items import HiddenItems
from recserve.serving.predictor import Predictor
from recserve.serving.triton_repository.placement import instance_device

RULES_PARAMETER = "rules"  # the rules stored by name (JSON: name -> rule), where the repository has any
STORE_PARAMETER = "session_store"  # the session store's record (never a password), where it names one
ITEM_ID_TYPE_PARAMETER = "item_id_type"  # the events model's: the catalogue's ID type (it loads no export)


def load_served(args: dict):
    """(predictor, store or None, hidden items or None) of a python model, from Triton's ``initialize`` args."""
    from recserve.sessions.session_store import SessionStore
    from recserve.sessions.store_settings import StoreSettings

    parameters = json.loads(args["model_config"])["parameters"]
    value = lambda name: parameters[name]["string_value"] if name in parameters else None  # noqa: E731
    folder = Path(args["model_repository"]) / args["model_version"] / str(value("export_dir"))
    named = json.loads(value(RULES_PARAMETER) or "{}")
    predictor = Predictor.load(folder, instance_device(args), named)
    if value(STORE_PARAMETER) is None:
        return predictor, None, None
    store = SessionStore(StoreSettings.from_record(json.loads(str(value(STORE_PARAMETER)))), predictor.id_type)
    return predictor, store, HiddenItems(store, predictor)


def load_store(args: dict):
    """(store, ID type) of the events model, from Triton's ``initialize`` args: the store its config names."""
    from recserve.sessions.session_store import SessionStore
    from recserve.sessions.store_settings import StoreSettings

    parameters = json.loads(args["model_config"])["parameters"]
    id_type = parameters[ITEM_ID_TYPE_PARAMETER]["string_value"]
    record = json.loads(parameters[STORE_PARAMETER]["string_value"])
    return SessionStore(StoreSettings.from_record(record), id_type), id_type
