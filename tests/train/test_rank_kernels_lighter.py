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


def test_a_setting_reads_back_as_written_and_a_bad_one_changes_nothing(monkeypatch):
    """The kernels' setting as the benchmarks take it: four fields keep the programs a multiprocessor, five set
    them, and anything else is refused before any field is taken."""
    import recserve.train.rank_kernels as kernels

    for name in kernels.SETTING:
        monkeypatch.setattr(kernels, name, getattr(kernels, name))
    kernels.use_setting("64/32/4/3/8")
    assert kernels.setting() == "64/32/4/3/8"
    kernels.use_setting("128/64/8/2")
    assert kernels.setting() == "128/64/8/2/8"
    for bad in ("", "1/2", "128/64/8/2/16/1", "128/0/8/2", "128/-64/8/2", "a/b/c/d", "128/64/8/2.5"):
        with pytest.raises(ValueError, match="expected BLOCK/BLOCK_K/warps/stages"):
            kernels.use_setting(bad)
        assert kernels.setting() == "128/64/8/2/8"
