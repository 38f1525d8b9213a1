"""What the python models of the fused and session layouts load alike: the export's predictor (with the rules
the repository stores by name), and where the repository names a session store, the store and the hidden
items it keeps. Imported by their model.py, never written into a repository itself."""

from __future__ import annotations

import json
from pathlib import Path

from recserve.artifacts.served import Parameter, config_parameters
from recserve.serving.hidden_items import HiddenItems
from recserve.serving.predictor import Predictor
from recserve.serving.triton_repository.placement import instance_device


def load_served(args: dict):
    """(predictor, store or None, hidden items or None) of a python model, from Triton's ``initialize`` args."""
    from recserve.sessions.session_store import SessionStore
    from recserve.sessions.store_settings import StoreSettings

    parameters = config_parameters(args["model_config"])
    folder = Path(args["model_repository"]) / args["model_version"] / str(parameters.get(Parameter.EXPORT_DIR))
    named = json.loads(parameters.get(Parameter.RULES) or "{}")
    predictor = Predictor.load(folder, instance_device(args), named)
    if parameters.get(Parameter.SESSION_STORE) is None:
        return predictor, None, None
    record = json.loads(parameters[Parameter.SESSION_STORE])
    store = SessionStore(StoreSettings.from_record(record), predictor.id_type)
    return predictor, store, HiddenItems(store, predictor)


def load_store(args: dict):
    """(store, ID type) of the events model, from Triton's ``initialize`` args: the store its config names."""
    from recserve.sessions.session_store import SessionStore
    from recserve.sessions.store_settings import StoreSettings

    parameters = config_parameters(args["model_config"])
    id_type = parameters[Parameter.ITEM_ID_TYPE]
    record = json.loads(parameters[Parameter.SESSION_STORE])
    return SessionStore(StoreSettings.from_record(record), id_type), id_type
