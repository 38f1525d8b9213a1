"""BERT4Rec: shapes, padding, the one-query fast path, bad configs and the learning-rate schedule."""

import pytest
import torch

from recserve.errors import ConfigError
from recserve.models import Bert4Rec, Bert4RecConfig


def test_forward_gives_scores_at_the_last_position_for_any_length():
    """forward is the full encoder's last position through the tied output layer, for every length."""
    torch.manual_seed(0)
    model = Bert4Rec(Bert4RecConfig(num_items=50, window=10)).eval()
    for length in (1, 4, 10):
        tokens = torch.randint(1, 51, (3, length))
        tokens[:, -1] = 51  # the mask token last, as serving asks
        scores = model(tokens)
        assert scores.shape == (3, 52)
        with torch.no_grad():
            every_position = model.logits(model.encode(tokens))  # (3, L, 52): the slow path, all positions
        torch.testing.assert_close(scores, every_position[:, -1], atol=1e-5, rtol=1e-5)
        assert not torch.allclose(scores[0], every_position[0, 0]) or length == 1  # the last, not another


def test_padding_does_not_change_the_answer():
    model = Bert4Rec(Bert4RecConfig(num_items=50, window=10)).eval()
    tokens = torch.tensor([[5, 6, 51]])
    padded = torch.tensor([[0, 0, 0, 5, 6, 51]])
    torch.testing.assert_close(model(tokens), model(padded), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("bad", [{"window": 1}, {"hidden": 30, "heads": 4}, {"dropout": 1.0}, {"mask_prob": 0}])
def test_bad_config_is_refused_with_the_field(bad):
    with pytest.raises(ConfigError, match=next(iter(bad))):
        Bert4Rec(Bert4RecConfig(num_items=10, **bad))


@pytest.mark.parametrize("heads", [1, 4])
def test_the_last_position_fast_path_equals_the_full_encoder(heads):
    torch.manual_seed(0)
    model = Bert4Rec(Bert4RecConfig(num_items=50, window=12, layers=2, heads=heads, hidden=16)).eval()
    with torch.no_grad():  # weights and biases far from their initial values, so every term matters
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    tokens = torch.tensor([[0, 0, 3, 4, 5, 51], [7, 8, 9, 10, 11, 51], [0, 0, 0, 0, 0, 51]])
    torch.testing.assert_close(model.encode_last(tokens), model.encode(tokens)[:, -1], atol=1e-5, rtol=1e-5)
    model.prepare_inference()  # the one-query weights computed once instead of on every call
    assert model.blocks[-1].query_w is not None
    torch.testing.assert_close(model.encode_last(tokens), model.encode(tokens)[:, -1], atol=1e-5, rtol=1e-5)
    quantized = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
    # quantized layers keep the per-token projection; int8 activations leave only rounding noise
    torch.testing.assert_close(quantized.encode_last(tokens), model.encode_last(tokens), atol=0.1, rtol=0)


def test_cosine_schedule_warms_up_then_decays_to_zero():
    from recserve.train.lightning_modules import optimizer_with_schedule
    from recserve.train.trainer import TrainConfig

    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    config = optimizer_with_schedule(opt, TrainConfig(lr_schedule="cosine"), total_steps=100)
    schedule, rates = config["lr_scheduler"]["scheduler"], []
    for _ in range(100):
        rates.append(opt.param_groups[0]["lr"])
        opt.step()
        schedule.step()
    assert rates[0] == pytest.approx(0.2) and max(rates) == pytest.approx(rates[4]) and rates[4] > 0.99
    assert rates[-1] < 0.01 and all(a >= b for a, b in zip(rates[5:], rates[6:]))
    assert optimizer_with_schedule(opt, TrainConfig(), 100) is opt  # constant: the optimizer alone
