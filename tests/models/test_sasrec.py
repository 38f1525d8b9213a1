"""SASRec: causal attention, the next item at every position, and the serving fast path."""

import pytest
import torch

from recserve.errors import ConfigError
from recserve.models import SASRec, SASRecConfig

N = 50
RESERVED = N + 1


def _model(**overrides) -> SASRec:
    torch.manual_seed(0)
    model = SASRec(SASRecConfig(num_items=N, window=12, hidden=16, **overrides)).eval()
    with torch.no_grad():  # weights far from their initial values, so every term matters
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return model


def test_scores_follow_the_history_before_the_reserved_token():
    model = _model()
    tokens = torch.tensor([[0, 0, 3, 4, 5, RESERVED], [7, 8, 9, 10, 11, RESERVED]])
    scores = model(tokens)
    assert scores.shape == (2, N + 2)
    expected = model.logits(model.encode(torch.tensor([[0, 0, 0, 3, 4, 5], [0, 7, 8, 9, 10, 11]]))[:, -1])
    torch.testing.assert_close(scores, expected, atol=1e-5, rtol=1e-5)  # the last item's state scores the next


def test_a_position_never_sees_the_items_after_it():
    model = _model(layers=2, heads=2)
    a = model.encode(torch.tensor([[0, 3, 4, 5, 6, 7]]))
    b = model.encode(torch.tensor([[0, 3, 4, 5, 9, 1]]))  # the last two items differ
    torch.testing.assert_close(a[:, :4], b[:, :4], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(a[:, 4:], b[:, 4:])


@pytest.mark.parametrize("heads", [1, 2])
def test_the_last_position_fast_path_equals_the_full_encoder(heads):
    model = _model(layers=2, heads=heads)
    history = torch.tensor([[0, 0, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12], [0, 0, 0, 0, 0, 40]])
    torch.testing.assert_close(model.encode_last(history), model.encode(history)[:, -1], atol=1e-5, rtol=1e-5)
    model.prepare_inference()
    torch.testing.assert_close(model.encode_last(history), model.encode(history)[:, -1], atol=1e-5, rtol=1e-5)


def test_padding_and_an_empty_history_are_harmless():
    model = _model()
    short = model(torch.tensor([[5, 6, RESERVED]]))
    padded = model(torch.tensor([[0, 0, 0, 5, 6, RESERVED]]))
    torch.testing.assert_close(short, padded, atol=1e-5, rtol=1e-5)
    assert torch.isfinite(model(torch.tensor([[RESERVED]]))).all()  # the serving graph falls back to popularity


@pytest.mark.parametrize("bad", [{"window": 1}, {"hidden": 30, "heads": 4}, {"dropout": 1.0}, {"layers": 0}])
def test_bad_config_is_refused_with_the_field(bad):
    with pytest.raises(ConfigError, match=next(iter(bad))):
        SASRec(SASRecConfig(num_items=10, **bad))


def test_dropout_follows_the_data_unless_given(ml100k_dir, string_data_dir):
    """0.5 on sparse data (median training history under 20 items), 0.2 on dense; --dropout wins."""
    from recserve.data.datasets import load_prepared
    from recserve.train.lightning_modules import build_task
    from recserve.train.trainer import TrainConfig

    cfg = TrainConfig(device="cpu")
    dense, sparse = load_prepared(ml100k_dir), load_prepared(string_data_dir)  # medians 63 and 10 items
    assert build_task("sasrec", dense, {}, cfg).model_cfg.dropout == 0.2
    assert build_task("sasrec", sparse, {}, cfg).model_cfg.dropout == 0.5
    assert build_task("sasrec", sparse, {"dropout": 0.1}, cfg).model_cfg.dropout == 0.1
    assert build_task("bert4rec", sparse, {}, cfg).model_cfg.dropout == 0.2  # BERT4Rec keeps its one default


@pytest.mark.parametrize(
    "positional",
    [
        {"relative_positions": True},
        {"attention_span": 3},
        {"relative_positions": True, "attention_span": 4},
        {"ligr": True},
        {"lru": True},
    ],
)
def test_relative_positions_and_local_attention_keep_the_fast_path_and_padding_exact(positional):
    """With a distance bias or a span, the serving fast path still equals the full encoder, padding still
    changes nothing, and the option does change the answer (its bias or span is used)."""
    model = _model(layers=2, heads=2, **positional)
    history = torch.tensor([[0, 0, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12], [0, 0, 0, 0, 0, 40]])
    torch.testing.assert_close(model.encode_last(history), model.encode(history)[:, -1], atol=1e-5, rtol=1e-5)
    model.prepare_inference()
    torch.testing.assert_close(model.encode_last(history), model.encode(history)[:, -1], atol=1e-5, rtol=1e-5)
    short, padded = model(torch.tensor([[5, 6, 7, RESERVED]])), model(torch.tensor([[0, 0, 5, 6, 7, RESERVED]]))
    torch.testing.assert_close(short, padded, atol=1e-5, rtol=1e-5)
    plain = _model(layers=2, heads=2, relative_positions=False)
    assert not torch.allclose(plain.encode(history), model.encode(history), atol=1e-3)


def test_the_relative_position_bias_moves_both_paths_and_they_agree_on_it():
    """The same weights with the distance bias and without it (zeroed) answer differently on the full encoder
    and on the serving fast path (the bias is read on both), and the two paths agree with the bias on."""
    model = _model(layers=2, heads=2, relative_positions=True)
    history = torch.tensor([[0, 0, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]])
    biased_full, biased_last = model.encode(history)[:, -1], model.encode_last(history)
    with torch.no_grad():
        for block in model.modules():
            if getattr(block, "rel_bias", None) is not None:
                block.rel_bias.zero_()
    assert not torch.allclose(model.encode(history)[:, -1], biased_full, atol=1e-3)
    assert not torch.allclose(model.encode_last(history), biased_last, atol=1e-3)
    torch.testing.assert_close(biased_last, biased_full, atol=1e-5, rtol=1e-5)


def test_an_attention_span_hides_the_items_beyond_it():
    model = _model(layers=1, attention_span=2)  # each position sees itself and the one before
    a = model.encode_last(torch.tensor([[1, 2, 3, 4, 5, 6]]))
    b = model.encode_last(torch.tensor([[9, 9, 9, 9, 5, 6]]))
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    with pytest.raises(ConfigError, match="attention_span=-1"):
        SASRec(SASRecConfig(num_items=10, attention_span=-1))


def test_ligr_gates_move_both_paths_and_they_agree_on_them():
    """The LiGR blocks' gates are read on the full encoder and on the serving fast path (zeroing their weights
    changes both), the two paths agree with them, and the feed-forward is the gated one."""
    model = _model(layers=2, heads=2, ligr=True)
    assert all(type(block.ffn).__name__ == "SwiGLU" and block.gates is not None for block in model.blocks)
    history = torch.tensor([[0, 0, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]])
    gated_full, gated_last = model.encode(history)[:, -1], model.encode_last(history)
    torch.testing.assert_close(gated_last, gated_full, atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        for block in model.blocks:
            for gate in block.gates:
                gate.weight.zero_()
    assert not torch.allclose(model.encode(history)[:, -1], gated_full, atol=1e-3)
    assert not torch.allclose(model.encode_last(history), gated_last, atol=1e-3)


def test_the_recurrent_mixer_is_the_lru_recurrence_and_moves_both_paths():
    """``lru``: the mixer's matrix products give what the complex recurrence z_t = lambda z_(t-1) + gamma B x_t,
    read out as C z_t, gives step by step; padding (left) adds nothing to any position; zeroing its readout
    changes the full encoder and the serving fast path alike, and the two agree with it on."""
    model = _model(layers=2, heads=2, lru=True)
    mixer = model.blocks[0].mixer
    x, real = torch.randn(2, 6, 16), torch.ones(2, 6, dtype=torch.bool)
    log_radius, angle, gamma = mixer._decay()
    lam = torch.exp(torch.complex(log_radius, angle))
    a, b = mixer.into(x).chunk(2, -1)
    inputs, state, steps = torch.complex(a, b) * gamma, torch.zeros(2, 16, dtype=torch.cfloat), []
    for t in range(6):
        state = lam * state + inputs[:, t]
        steps.append(mixer.out(torch.cat([state.real, state.imag], -1)))
    with torch.no_grad():
        torch.testing.assert_close(mixer(x, real), torch.stack(steps, 1), atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(mixer.forward_last(x, real)[:, 0], steps[-1], atol=1e-5, rtol=1e-4)
        short, padded = model.encode(torch.tensor([[3, 4, 5]])), model.encode(torch.tensor([[0, 0, 3, 4, 5]]))
        torch.testing.assert_close(short, padded[:, 2:], atol=1e-5, rtol=1e-5)
    history = torch.tensor([[0, 0, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]])
    mixed_full, mixed_last = model.encode(history)[:, -1], model.encode_last(history)
    torch.testing.assert_close(mixed_last, mixed_full, atol=1e-5, rtol=1e-5)
    whole = torch.randint(1, N, (2, 12))  # the window's length: what the serving graph is fed
    made = [model.encode(history), model.encode_last(history), model.encode(whole), model.encode_last(whole)]
    model.prepare_inference()  # serving's matrices made once for the whole window (sliced for 6 positions)
    assert model.blocks[0].mixer.frozen is not None
    frozen = [model.encode(history), model.encode_last(history), model.encode(whole), model.encode_last(whole)]
    for served, fresh in zip(frozen, made, strict=True):
        torch.testing.assert_close(served, fresh, atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        for block in model.blocks:
            block.mixer.frozen = None  # made again from the weights below
            block.mixer.out.weight.zero_()
            block.mixer.out.bias.zero_()
    assert not torch.allclose(model.encode(history)[:, -1], mixed_full, atol=1e-3)
    assert not torch.allclose(model.encode_last(history), mixed_last, atol=1e-3)
