"""Cloze batches built from flat tensors: windows, masks, the kept positions and their split across ranks."""

import numpy as np
import pytest
import torch

from recserve.constants import PAD_INDEX
from recserve.data.sequences import Sequences
from recserve.train.batches import ClozeSettings, NextItemSettings, WindowEpochs, masked_capacity
from recserve.train.tensors import SequenceTensors, row_contains

MASK = 51


def _seq(lengths, num_items=50, seed=0):
    rng = np.random.default_rng(seed)
    items = rng.integers(1, num_items + 1, sum(lengths))
    return Sequences(items=items, offsets=np.concatenate([[0], np.cumsum(lengths)]))


def _batch(seq, settings, users, seed=0, capacity=None, rank=0, world=1):
    tensors = SequenceTensors.from_sequences(seq)
    return settings.batch(tensors, torch.as_tensor(users), torch.Generator().manual_seed(seed), capacity, rank, world)


def test_windows_match_the_host_sequences():
    seq = _seq([3, 30, 12, 1, 0, 7])
    users, ends = np.array([0, 1, 1, 3, 4, 5]), np.array([3, 30, 5, 1, 0, 4])
    expected = seq.windows(users, ends, 10)
    got = SequenceTensors.from_sequences(seq).windows(torch.as_tensor(users), torch.as_tensor(ends), 10)
    np.testing.assert_array_equal(got.numpy(), expected)


def test_masks_never_touch_padding_and_every_sample_predicts_something():
    settings = ClozeSettings(window=16, mask_index=MASK, mask_prob=0.3, last_item_rate=0.2)
    batch = _batch(_seq([3, 30, 12, 1]), settings, np.arange(4))
    masked = batch.tokens == MASK
    assert not (masked & (batch.items == PAD_INDEX)).any()  # padding is never masked
    assert masked.any(1).all()
    assert batch.tokens.shape == (4, 16) and (batch.items[3, :-1] == PAD_INDEX).all()  # 1 item: 15 padding
    # the kept slots are exactly the masked positions, with the original items as targets
    kept = batch.kept
    assert int(kept.sum()) == int(masked.sum())
    assert masked[batch.rows[kept], batch.cols[kept]].all()
    assert torch.equal(batch.targets[kept], batch.items[batch.rows[kept], batch.cols[kept]])
    assert batch.weight == pytest.approx(1 / int(masked.sum()))


def test_last_item_samples_mask_only_the_last_item():
    settings = ClozeSettings(window=20, mask_index=MASK, mask_prob=0.2, last_item_rate=1.0)
    batch = _batch(_seq([20] * 64), settings, np.arange(64), seed=1)
    assert (batch.tokens[:, :-1] != MASK).all() and (batch.tokens[:, -1] == MASK).all()


def test_a_batch_over_capacity_keeps_the_first_positions_and_counts_them_all():
    settings = ClozeSettings(window=20, mask_index=MASK, mask_prob=0.5, last_item_rate=0.0)
    batch = _batch(_seq([20] * 8), settings, np.arange(8), capacity=10)
    masked = int((batch.tokens == MASK).sum())
    assert masked > 10 and batch.kept.all() and len(batch.targets) == 10
    assert batch.weight == pytest.approx(1 / masked)  # the loss stays a mean over the batch's positions


def test_capacity_leaves_room_for_every_masked_position_of_typical_batches():
    lengths = np.random.default_rng(0).integers(3, 300, 2000)
    settings = ClozeSettings(window=100, mask_index=MASK, mask_prob=0.4, last_item_rate=0.15)
    seq = _seq(list(lengths))
    capacity = masked_capacity(lengths, settings, rows=128)
    epochs = WindowEpochs(seq, settings, batch_size=128, samples_per_user=2, seed=0)
    batches = list(epochs)
    assert len(batches) == len(epochs) == -(-4000 // 128)
    masked = [int((b.tokens == MASK).sum()) for b in batches]
    assert max(masked) <= capacity < 1.35 * np.mean(masked)  # room for all, and not much more


def test_with_a_capacity_every_batch_has_the_same_shapes_and_the_same_positions():
    settings = ClozeSettings(window=16, mask_index=MASK, mask_prob=0.3, last_item_rate=0.2)
    seq, users = _seq([3, 30, 12, 1, 16, 9]), np.arange(6)
    exact = _batch(seq, settings, users)
    bounded = _batch(seq, settings, users, capacity=40)
    assert bounded.targets.shape == (40,) and len(exact.targets) < 40  # fixed shapes, for a GPU that never waits
    kept = bounded.kept
    assert torch.equal(bounded.rows[kept], exact.rows) and torch.equal(bounded.targets[kept], exact.targets)


@pytest.mark.parametrize(
    "settings",
    [
        ClozeSettings(window=12, mask_index=MASK, mask_prob=0.3, last_item_rate=0.1),
        NextItemSettings(window=12, input_mask=0.3, mask_index=MASK),  # its masks drawn before the split too
    ],
)
def test_ranks_see_disjoint_samples_that_together_are_the_single_process_batch(settings):
    seq, users = _seq([5, 9, 12, 30, 2, 8, 14]), np.arange(7)
    whole = _batch(seq, settings, users)
    parts = [_batch(seq, settings, users, rank=r, world=2) for r in range(2)]
    torch.testing.assert_close(
        torch.cat([parts[0].tokens, parts[1].tokens]), torch.cat([whole.tokens[0::2], whole.tokens[1::2]])
    )
    assert parts[0].tokens.shape[0] == 4 and parts[1].tokens.shape[0] == 3
    assert sum(int(p.kept.sum()) for p in parts) == int(whole.kept.sum())
    assert parts[0].weight == pytest.approx(2 * whole.weight.item())  # DDP's mean of ranks is the whole mean


def test_epochs_are_reproducible_and_differ_from_each_other():
    settings = ClozeSettings(window=12, mask_index=MASK, mask_prob=0.3, last_item_rate=0.1)
    seq = _seq([5, 9, 12, 30, 2, 8, 14] * 5)
    a, b = WindowEpochs(seq, settings, 16, 2, seed=3), WindowEpochs(seq, settings, 16, 2, seed=3)
    first = [x.tokens for x in a]
    assert all(torch.equal(x, y.tokens) for x, y in zip(first, b))
    a.set_epoch(1)
    assert not all(torch.equal(x, y.tokens) for x, y in zip(first, a))
    a.set_epoch(0)
    assert all(torch.equal(x, y.tokens) for x, y in zip(first, a))  # a resumed epoch draws the same


def test_users_without_history_are_never_drawn():
    settings = ClozeSettings(window=8, mask_index=MASK, mask_prob=0.3, last_item_rate=0.1)
    epochs = WindowEpochs(_seq([0, 4, 0, 6]), settings, batch_size=3, samples_per_user=3, seed=0)
    assert sorted(epochs.users.tolist()) == [1, 1, 1, 3, 3, 3]


def test_row_contains_answers_per_row_and_for_a_shared_pool():
    items = torch.tensor([[0, 4, 2, 9], [7, 7, 1, 0]])
    assert row_contains(items, torch.tensor([[2, 3], [7, 9]])).tolist() == [[True, False], [True, False]]
    assert row_contains(items, torch.tensor([9, 1, 5])).tolist() == [[True, False, False], [False, True, False]]


def test_next_item_samples_predict_the_following_item_at_every_real_position():
    seq = Sequences(items=np.arange(1, 21), offsets=np.array([0, 3, 20]))  # users of 3 and 17 items
    batch = _batch(seq, NextItemSettings(window=8), np.array([0, 1]))
    assert batch.tokens.shape == (2, 7)
    kept = batch.kept
    rows, cols, targets = batch.rows[kept], batch.cols[kept], batch.targets[kept]
    assert torch.equal(targets, batch.items[rows, cols + 1])  # the next item of the window
    assert (batch.tokens[rows, cols] != PAD_INDEX).all()  # never from an empty prefix
    assert int((rows == 0).sum()) == 2 and int((rows == 1).sum()) == 7  # 3 items: 2 steps; a full window: 7
    assert batch.weight == pytest.approx(1 / 9)


def test_next_item_capacity_is_exact_for_equal_lengths():
    from recserve.train.batches import next_item_capacity

    lengths = np.full(100, 50)
    assert next_item_capacity(lengths, NextItemSettings(window=20), rows=16) == 16 * 19  # every position, no more
