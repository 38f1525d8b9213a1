"""Catalogue losses: the exact softmax with seen items left out, and the sampled softmax that estimates it."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from recserve.constants import PAD_INDEX
from recserve.data.sequences import Sequences
from recserve.errors import ConfigError
from recserve.models import Bert4Rec, Bert4RecConfig
from recserve.train.batches import ClozeSettings, WindowEpochs
from recserve.train.losses import NEVER, CatalogueLoss, first_columns
from recserve.train.objectives import cloze_loss
from recserve.train.train_config import FULL_SOFTMAX_MAX_ITEMS, LossSettings

N = 40
MASK = N + 1


def _problem(seed=0, positions=6, hidden=8):
    gen = torch.Generator().manual_seed(seed)
    query = torch.randn(positions, hidden, generator=gen)
    table = torch.randn(N + 2, hidden, generator=gen) * 0.7
    bias = torch.randn(N + 2, generator=gen) * 0.3
    targets = torch.randint(1, N + 1, (positions,), generator=gen)
    rows = torch.arange(positions) % 2
    items = torch.tensor([[0, 0, 3, 7, 9, 12], [5, 6, 7, 8, 30, 31]])
    items[rows[0], 0] = targets[0]  # a target that is also in its own window stays the target
    return query, table, bias, targets, rows, items


def _reference(query, table, bias, targets, rows, items, exclude_seen, smoothing=0.0):
    """The softmax over the catalogue written one position at a time; with label smoothing the target's
    weight is 1 - smoothing and the rest is spread evenly over the items the position ranks."""
    losses = []
    for m in range(len(targets)):
        logits = query[m] @ table.T + bias
        drop = [PAD_INDEX, MASK] + (items[rows[m]].tolist() if exclude_seen else [])
        rankable = torch.ones(N + 2, dtype=torch.bool)
        rankable[[d for d in drop if d != targets[m]]] = False
        log_p = torch.log_softmax(logits.masked_fill(~rankable, -float("inf")), 0)
        spread = log_p[rankable].mean()
        losses.append(-(1 - smoothing) * log_p[targets[m]] - smoothing * spread)
    return torch.stack(losses)


def _call(loss, problem, exclude_seen, per_position=False, generator=None):
    query, table, bias, targets, rows, items = problem
    if not exclude_seen:
        return loss(query, table, bias, targets, negatives=loss.draw(generator))
    if per_position:
        return loss(query, table, bias, targets, items[rows], negatives=loss.draw(generator))
    return loss(query, table, bias, targets, items, rows, negatives=loss.draw(generator))


@pytest.mark.parametrize("smoothing", [0.0, 0.2])
@pytest.mark.parametrize("exclude_seen", [True, False])
@pytest.mark.parametrize("per_position", [True, False])
def test_full_loss_is_the_softmax_over_the_catalogue_without_the_sample_items(exclude_seen, per_position, smoothing):
    problem = _problem()
    loss = CatalogueLoss(LossSettings("full", smoothing=smoothing), np.ones(N + 2), MASK)
    torch.testing.assert_close(
        _call(loss, problem, exclude_seen, per_position), _reference(*problem, exclude_seen, smoothing)
    )


@pytest.mark.parametrize("smoothing", [0.0, 0.2])
@pytest.mark.parametrize("exclude_seen", [True, False])
def test_full_loss_gradients_are_those_of_the_plain_softmax(exclude_seen, smoothing):
    """The fused backward pass (softmax minus the target's one-hot, or its smoothed form) against autograd
    through the reference, with an unused slot (target padding) that must add nothing."""
    query, table, bias, targets, rows, items = _problem(positions=7)
    targets[-1] = PAD_INDEX
    weights = torch.rand(7, generator=torch.Generator().manual_seed(1))  # a non-uniform upstream gradient
    grads = []
    for fused in (True, False):
        leaves = [t.clone().requires_grad_() for t in (query, table, bias)]
        if fused:
            loss = CatalogueLoss(LossSettings("full", smoothing=smoothing), np.ones(N + 2), MASK)
            per_position = _call(loss, (*leaves, targets, rows, items), exclude_seen)
        else:
            real = targets != PAD_INDEX
            per_position = torch.zeros(7).index_put(
                (real.nonzero()[:, 0],),
                _reference(*leaves, targets[real], rows[real], items, exclude_seen, smoothing),
            )
        (per_position * weights).sum().backward()
        grads.append([t.grad for t in leaves])
    for fused_grad, plain_grad in zip(*grads):
        torch.testing.assert_close(fused_grad, plain_grad)


def test_label_smoothing_is_refused_where_it_has_no_meaning():
    """Out of [0, 1) it is a settings error; with a sampled loss (its softmax ranks a pool, not the catalogue)
    the loss refuses it, naming the option that works."""
    assert any("label_smoothing=1.0" in p for p in LossSettings("full", smoothing=1.0).validate())
    assert any("label_smoothing=-0.1" in p for p in LossSettings("full", smoothing=-0.1).validate())
    assert any("exact softmax" in p for p in LossSettings("sampled-uniform", smoothing=0.1).validate())
    auto = LossSettings(smoothing=0.1)
    assert auto.validate() == []
    with pytest.raises(ConfigError, match="--loss full"):
        CatalogueLoss(auto.resolve(FULL_SOFTMAX_MAX_ITEMS + 1), np.ones(N + 2), MASK)


def test_unused_slots_cost_nothing():
    query, table, bias, targets, rows, items = _problem()
    targets[3:] = PAD_INDEX
    for name in ("full", "sampled-uniform"):
        loss = CatalogueLoss(LossSettings(name, negatives=64), np.ones(N + 2), MASK)
        per = loss(query, table, bias, targets, items, rows)
        assert (per[3:] == 0).all() and (per[:3] > 0).all()


def test_first_columns_finds_each_pool_items_first_column_in_each_row():
    """Against a loop over every row and pool item: duplicates in the pool and in a row, padding in both,
    items absent from the pool or from every row."""
    gen = torch.Generator().manual_seed(0)
    for _ in range(100):
        vocab, rows, width, size = (int(torch.randint(2, n, (1,), generator=gen)) for n in (30, 6, 9, 20))
        items = torch.randint(0, vocab, (rows, width), generator=gen)
        pool = torch.randint(0, vocab, (size,), generator=gen)
        expected = torch.full((rows, size), NEVER, dtype=torch.int16)
        for row in range(rows):
            for slot, item in enumerate(pool.tolist()):
                where = (items[row] == item).nonzero()
                if item != PAD_INDEX and len(where):
                    expected[row, slot] = int(where[0])
        assert torch.equal(first_columns(items, pool), expected), (items, pool)


@pytest.mark.parametrize("name", ["sampled-uniform", "sampled-popularity"])
@pytest.mark.parametrize(("exclude_seen", "per_position"), [(True, False), (True, True), (False, False)])
def test_sampled_loss_with_log_q_correction_estimates_the_full_loss(name, exclude_seen, per_position):
    problem = _problem()
    popularity = np.random.default_rng(0).zipf(1.5, N + 2).astype(float)
    sampled = CatalogueLoss(LossSettings(name, negatives=200_000), popularity, MASK)
    estimate = _call(sampled, problem, exclude_seen, per_position, torch.Generator().manual_seed(0))
    torch.testing.assert_close(estimate, _reference(*problem, exclude_seen), rtol=0.03, atol=0.03)


@pytest.mark.parametrize("name", ["sampled-uniform", "sampled-popularity"])
def test_the_negatives_follow_their_weights_and_a_seed_repeats_them(name):
    """200,000 draws: each item's count within 5 standard deviations of its weight's share; padding, the mask
    token and a left-out item never drawn; the same seed the same draws, another seed others."""
    counts = np.arange(N + 2, dtype=np.float64) ** 2  # popularity rising with the index
    left_out = np.zeros(N + 2, dtype=bool)
    left_out[N] = True  # the most popular item, left out of every softmax
    loss = CatalogueLoss(LossSettings(name, negatives=200_000), counts, MASK, left_out=left_out)
    drawn = loss.draw(torch.Generator().manual_seed(3))
    weights = counts + 1.0 if name == "sampled-popularity" else np.ones(N + 2)
    weights[[PAD_INDEX, MASK, N]] = 0.0
    share = weights / weights.sum()
    seen = np.bincount(drawn.numpy(), minlength=N + 2)
    assert seen[[PAD_INDEX, MASK, N]].sum() == 0
    spread = np.sqrt(200_000 * share * (1 - share))
    assert np.all(np.abs(seen - 200_000 * share) <= 5 * spread + 1e-9)
    assert torch.equal(drawn, loss.draw(torch.Generator().manual_seed(3)))
    assert not torch.equal(drawn, loss.draw(torch.Generator().manual_seed(4)))


def test_a_sampled_loss_with_nothing_to_draw_is_refused():
    """Every item left out: a sampled loss says so when it is made (a full one has nothing to draw anyway)."""
    every = np.ones(N + 2, dtype=bool)
    with pytest.raises(ConfigError, match="sampled-uniform loss has no item to draw"):
        CatalogueLoss(LossSettings("sampled-uniform", negatives=10), np.ones(N + 2), MASK, left_out=every)
    assert CatalogueLoss(LossSettings("full"), np.ones(N + 2), MASK, left_out=every).draw() is None


def test_without_log_q_correction_the_sampled_loss_would_be_far_off():
    """The correction matters: the same pool scored without it misses the full loss by far."""
    problem = _problem()
    sampled = CatalogueLoss(LossSettings("sampled-uniform", negatives=200_000), np.ones(N + 2), MASK)
    sampled.p_draw = sampled.p_popular = torch.full((N + 2,), 1 / 200_000)  # log Q = 0: no correction
    estimate = _call(sampled, problem, True, generator=torch.Generator().manual_seed(0))
    assert (estimate - _reference(*problem, True)).abs().min() > 1.0


def test_auto_picks_the_exact_softmax_up_to_the_threshold():
    assert LossSettings().resolve(FULL_SOFTMAX_MAX_ITEMS).name == "full"
    assert LossSettings().resolve(FULL_SOFTMAX_MAX_ITEMS + 1).name == "sampled-uniform"
    assert LossSettings("sampled-popularity").resolve(10).name == "sampled-popularity"
    assert LossSettings("sampled-uniform", 512).describe() == {
        "name": "sampled-uniform",
        "exclude_seen": True,
        "negatives": 512,
        "in_batch": True,
        "log_q_correction": True,
    }
    with pytest.raises(ConfigError, match="resolved"):
        CatalogueLoss(LossSettings(), np.ones(N + 2), MASK)
    expected = "loss='softmax': expected one of auto, full, sampled-uniform, sampled-popularity"
    assert LossSettings("softmax").validate() == [expected]


def _cloze_batch(users: int, mask_prob: float):
    """One Cloze batch of ``users`` random 16-item histories over 50 items (mask token 51)."""
    seq = Sequences(
        items=np.random.default_rng(0).integers(1, 51, 16 * users), offsets=np.arange(0, 16 * users + 1, 16)
    )
    return next(iter(WindowEpochs(seq, ClozeSettings(16, 51, mask_prob, 0.1), users, 1, seed=0)))


@pytest.mark.parametrize("name", ["full", "sampled-uniform"])
def test_a_few_cloze_steps_lower_the_loss(name):
    torch.manual_seed(0)
    model = Bert4Rec(Bert4RecConfig(num_items=50, window=16, hidden=32, dropout=0.0))
    batch = _cloze_batch(32, 0.2)
    loss = CatalogueLoss(LossSettings(name, negatives=256), np.ones(52), 51)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        value = cloze_loss(model, batch, loss, loss.draw(torch.Generator().manual_seed(0)))
        optimizer.zero_grad()
        value.backward()
        optimizer.step()
        losses.append(value.item())
    assert losses[-1] < 0.7 * losses[0]


def test_cloze_loss_is_the_mean_over_masked_positions():
    torch.manual_seed(0)
    model = Bert4Rec(Bert4RecConfig(num_items=50, window=8, hidden=16, dropout=0.0)).eval()
    seq = Sequences(items=np.arange(1, 25), offsets=np.array([0, 8, 16, 24]))
    batch = next(iter(WindowEpochs(seq, ClozeSettings(8, 51, 0.3, 0.0), 3, 1, seed=1)))
    loss = CatalogueLoss(LossSettings("full", exclude_seen=False), np.ones(52), 51)
    masked = batch.tokens == 51
    logits = model.logits(model.encode(batch.tokens))[masked]
    logits[:, [PAD_INDEX, 51]] = -float("inf")
    expected = F.cross_entropy(logits, batch.items[masked])
    torch.testing.assert_close(cloze_loss(model, batch, loss), expected)


@pytest.mark.parametrize("input_mask", [0.0, 0.5])
def test_next_item_loss_leaves_out_only_the_items_up_to_each_position(input_mask):
    """With inputs masked (the augmentation), the masked items are still the ones left out: what the user saw."""
    from recserve.models import SASRec, SASRecConfig
    from recserve.train.batches import NextItemSettings
    from recserve.train.objectives import next_item_loss

    torch.manual_seed(0)
    model = SASRec(SASRecConfig(num_items=50, window=6, hidden=16, dropout=0.0)).eval()
    seq = Sequences(items=np.array([4, 9, 4, 17, 30, 2]), offsets=np.array([0, 6]))
    batch = next(iter(WindowEpochs(seq, NextItemSettings(6, input_mask, 51), 1, 1, seed=1)))
    assert (batch.tokens == 51).any() == bool(input_mask)  # seed 1 masks two of the five inputs
    loss = CatalogueLoss(LossSettings("full"), np.ones(52), 51)
    logits = model.logits(model.encode(batch.tokens))[0]  # (L, V)
    expected = []
    for col, target in zip(batch.cols.tolist(), batch.targets.tolist()):
        row = logits[col].clone()
        before = set(batch.items[0, : col + 1].tolist()) - {target}
        row[[PAD_INDEX, 51, *before]] = -float("inf")  # seen so far: left out, except a repeated target
        expected.append(-torch.log_softmax(row, 0)[target])
    assert batch.targets.tolist() == [9, 4, 17, 30, 2]  # 4 comes back: it stays rankable where it is the target
    torch.testing.assert_close(next_item_loss(model, batch, loss), torch.stack(expected).mean())


def test_masked_inputs_keep_the_windows_and_targets_and_never_touch_padding():
    """The augmentation draws after the windows: the same seed gives the same windows, positions and targets
    with inputs masked or not; a masked input becomes the reserved token, padding never does, and about the
    share asked is masked."""
    from recserve.train.batches import NextItemSettings

    rng = np.random.default_rng(0)
    lengths = rng.integers(2, 30, 200)
    seq = Sequences(rng.integers(1, 51, lengths.sum()), np.concatenate([[0], np.cumsum(lengths)]))
    plain = next(iter(WindowEpochs(seq, NextItemSettings(20), 200, 1, seed=3)))
    masked = next(iter(WindowEpochs(seq, NextItemSettings(20, 0.3, 51), 200, 1, seed=3)))
    for name in ("items", "rows", "cols", "targets"):
        torch.testing.assert_close(getattr(masked, name), getattr(plain, name))
    changed = masked.tokens != plain.tokens
    assert (masked.tokens[changed] == 51).all() and (plain.tokens[changed] != PAD_INDEX).all()
    assert 0.25 < changed.sum() / (plain.tokens != PAD_INDEX).sum() < 0.35


def test_a_compiled_training_step_computes_the_same_loss_and_gradients():
    torch.manual_seed(0)
    model = Bert4Rec(Bert4RecConfig(num_items=50, window=16, hidden=16, dropout=0.0))
    batch = _cloze_batch(8, 0.3)
    loss = CatalogueLoss(LossSettings("full"), np.ones(52), 51)
    eager = cloze_loss(model, batch, loss)
    eager.backward()
    expected = model.item_emb.weight.grad.clone()
    model.zero_grad()
    compiled = torch.compile(cloze_loss)(model, batch, loss)  # what --compile runs
    compiled.backward()
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(model.item_emb.weight.grad, expected, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("task", ["cloze", "next item"])
def test_a_sampled_training_step_compiles_to_one_graph(task):
    """torch.compile takes a sampled step whole, as one graph: the negatives are drawn before it (it takes
    no generator) and no shape in it depends on the data (``first_columns`` makes none)."""
    from recserve.models import SASRec, SASRecConfig
    from recserve.train.batches import NextItemSettings
    from recserve.train.objectives import next_item_loss

    torch.manual_seed(0)
    loss = CatalogueLoss(LossSettings("sampled-uniform", negatives=256), np.ones(52), 51)
    if task == "cloze":
        model, batch, objective = (
            Bert4Rec(Bert4RecConfig(num_items=50, window=16, hidden=32)),
            _cloze_batch(32, 0.2),
            cloze_loss,
        )
    else:
        seq = Sequences(np.random.default_rng(0).integers(1, 51, 16 * 32), np.arange(0, 16 * 32 + 1, 16))
        model, objective = SASRec(SASRecConfig(num_items=50, window=16, hidden=32)), next_item_loss
        batch = next(iter(WindowEpochs(seq, NextItemSettings(16), 32, 1, seed=0)))
    explained = torch._dynamo.explain(objective)(model, batch, loss, loss.draw(torch.Generator().manual_seed(0)))
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons


def _sampled_reference(loss, query, table, bias, targets, seen_items, generator):
    """The sampled softmax written plainly from the same pool: ``seen_items[c]`` is what position c leaves out."""
    drawn = torch.multinomial(loss.p_draw, loss.settings.negatives, replacement=True, generator=generator)
    in_batch = targets[: loss.settings.negatives]
    pool = torch.cat([in_batch, drawn])
    expected = len(in_batch) * loss.p_popular[pool] + loss.settings.negatives * loss.p_draw[pool]
    out = []
    for c in range(len(targets)):
        logits = query[c] @ table[pool].T + bias[pool] - expected.log()
        drop = torch.isin(pool, torch.tensor(sorted(seen_items[c] | {PAD_INDEX, MASK, int(targets[c])})))
        positive = query[c] @ table[targets[c]] + bias[targets[c]]
        out.append(torch.logaddexp(positive, torch.logsumexp(logits[~drop], 0)) - positive)
    return torch.stack(out)


@pytest.mark.parametrize("upto", [False, True])
def test_sampled_loss_in_blocks_has_the_plain_losses_and_gradients(monkeypatch, upto):
    """Blocks of 3 positions (the bound forced low) give the losses and gradients of the sampled softmax
    written plainly, with each position's seen items (its whole row, or the row up to ``upto``) left out."""
    import recserve.train.losses as losses

    monkeypatch.setattr(losses, "POOL_CHUNK_ELEMENTS", 3 * 30)  # 30 pool items: blocks of 3 of 6 positions
    query, table, bias, targets, rows, items = _problem()
    cols = torch.tensor([0, 1, 2, 3, 4, 5]) if upto else None
    seen = [set(items[r, : (int(cols[c]) + 1 if upto else None)].tolist()) for c, r in enumerate(rows.tolist())]
    loss = CatalogueLoss(LossSettings("sampled-popularity", negatives=24), np.arange(N + 2.0), MASK)
    grads = []
    for plain in (False, True):
        leaves = [t.clone().requires_grad_() for t in (query, table, bias)]
        gen = torch.Generator().manual_seed(3)
        if plain:
            value = _sampled_reference(loss, *leaves, targets, [s - {int(t)} for s, t in zip(seen, targets)], gen)
        else:
            value = loss(*leaves, targets, items, rows, loss.draw(gen), cols)
        (value * torch.arange(1.0, 7.0)).sum().backward()
        grads.append((value.detach(), [t.grad for t in leaves]))
    torch.testing.assert_close(grads[0][0], grads[1][0])
    for blocked, plain in zip(grads[0][1], grads[1][1]):
        torch.testing.assert_close(blocked, plain)


def test_a_sasrec_step_at_a_million_items_keeps_every_tensor_under_the_bound():
    """One sampled SASRec step (forward and backward) at 1M items, 128 windows of 100, 8,192 negatives:
    no tensor but the item table's own (1M x 64) holds more than ``POOL_CHUNK_ELEMENTS`` (64M) elements,
    while the positions x pool scores would be 12,672 x 16,384 = 208M."""
    from torch.utils._python_dispatch import TorchDispatchMode

    import recserve.train.losses as losses
    from recserve.models import SASRec, SASRecConfig
    from recserve.train.batches import NextItemSettings
    from recserve.train.objectives import next_item_loss

    class Largest(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.largest = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(t, torch.Tensor) and t.shape not in {(1_000_002, 64), (1_000_002,)}:
                    self.largest = max(self.largest, t.numel())
            return out

    items = 1_000_000
    rng = np.random.default_rng(0)
    seq = Sequences(rng.integers(1, items + 1, 128 * 100), np.arange(0, 128 * 100 + 1, 100))
    batch = next(iter(WindowEpochs(seq, NextItemSettings(100), 128, 1, seed=0)))
    model = SASRec(SASRecConfig(num_items=items, window=100, dropout=0.0))
    loss = CatalogueLoss(LossSettings("sampled-uniform"), np.ones(items + 2), items + 1)
    with Largest() as mode:
        next_item_loss(model, batch, loss, loss.draw(torch.Generator().manual_seed(0))).backward()
    positions, pool = len(batch.targets), 2 * LossSettings().negatives
    assert positions * pool > 3 * losses.POOL_CHUNK_ELEMENTS  # what one tensor of them would be
    assert 0 < mode.largest <= losses.POOL_CHUNK_ELEMENTS
