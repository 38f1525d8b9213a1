"""The training settings: which model takes which setting, the per-model defaults, and no torch to read them."""

import subprocess
import sys

import pytest

from recserve.errors import ConfigError
from recserve.train.train_config import MODEL_DEFAULTS, TrainConfig, model_settings


def test_a_model_keeps_the_settings_its_config_has_and_drops_those_not_given():
    given = dict(window=50, hidden=None, mask_prob=0.3, latent=None)
    assert model_settings("bert4rec", given) == {"window": 50, "mask_prob": 0.3}


@pytest.mark.parametrize(
    ("model", "given", "refused"),
    [("sasrec", {"mask_prob": 0.3}, "--mask-prob"), ("multvae", {"layers": 2, "heads": 1}, "--heads, --layers")],
)
def test_a_setting_of_another_model_is_refused_by_name(model, given, refused):
    with pytest.raises(ConfigError, match=f"{refused}: not a setting of {model}"):
        model_settings(model, given)


def test_per_model_defaults_name_only_what_differs_from_train_config():
    for model, values in MODEL_DEFAULTS.items():
        for name, value in values.items():
            assert getattr(TrainConfig, name) != value, f"{model}: {name}={value} is TrainConfig's own default"


def test_the_sequence_models_refit_by_default_on_one_device_and_a_given_setting_wins():
    """BERT4Rec's and SASRec's default refit (docs/quality.md) is left out, with a note, where --devices rules
    it out; given with --devices N it is refused in one line; Mult-VAE, which cannot refit, does not."""
    for model in ("bert4rec", "sasrec"):
        cfg, notes = TrainConfig.for_model(model, {})
        assert cfg.refit and not notes
        assert not TrainConfig.for_model(model, {"refit": False})[0].refit
    assert not TrainConfig.for_model("multvae", {})[0].refit
    cfg, notes = TrainConfig.for_model("sasrec", {"devices": 2})
    assert not cfg.refit and notes == [
        "--devices 2: no refit (sasrec's default trains again on one device after validation); pass --devices 1 for it"
    ]
    cfg, notes = TrainConfig.for_model("sasrec", {"devices": 2, "refit": True})
    with pytest.raises(ConfigError, match="refit: runs on one device; drop --devices or --refit"):
        cfg.validate()


def test_the_settings_and_the_model_configs_import_without_torch():
    """`recserve train --help` shows these defaults; reading them must not load torch."""
    code = "import sys, recserve.train.train_config, recserve.models.model_configs; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
