"""BERT4Rec: shapes, Cloze masking, and a training step that learns."""

import numpy as np
import pytest
import torch

from recserve.constants import PAD_INDEX
from recserve.data.sequences import Sequences
from recserve.errors import ConfigError
from recserve.models import Bert4Rec, Bert4RecConfig
from recserve.train.cloze import ClozeSettings, cloze_batch


def _seq(lengths, num_items=50, seed=0):
    rng = np.random.default_rng(seed)
    items = rng.integers(1, num_items + 1, sum(lengths))
    return Sequences(items=items, offsets=np.concatenate([[0], np.cumsum(lengths)]))


def test_forward_gives_scores_at_the_last_position_for_any_length():
    model = Bert4Rec(Bert4RecConfig(num_items=50, window=10)).eval()
    for length in (1, 4, 10):
        assert model(torch.randint(0, 52, (3, length))).shape == (3, 52)


def test_padding_does_not_change_the_answer():
    model = Bert4Rec(Bert4RecConfig(num_items=50, window=10)).eval()
    tokens = torch.tensor([[5, 6, 51]])
    padded = torch.tensor([[0, 0, 0, 5, 6, 51]])
    torch.testing.assert_close(model(tokens), model(padded), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("bad", [{"window": 1}, {"hidden": 30, "heads": 4}, {"dropout": 1.0}, {"mask_prob": 0}])
def test_bad_config_is_refused_with_the_field(bad):
    with pytest.raises(ConfigError, match=next(iter(bad))):
        Bert4Rec(Bert4RecConfig(num_items=10, **bad))


def test_cloze_masks_never_touch_padding_and_every_sample_predicts_something():
    seq = _seq([3, 30, 12, 1])
    settings = ClozeSettings(window=16, mask_index=51, mask_prob=0.3, last_item_rate=0.2)
    tokens, labels = cloze_batch(seq, np.arange(4), np.random.default_rng(0), settings)
    padding = tokens == PAD_INDEX
    assert not (labels[padding] != PAD_INDEX).any()  # padding is never a target
    assert ((tokens == 51) == (labels != PAD_INDEX)).all()  # masked exactly where a label is
    assert (labels != PAD_INDEX).any(1).all()
    assert tokens.shape == (4, 16) and padding[3, :-1].all()  # a 1-item user: 15 padding tokens


def test_last_item_samples_mask_only_the_last_item():
    seq = _seq([20] * 64)
    settings = ClozeSettings(window=20, mask_index=51, mask_prob=0.2, last_item_rate=1.0)
    tokens, labels = cloze_batch(seq, np.arange(64), np.random.default_rng(1), settings)
    assert (labels[:, :-1] == PAD_INDEX).all() and (tokens[:, -1] == 51).all()


def test_loss_decreases_on_a_fixed_batch():
    torch.manual_seed(0)
    model = Bert4Rec(Bert4RecConfig(num_items=50, window=16, hidden=32, dropout=0.0))
    seq = _seq([16] * 32)
    batch = cloze_batch(seq, np.arange(32), np.random.default_rng(0), ClozeSettings(16, 51, 0.2, 0.1))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        loss = model.cloze_loss(*batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0]


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


def test_loss_with_seen_items_excluded_is_the_softmax_over_the_unseen_items():
    torch.manual_seed(0)
    model = Bert4Rec(Bert4RecConfig(num_items=20, window=6, dropout=0.0)).eval()
    mask = model.cfg.mask_index
    tokens = torch.tensor([[0, 3, mask, 7, mask]])
    labels = torch.tensor([[0, 0, 5, 0, 9]])
    logits = model.logits(model.encode(tokens))[0]  # (L, V)
    expected = []
    for position, target, others in ((2, 5, [3, 7, 9]), (4, 9, [3, 7, 5])):
        row = logits[position].clone()
        row[[PAD_INDEX, mask, *others]] = -float("inf")  # the sample's other items, masked or not
        expected.append(-torch.log_softmax(row, 0)[target])
    torch.testing.assert_close(model.cloze_loss(tokens, labels, exclude_seen=True), torch.stack(expected).mean())
    assert model.cloze_loss(tokens, labels, exclude_seen=False) > model.cloze_loss(tokens, labels, exclude_seen=True)


def test_cosine_schedule_warms_up_then_decays_to_zero():
    from recserve.train.tasks import optimizer_with_schedule
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
