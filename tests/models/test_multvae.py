"""Mult-VAE: shapes, the bag-of-items input, the annealed loss, and bad configs."""

import pytest
import torch

from recserve.constants import PAD_INDEX
from recserve.errors import ConfigError
from recserve.models.model_configs import MultVAEConfig
from recserve.models.multvae import Bag, MultVAE


def small(**overrides) -> MultVAE:
    torch.manual_seed(0)
    return MultVAE(MultVAEConfig(num_items=50, hidden=16, latent=8, **overrides)).eval()


def test_scores_cover_the_vocabulary_and_ignore_order_and_padding():
    model = small()
    history = torch.tensor([[0, 0, 3, 7, 9]])
    scores = model(history)
    assert scores.shape == (1, 52)
    shuffled_and_padded = torch.tensor([[9, 0, 3, 0, 7, 0, 0]])
    assert torch.allclose(model(shuffled_and_padded), scores)


def test_the_reserved_index_is_never_an_input():
    model = small()
    hot = model.multi_hot(torch.tensor([[0, 5, model.cfg.mask_index]]))
    assert hot[0, 5] == 1 and hot[0, PAD_INDEX] == 0 and hot[0, model.cfg.mask_index] == 0
    assert torch.allclose(model(torch.tensor([[5, model.cfg.mask_index]])), model(torch.tensor([[5]])))


def test_kl_weight_grows_linearly_to_the_cap():
    model = small(anneal_cap=0.2, anneal_steps=100)  # as in the paper: step / total steps, capped
    assert [model.beta(s) for s in (0, 10, 20, 1000)] == [0.0, 0.1, 0.2, 0.2]


def _bag(rows_items) -> Bag:
    rows = torch.tensor([r for r, items in enumerate(rows_items) for _ in items])
    return Bag(torch.tensor([i for items in rows_items for i in items]), rows, len(rows_items))


def test_the_sparse_encoder_equals_the_dense_multi_hot_one():
    model = small()
    histories = [[3, 7, 9], [1], [5, 6, 7, 8, 30, 31, 49]]
    mu, logvar = model.encode_bag(_bag(histories))
    hot = torch.zeros(3, 52)
    for row, items in enumerate(histories):
        hot[row, items] = 1
    dense_mu, dense_logvar = model.encode(hot)
    torch.testing.assert_close(mu, dense_mu)
    torch.testing.assert_close(logvar, dense_logvar)


def test_loss_is_the_multinomial_nll_plus_weighted_kl():
    model = small()
    bag = _bag([[3, 4, 5, 6, 7, 8]] * 4)
    loss0, nll0 = model.loss(bag, beta=0.0)
    loss1, nll1 = model.loss(bag, beta=1.0)
    log_probs = torch.log_softmax(model(torch.tensor([[3, 4, 5, 6, 7, 8]])), 1)
    torch.testing.assert_close(nll0, -log_probs[0, 3:9].sum())  # the multinomial NLL of the user's items
    assert torch.allclose(loss0, nll0) and torch.allclose(nll0, nll1)
    assert loss1 > loss0  # eval mode: z is the mean, and the KL of a non-standard posterior is positive


def test_a_few_steps_lower_the_loss():
    model = small(dropout=0.0).train()
    bag = _bag([list(range(1, 10))] * 16 + [list(range(30, 40))] * 16)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    first = None
    for _ in range(30):
        loss, nll = model.loss(bag, beta=0.0)
        first = first if first is not None else nll.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert nll.item() < 0.8 * first


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"latent": 0}, "latent=0"),
        ({"dropout": 1.0}, "dropout=1.0"),
        ({"anneal_cap": 2.0}, "anneal_cap=2.0"),
        ({"window": 1}, "window=1"),
    ],
)
def test_bad_configs_are_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        MultVAE(MultVAEConfig(num_items=10, **overrides))
