"""The gate's ranking: a run on its own data ranks as `recserve evaluate` does; a run on another catalogue is
ranked by item ID, the items it lacks never recommended (a target it lacks is a miss)."""

import numpy as np
import pytest

from recserve.data.datasets import load_prepared
from recserve.errors import ConfigError, DataError
from recserve.train.comparison import evaluate_on, gate, index_map
from recserve.train.leave_one_out import evaluate_run


def test_index_map_finds_each_item_by_id_and_leaves_the_missing_at_padding():
    mapped = index_map(np.array([10, 20, 40]), np.array([10, 30, 40, 50]))
    assert mapped.tolist() == [0, 1, 0, 3, 0, 4]  # padding, 10 -> 1, 30 absent, 40 -> 3, 50 absent, the mask
    with pytest.raises(DataError, match="different types"):
        index_map(np.array(["a", "b"]), np.array([1, 2]))


def test_a_run_on_its_own_data_ranks_as_evaluate_does(tiny_run, ml100k_dir):
    ours = evaluate_on(tiny_run, load_prepared(ml100k_dir))
    assert ours["full"] == pytest.approx(evaluate_run(tiny_run, ml100k_dir)["test"]["full"])
    assert ours["known_targets"] == 1.0


def test_on_another_catalogue_the_run_reads_its_own_items_and_scores_the_missing_below_every_other():
    import torch

    from recserve.train.comparison import UNKNOWN_SCORE, scores_by_id

    fed = []

    def model(tokens):  # a run of 3 items (indices 1-3, mask 4): item i scores 10 * i
        fed.append(tokens)
        return torch.tensor([[0.0, 10.0, 20.0, 30.0, 0.0]]).expand(len(tokens), -1)

    mapped = index_map(np.array([10, 20, 40]), np.array([10, 30, 40, 50]))  # data items 1-4, mask 5
    scores = scores_by_id(model, mapped)(torch.tensor([[1, 3, 2, 5]]))
    assert fed[0].tolist() == [[1, 3, 0, 4]]  # 10 -> 1, 40 -> 3, 30 unknown -> padding, the mask -> the run's
    assert scores[0].tolist() == pytest.approx([UNKNOWN_SCORE, 10.0, UNKNOWN_SCORE, 30.0, UNKNOWN_SCORE, UNKNOWN_SCORE])


def test_a_tolerance_outside_zero_to_one_and_a_bag_model_are_refused(tiny_run, vae_run, ml100k_dir):
    with pytest.raises(ConfigError, match="tolerance 1.5"):
        gate(tiny_run, tiny_run, ml100k_dir, 1.5)
    with pytest.raises(ConfigError, match="--no-gate"):
        evaluate_on(vae_run, load_prepared(ml100k_dir))
