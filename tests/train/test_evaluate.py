"""Ranking on the device: each protocol against a user-by-user reference, and bounded batches."""

import numpy as np
import pytest
import torch

from recserve.constants import PAD_INDEX
from recserve.data.sequences import Sequences
from recserve.errors import DataError
from recserve.train.evaluate import SAMPLED_NEGATIVES, Ranker, eval_batch_size

N = 300
MASK = N + 1


def _data(users=40, seed=0):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 60, users)
    items = rng.integers(1, N + 1, lengths.sum())
    inputs = Sequences(items, np.concatenate([[0], np.cumsum(lengths)]))
    targets = rng.integers(1, N + 1, users)
    targets[0] = items[0]  # a target the user has seen before stays rankable
    return inputs, targets, rng.integers(0, 50, N + 2)


def _scores(tokens: torch.Tensor) -> torch.Tensor:
    """A deterministic scorer that depends on the history: item i scores sin(i * (1 + last item))."""
    last = tokens[:, -2].double()[:, None]
    return torch.sin(torch.arange(N + 2, dtype=torch.float64) * (1 + last / 7)).float()


def test_full_ranks_match_a_user_by_user_reference():
    inputs, targets, popularity = _data()
    ranks = Ranker(inputs, targets, popularity, window=10, mask_index=MASK).ranks(_scores)
    for u in range(inputs.num_users):
        history = inputs.items[inputs.offsets[u] : inputs.offsets[u + 1]]
        window = np.concatenate([np.zeros(9, np.int64), history])[-9:]
        scores = _scores(torch.as_tensor(np.concatenate([window, [MASK]]))[None])[0].numpy()
        scores[[PAD_INDEX, MASK]] = -np.inf
        target = scores[targets[u]]
        assert ranks["full_no_exclusion"][u] == (scores > target).sum()
        excluded = scores.copy()
        excluded[np.setdiff1d(history, [targets[u]])] = -np.inf  # the whole history, not only the window
        assert ranks["full"][u] == (excluded > target).sum()


def test_shares_of_the_users_rank_each_user_as_the_whole_run_does():
    inputs, targets, popularity = _data(users=41)
    ranker = Ranker(inputs, targets, popularity, window=10, mask_index=MASK)
    whole = ranker.ranks(_scores, ("full", "full_no_exclusion"))
    shares = [ranker.ranks(_scores, ("full", "full_no_exclusion"), (a, b)) for a, b in ((0, 13), (13, 41))]
    for name in whole:
        np.testing.assert_array_equal(np.concatenate([share[name] for share in shares]), whole[name])
    assert len(ranker.ranks(_scores, ("full",), (20, 20))["full"]) == 0


def test_sampled_protocols_draw_unseen_negatives_and_rank_within_them():
    inputs, targets, popularity = _data()
    ranker = Ranker(inputs, targets, popularity, window=10, mask_index=MASK, seed=5)
    ranks = ranker.ranks(_scores)
    for name in ("sampled", "sampled_uniform"):
        assert ranks[name].max() <= SAMPLED_NEGATIVES
        assert (ranks[name] <= ranks["full"]).all()  # a subset of the unseen items ranks the target no lower
    again = Ranker(inputs, targets, popularity, window=10, mask_index=MASK, seed=5).ranks(_scores)
    assert all(np.array_equal(ranks[k], again[k]) for k in ranks)  # a fixed seed draws the same negatives


def test_negatives_are_never_seen_items_the_target_or_special_tokens():
    inputs, targets, popularity = _data(users=3)
    ranker = Ranker(inputs, targets, popularity, window=10, mask_index=MASK)
    drawn = []

    def spy(weights, count, replacement, generator):
        out = torch_multinomial(weights, count, replacement=replacement, generator=generator)
        drawn.append(out)
        return out

    torch_multinomial, torch.multinomial = torch.multinomial, spy
    try:
        ranker.ranks(_scores, ("sampled", "sampled_uniform"))
    finally:
        torch.multinomial = torch_multinomial
    assert len(drawn) == 2
    for negatives in drawn:
        for u in range(3):
            forbidden = set(inputs.items[inputs.offsets[u] : inputs.offsets[u + 1]].tolist())
            forbidden |= {int(targets[u]), PAD_INDEX, MASK}
            assert not forbidden & set(negatives[u].tolist())
            assert len(set(negatives[u].tolist())) == SAMPLED_NEGATIVES  # without replacement


def test_batches_hold_a_bounded_number_of_scores():
    assert eval_batch_size(1_684) == 4096
    assert eval_batch_size(1_000_002) == 33  # 33 users x 1M items x 4 bytes: 132 MB
    assert eval_batch_size(1_000_002, "cuda") == 134  # a GPU takes 512 MB a batch
    assert eval_batch_size(100_000_000) == 1
    inputs, targets, popularity = _data(users=50)
    widths = []
    Ranker(inputs, targets, popularity, window=10, mask_index=MASK).ranks(
        lambda tokens: widths.append(tokens.shape[0]) or _scores(tokens)
    )
    assert sum(widths) == 50


def test_an_unknown_protocol_is_refused():
    inputs, targets, popularity = _data(users=2)
    with pytest.raises(DataError, match="expected some of full"):
        Ranker(inputs, targets, popularity, window=10, mask_index=MASK).ranks(_scores, ("sampled_popular",))
