"""Ranking on the device: each protocol against a plain-loop reference with planted ties (a tie counts against
the target), non-finite scores refused, per-user sampled negatives, and bounded batches."""

import numpy as np
import pytest
import torch

import recserve.train.leave_one_out as evaluate
from recserve.constants import PAD_INDEX
from recserve.data.sequences import Sequences
from recserve.errors import DataError, EvaluationError
from recserve.train.leave_one_out import SAMPLED_NEGATIVES, Ranker, eval_batch_size, negatives_summary

N = 300
MASK = N + 1
CATALOGUE = set(range(1, N + 1))


def _data(users=40, seed=0):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 60, users)
    items = rng.integers(1, N + 1, lengths.sum())
    inputs = Sequences(items, np.concatenate([[0], np.cumsum(lengths)]))
    targets = rng.integers(1, N + 1, users)
    targets[0] = items[0]  # a target the user has seen before stays rankable
    return inputs, targets, rng.integers(0, 50, N + 2)


def _scores(tokens: torch.Tensor) -> torch.Tensor:
    """A deterministic scorer that depends on the history and ties often: sin(i * (1 + last item / 7)) for
    item i, rounded to one decimal (about 20 distinct values over 302 items)."""
    last = tokens[:, -2].double()[:, None]
    return (torch.sin(torch.arange(N + 2, dtype=torch.float64) * (1 + last / 7)) * 10).round().float() / 10


def _reference_rank(scores: np.ndarray, target: int, rankable: set[int]) -> int:
    """A plain loop: the items other than the target that may be ranked and score at least as high."""
    return sum(1 for item in rankable if item != target and scores[item] >= scores[target])


def _history(inputs, u: int) -> np.ndarray:
    return inputs.items[inputs.offsets[u] : inputs.offsets[u + 1]]


def _user_scores(inputs, u: int) -> np.ndarray:
    window = np.concatenate([np.zeros(9, np.int64), _history(inputs, u)])[-9:]
    return _scores(torch.as_tensor(np.concatenate([window, [MASK]]))[None])[0].numpy()


def _spied_draws(monkeypatch) -> list:
    """Records what ``draw_negatives`` returns (sampled first, then sampled_uniform, per batch)."""
    draws, drawer = [], evaluate.draw_negatives
    monkeypatch.setattr(evaluate, "draw_negatives", lambda *a: draws.append(drawer(*a)) or draws[-1])
    return draws


def test_every_protocol_matches_a_plain_loop_with_ties_counted_against_the_target(monkeypatch):
    inputs, targets, popularity = _data()
    draws = _spied_draws(monkeypatch)
    ranks = Ranker(inputs, targets, popularity, window=10, mask_index=MASK).ranks(_scores)
    ties = 0
    for u in range(inputs.num_users):
        scores, target = _user_scores(inputs, u), int(targets[u])
        ties += sum(scores[i] == scores[target] for i in CATALOGUE) - 1
        assert ranks["full_no_exclusion"][u] == _reference_rank(scores, target, CATALOGUE)
        unseen = (CATALOGUE - set(_history(inputs, u).tolist())) | {target}  # the whole history, not the window
        assert ranks["full"][u] == _reference_rank(scores, target, unseen)
        for name, (negatives, valid) in zip(("sampled", "sampled_uniform"), draws):
            drawn = set(negatives[u][valid[u]].tolist())
            assert ranks[name][u] == _reference_rank(scores, target, drawn | {target})
    assert ties > 10 * inputs.num_users  # the planted ties are there to be counted


def test_a_constant_scorer_ranks_every_target_last():
    inputs, targets, popularity = _data()
    ranks = Ranker(inputs, targets, popularity, window=10, mask_index=MASK).ranks(
        lambda tokens: torch.zeros(tokens.shape[0], N + 2)
    )
    unseen = [len((CATALOGUE - set(_history(inputs, u).tolist())) | {int(targets[u])}) for u in range(40)]
    np.testing.assert_array_equal(ranks["full_no_exclusion"], N - 1)
    np.testing.assert_array_equal(ranks["full"], np.array(unseen) - 1)
    np.testing.assert_array_equal(ranks["sampled"], SAMPLED_NEGATIVES)
    np.testing.assert_array_equal(ranks["sampled_uniform"], SAMPLED_NEGATIVES)


def test_nan_or_infinite_scores_are_refused_with_the_count_of_users():
    inputs, targets, popularity = _data(users=7)
    ranker = Ranker(inputs, targets, popularity, window=10, mask_index=MASK)

    def broken(tokens):
        scores = _scores(tokens)
        scores[1::3, 5] = float("nan")  # users 1 and 4
        scores[2, 7] = float("inf")  # user 2
        return scores

    with pytest.raises(EvaluationError, match="3 of 7 users got a NaN or infinite score"):
        ranker.ranks(broken)
    specials = torch.tensor([PAD_INDEX, MASK])
    ranker.ranks(lambda t: _scores(t).index_fill(1, specials, float("nan")))  # never ranked: no matter


def test_sampled_protocols_rank_within_their_draws_and_a_seed_repeats_them():
    inputs, targets, popularity = _data()
    ranks = Ranker(inputs, targets, popularity, window=10, mask_index=MASK, seed=5).ranks(_scores)
    for name in ("sampled", "sampled_uniform"):
        assert ranks[name].max() <= SAMPLED_NEGATIVES
        assert (ranks[name] <= ranks["full"]).all()  # a subset of the unseen items ranks the target no lower
    again = Ranker(inputs, targets, popularity, window=10, mask_index=MASK, seed=5).ranks(_scores)
    assert all(np.array_equal(ranks[k], again[k]) for k in ranks)  # a fixed seed draws the same negatives


def test_each_user_gets_100_unseen_negatives_or_all_they_have(monkeypatch):
    """A user who has seen all but 40 items gets the 39 beside the target; the others get exactly 100 each,
    never a seen item, the target or a special token, never one twice; the summary says so."""
    inputs, targets, popularity = _data(users=4)
    rich = np.arange(1, N - 39)  # user 3 has seen items 1..260: 40 unseen, the target among them
    offsets = np.r_[inputs.offsets[:4], inputs.offsets[3] + len(rich)]
    inputs = Sequences(np.concatenate([inputs.items[: inputs.offsets[3]], rich]), offsets)
    targets[3] = N
    draws = _spied_draws(monkeypatch)
    ranker = Ranker(inputs, targets, popularity, window=10, mask_index=MASK)
    ranker.ranks(_scores, ("sampled", "sampled_uniform"))
    assert len(draws) == 2
    for negatives, valid in draws:
        for u in range(4):
            chosen = negatives[u][valid[u]].tolist()
            forbidden = set(_history(inputs, u).tolist()) | {int(targets[u]), PAD_INDEX, MASK}
            assert not forbidden & set(chosen) and len(set(chosen)) == len(chosen)
            assert len(chosen) == (39 if u == 3 else SAMPLED_NEGATIVES)
    expected = {"requested": SAMPLED_NEGATIVES, "mean": (3 * 100 + 39) / 4, "min": 39, "users_below_requested": 1}
    assert negatives_summary(ranker) == {"sampled": expected, "sampled_uniform": expected}


def test_popularity_negatives_follow_popularity_and_uniform_ones_do_not(monkeypatch):
    """Over many users with one-item histories, how often an item is drawn follows its count under
    ``sampled`` (rank correlation near 1) and not under ``sampled_uniform`` (near 0)."""
    from scipy.stats import spearmanr

    rng = np.random.default_rng(1)
    users = 300
    inputs = Sequences(rng.integers(1, N + 1, users), np.arange(users + 1))
    popularity = np.r_[0, rng.permutation(N) * 3, 0]  # distinct counts 0..897, shuffled over the items
    draws = _spied_draws(monkeypatch)
    Ranker(inputs, rng.integers(1, N + 1, users), popularity, window=10, mask_index=MASK).ranks(
        _scores, ("sampled", "sampled_uniform")
    )
    frequencies = [np.bincount(n[v].numpy(), minlength=N + 2)[1 : N + 1] for n, v in draws]
    by_popularity, uniform = (spearmanr(f, popularity[1 : N + 1]).statistic for f in frequencies)
    assert by_popularity > 0.9 and abs(uniform) < 0.2


def test_shares_of_the_users_rank_each_user_as_the_whole_run_does():
    inputs, targets, popularity = _data(users=41)
    ranker = Ranker(inputs, targets, popularity, window=10, mask_index=MASK)
    whole = ranker.ranks(_scores, ("full", "full_no_exclusion"))
    shares = [ranker.ranks(_scores, ("full", "full_no_exclusion"), (a, b)) for a, b in ((0, 13), (13, 41))]
    for name in whole:
        np.testing.assert_array_equal(np.concatenate([share[name] for share in shares]), whole[name])
    assert len(ranker.ranks(_scores, ("full",), (20, 20))["full"]) == 0


def test_batches_hold_a_bounded_number_of_scores():
    assert eval_batch_size(1_684) == 4096
    assert eval_batch_size(1_000_002) == 33  # 33 users x 1M items x 4 bytes: 132 MB
    assert eval_batch_size(1_000_002, "cuda") == 536  # a GPU takes 2 GB a batch
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


def test_served_excludes_only_the_window_and_misses_a_target_inside_it():
    """``served`` ranks as the serving graph answers: the window's items (the 9 most recent here) are left
    out, older history items compete, and a target inside the window can never be shown."""
    inputs, targets, popularity = _data()
    targets[1] = _history(inputs, 1)[-1]  # the most recent item again: inside the window
    ranks = Ranker(inputs, targets, popularity, window=10, mask_index=MASK).ranks(_scores, ("served", "full"))
    missed = 0
    for u in range(inputs.num_users):
        scores, target, window = _user_scores(inputs, u), int(targets[u]), set(_history(inputs, u)[-9:].tolist())
        if target in window:
            assert ranks["served"][u] == evaluate.UNRANKABLE
            missed += 1
        else:
            assert ranks["served"][u] == _reference_rank(scores, target, CATALOGUE - window)
    assert missed >= 1 and (ranks["served"] != ranks["full"]).sum() > 5  # the two protocols do differ


def test_a_batch_size_never_moves_a_figure(monkeypatch):
    """Each user's negatives come from a stream of its own: batches of 7 users rank every protocol exactly as
    one batch of all 40 (and as a DDP share starting elsewhere)."""
    inputs, targets, popularity = _data()
    ranker = Ranker(inputs, targets, popularity, window=10, mask_index=MASK, seed=3)
    whole = ranker.ranks(_scores)
    monkeypatch.setitem(evaluate.SCORES_PER_BATCH, "cpu", 7 * (N + 2))
    batched = ranker.ranks(_scores)
    share = ranker.ranks(_scores, users=(11, 40))
    for name in evaluate.PROTOCOLS:
        np.testing.assert_array_equal(batched[name], whole[name])
        np.testing.assert_array_equal(share[name], whole[name][11:])
    other_seed = Ranker(inputs, targets, popularity, window=10, mask_index=MASK, seed=4).ranks(_scores)
    assert not np.array_equal(other_seed["sampled"], whole["sampled"])  # the seed does move the draws


def test_minus_infinity_for_a_rankable_item_is_refused_like_nan():
    inputs, targets, popularity = _data(users=5)
    ranker = Ranker(inputs, targets, popularity, window=10, mask_index=MASK)

    def broken(tokens):
        scores = _scores(tokens)
        scores[3, N] = -float("inf")  # the last real item, beside the mask token's column
        return scores

    with pytest.raises(EvaluationError, match="1 of 5 users got a NaN or infinite score"):
        ranker.ranks(broken)


def test_repeated_targets_are_counted_in_the_history_and_in_the_served_window():
    inputs = Sequences(np.array([1, 2, 3, 4, 5, 6, 7, 8, 9, 9, 10]), np.array([0, 5, 8, 11]))
    counts = evaluate.repeated_targets(inputs, np.array([1, 8, 4]), window=3)
    # user 0: item 1 long ago (outside the 2-item window); user 1: item 8 just before; user 2: never
    assert counts == {"users": 3, "earlier_in_history": 2, "in_served_window": 1}


def test_a_user_short_of_negatives_ranks_among_the_ones_drawn_alone():
    """A user who has seen all but 40 items has 39 negatives: a constant scorer ranks the target behind
    those 39 (ties count against it), never behind the empty slots of the 100."""
    inputs, targets, popularity = _data(users=4)
    rich = np.arange(1, N - 39)
    offsets = np.r_[inputs.offsets[:4], inputs.offsets[3] + len(rich)]
    inputs = Sequences(np.concatenate([inputs.items[: inputs.offsets[3]], rich]), offsets)
    targets[3] = N
    ranks = Ranker(inputs, targets, popularity, window=10, mask_index=MASK).ranks(
        lambda tokens: torch.zeros(tokens.shape[0], N + 2), ("sampled", "sampled_uniform")
    )
    for name in ("sampled", "sampled_uniform"):
        np.testing.assert_array_equal(ranks[name], [SAMPLED_NEGATIVES] * 3 + [39])


def test_a_transformer_ranks_with_its_bias_kept_apart_exactly_as_with_its_scores():
    """A SASRec is ranked from its query's product with the item table and its bias, added only where read
    (``batch_scores``' dense scores): every protocol gives the ranks of its whole scores (``forward``), with a
    bias large enough to move them, and ties planted by giving items the same vectors."""
    from recserve.models import SASRec, SASRecConfig

    inputs, targets, popularity = _data()
    torch.manual_seed(0)
    model = SASRec(SASRecConfig(num_items=N, window=10, hidden=16, dropout=0.0)).eval()
    with torch.no_grad():
        model.out_bias.normal_(0, 0.5)
        model.item_emb.weight[1:N:3] = model.item_emb.weight[2 : N + 1 : 3]  # pairs that tie without their bias
        model.out_bias[1:N:3] = model.out_bias[2 : N + 1 : 3]  # and with it: both paths must count the ties
    ranker = Ranker(inputs, targets, popularity, window=10, mask_index=MASK, seed=1)
    with torch.no_grad():
        apart = ranker.ranks(model)
        whole = ranker.ranks(lambda tokens: model(tokens))
    for name in evaluate.PROTOCOLS:
        np.testing.assert_array_equal(apart[name], whole[name])
    assert len(set(apart["full"].tolist())) > 20  # the ranks are spread, not all alike
    without_bias = ranker.ranks(lambda tokens: model(tokens) - model.out_bias)
    assert not np.array_equal(without_bias["full"], apart["full"])  # the bias does move them


def test_the_ranking_kernels_take_only_a_table_their_offsets_reach(monkeypatch):
    """Where the kernels could run (a GPU with Triton, stood in for here), a transformer whose item table holds
    2^31 values or more is ranked from dense scores instead: the kernels' offsets are 32-bit."""
    import dataclasses

    import recserve.train.leave_one_out as leave_one_out
    from recserve.models import SASRec, SASRecConfig

    model = SASRec(SASRecConfig(num_items=100, window=5, hidden=64))
    monkeypatch.setattr(leave_one_out, "available", lambda device: True)
    assert leave_one_out.counts_tiled(model, torch.device("cuda"))
    model.cfg = dataclasses.replace(model.cfg, num_items=2**31 // 64)
    assert not leave_one_out.counts_tiled(model, torch.device("cuda"))
    assert not leave_one_out.counts_tiled(lambda tokens: tokens, torch.device("cuda"))  # no transformer
