"""Where the ranking's kernels need more shared memory than the GPU has (an A100's, an A10G's), each tally runs
again lighter: first the count's loads one tile at a time, then the next precision from the start (the target's
score and the count from the same one), until none is left. The steps themselves, without a GPU (the kernels'
own runs are tests/gpu/test_ranking_gpu.py's)."""

import pytest

from recserve.train.rank_kernels import PRECISIONS, TileScores


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setattr(TileScores, "precision", None)
    monkeypatch.setattr(TileScores, "count_stages", None)


def states():
    return TileScores.precision, TileScores.count_stages


def test_a_count_that_does_not_fit_first_goes_one_stage_deep_then_to_each_next_precision(fresh):
    TileScores.precision, TileScores.count_stages = "split", 2  # as an H100 left them
    steps = []
    while TileScores.lighter():
        steps.append(states())
    assert steps == [("split", 1), ("tf32x3", None), ("tf32x3", 1), ("ieee", None), ("ieee", 1)]
    assert states() == ("ieee", 1)  # nothing lighter is left: the tally raises the GPU's error


def test_kernels_that_never_launched_begin_again_at_the_first_precision(fresh):
    TileScores.count_stages = 1  # the pair kernel failed under every precision before any was chosen
    assert TileScores.lighter() and states() == (PRECISIONS[0], None)
