"""The transformer's dropout on CPUs (a uniform draw) keeps what dropout promises: the share dropped and the
expectation of the output."""

import torch
import torch.nn.functional as F

from recserve.models.transformer import attention, dropout


def test_dropout_drops_the_share_asked_and_scales_the_rest():
    x = torch.ones(200_000)
    y = dropout(x, 0.3, training=True)
    assert abs((y == 0).float().mean().item() - 0.3) < 0.005
    torch.testing.assert_close(y[y != 0], torch.full_like(y[y != 0], 1 / 0.7))
    assert dropout(x, 0.3, training=False) is x


def test_attention_with_dropout_is_sdpa_in_expectation_and_exact_without():
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 6, 4, generator=gen) for _ in range(3))
    keep = torch.rand(2, 1, 6, 6, generator=gen) > 0.3
    keep |= torch.eye(6, dtype=torch.bool)  # every query keeps a key
    plain = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
    torch.testing.assert_close(attention(q, k, v, keep, 0.0), plain)
    torch.manual_seed(0)
    mean = torch.stack([attention(q, k, v, keep, 0.2) for _ in range(4000)]).mean(0)
    torch.testing.assert_close(mean, plain, atol=0.05, rtol=0)
