"""The native graph's ``ruled`` method in its two forms answers alike: as a CPU export traces it (the rules'
work over batch x catalogue left out where the batch does not need it), and as one graph for every batch (a
GPU's replays: the rules in the output layer's bias, the lists to keep to after the top k), eager and traced."""

import numpy as np
import pytest
import torch

from recserve.bench.synthetic import make_random_run
from recserve.export.graph import build_graph, example_rules, load_spec
from recserve.export.native_export import example
from recserve.export.torchscript import trace_frozen
from recserve.models.serving_graph import NativeGraph

MAX_K = 20


@pytest.fixture(scope="module", params=["bert4rec", "sasrec", "multvae"])
def graphs(request, tmp_path_factory):
    """The host form traced, the device form eager and traced, and the spec, of one encoder."""
    if request.param == "multvae":  # no output-layer bias: its device form takes the rules' masks as selects
        run = request.getfixturevalue("vae_run")
    else:
        run = make_random_run(
            tmp_path_factory.mktemp("run") / "run", num_items=300, hidden=32, layers=1, heads=2, model=request.param
        )
    spec = load_spec(run)
    graph = build_graph(run, spec, MAX_K)
    encoder = graph.head.encoder
    if hasattr(encoder, "out_bias"):  # a random run's is zero: a device form that dropped it would pass
        with torch.no_grad():
            encoder.out_bias.copy_(torch.randn(encoder.out_bias.shape, generator=torch.Generator().manual_seed(0)))
    items = len(spec.vocab_ids)
    inputs = example(4, spec.window - 1, spec)
    rules = tuple(torch.from_numpy(a) for a in example_rules(items, 4, np.random.default_rng(0)))
    methods = {"forward": inputs, "ruled": inputs + rules}
    host = trace_frozen(NativeGraph(graph, dynamic_k=True), methods)
    device = NativeGraph(graph, dynamic_k=False).eval()
    return host, device, trace_frozen(NativeGraph(graph, dynamic_k=False), methods), spec


def assert_same_answers(got_ids, got_scores, want_ids, want_scores):
    """The same scores, and the same items at each score: items of equal score (Mult-VAE's rows without a
    known item are ranked by popularity counts, which tie) may come in either order, and where such a tie
    reaches past the answer's width, either may be cut."""
    got_scores, want_scores = got_scores.numpy(), want_scores.numpy()
    np.testing.assert_allclose(got_scores, want_scores, rtol=1e-6)
    for row in range(len(got_scores)):
        for score in set(got_scores[row][got_scores[row] > got_scores[row, -1]].tolist()):
            assert set(got_ids[row][got_scores[row] == score].tolist()) == set(
                want_ids[row][want_scores[row] == score].tolist()
            ), (row, score)
        tail = got_scores[row] == got_scores[row, -1]  # the last score's items: a tie may be cut
        if not np.isfinite(got_scores[row, -1]):
            np.testing.assert_array_equal(got_ids[row][tail].numpy(), want_ids[row][tail].numpy())  # padding


@pytest.mark.parametrize("lists", ["none", "some", "every"])
@pytest.mark.parametrize("empty_history", [False, True])
def test_the_host_graph_under_rules_answers_as_the_device_graph(graphs, lists, empty_history):
    host, device, _, spec = graphs
    items = len(spec.vocab_ids)
    rng = np.random.default_rng([("none", "some", "every").index(lists), empty_history])  # the same every run
    batch = 6
    ids, k, exclude = example(batch, spec.window - 1, spec, seed=int(rng.integers(1000)))
    if empty_history:
        ids[1] = -1  # only padding: this row is answered by popularity under its rules
    masks, mask_of_row, excluded, included = example_rules(items, batch, rng)
    included[:] = {"none": 0, "some": included, "every": rng.integers(1, items + 1, included.shape)}[lists]
    rules = tuple(torch.from_numpy(a) for a in (masks, mask_of_row, excluded, included))
    with torch.inference_mode():
        got_ids, got_scores, _ = host.ruled(ids, k, exclude, *rules)
        want_ids, want_scores, _ = device.ruled(ids, k, exclude, *rules)
    width = got_ids.shape[1]  # the host graph answers the batch's largest k wide, the device graph max_k
    assert_same_answers(got_ids, got_scores, want_ids[:, :width], want_scores[:, :width])
    allowed = masks[mask_of_row]
    for row in range(batch):
        held = got_ids[row][got_ids[row] >= 0].numpy()
        assert allowed[row, np.searchsorted(spec.vocab_ids, held) + 1].all()  # vocabulary index = position + 1
        if included[row, 0]:
            assert set((np.searchsorted(spec.vocab_ids, held) + 1).tolist()) <= set(included[row].tolist())


def test_the_traced_device_graph_takes_other_banks_and_list_widths_than_it_was_traced_with(graphs):
    """A repository's bank holds as many masks as it stores rules (the trace saw three), and a batch's lists
    are as wide as recserve's backend makes them: the traced graph must keep none of them a constant."""
    _, device, traced, spec = graphs
    items, batch = len(spec.vocab_ids), 7
    rng = np.random.default_rng(5)
    ids, k, exclude = example(batch, spec.window - 1, spec, seed=3)
    ids[2] = -1  # a row answered by popularity
    masks = rng.random((5, items + 2)) < 0.7
    masks[:, [0, items + 1]] = False
    mask_of_row = rng.integers(0, 5, batch)
    excluded = rng.integers(0, items + 1, (batch, 3))
    included = rng.integers(1, items + 1, (batch, 7))
    included[[0, 2, 4]] = 0
    included[5, 1] = included[5, 0]  # listed twice: answered once
    rules = tuple(torch.from_numpy(np.asarray(a)) for a in (masks, mask_of_row, excluded, included))
    with torch.inference_mode():
        got_ids, got_scores, _ = traced.ruled(ids, k, exclude, *rules)
        want_ids, want_scores, _ = device.ruled(ids, k, exclude, *rules)
    assert_same_answers(got_ids, got_scores, want_ids, want_scores)
    held = got_ids[5][got_ids[5] >= 0].numpy()
    assert len(held) == len(set(held.tolist())) and 0 < len(held) <= 6
