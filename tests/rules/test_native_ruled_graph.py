"""The native graph's ``ruled`` method as a CPU export traces it (the rules' work over batch x catalogue left
out where the batch does not need it) answers what the one-graph-for-every-batch form answers (a GPU's)."""

import numpy as np
import pytest
import torch

from recserve.bench.synthetic import make_random_run
from recserve.export.graph import build_graph, example_rules, load_spec
from recserve.export.native_export import example
from recserve.export.torchscript import trace_frozen
from recserve.models.serving_graph import NativeGraph

ITEMS, MAX_K = 300, 20


@pytest.fixture(scope="module")
def graphs(tmp_path_factory):
    run = make_random_run(tmp_path_factory.mktemp("run") / "run", num_items=ITEMS, hidden=32, layers=1, heads=2)
    spec = load_spec(run)
    graph = build_graph(run, spec, MAX_K)
    inputs = example(4, spec.window - 1, spec)
    rules = tuple(torch.from_numpy(a) for a in example_rules(ITEMS, 4, np.random.default_rng(0)))
    host = trace_frozen(NativeGraph(graph, dynamic_k=True), {"forward": inputs, "ruled": inputs + rules})
    return host, NativeGraph(graph, dynamic_k=False).eval(), spec


@pytest.mark.parametrize("lists", ["none", "some", "every"])
@pytest.mark.parametrize("empty_history", [False, True])
def test_the_host_graph_under_rules_answers_as_the_device_graph(graphs, lists, empty_history):
    host, device, spec = graphs
    rng = np.random.default_rng([("none", "some", "every").index(lists), empty_history])  # the same every run
    batch = 6
    ids, k, exclude = example(batch, spec.window - 1, spec, seed=int(rng.integers(1000)))
    if empty_history:
        ids[1] = -1  # only padding: this row is answered by popularity under its rules
    masks, mask_of_row, excluded, included = example_rules(ITEMS, batch, rng)
    included[:] = {"none": 0, "some": included, "every": rng.integers(1, ITEMS + 1, included.shape)}[lists]
    rules = tuple(torch.from_numpy(a) for a in (masks, mask_of_row, excluded, included))
    with torch.inference_mode():
        got_ids, got_scores, _ = host.ruled(ids, k, exclude, *rules)
        want_ids, want_scores, _ = device.ruled(ids, k, exclude, *rules)
    width = got_ids.shape[1]  # the host graph answers the batch's largest k wide, the device graph max_k
    np.testing.assert_array_equal(got_ids.numpy(), want_ids[:, :width].numpy())
    np.testing.assert_allclose(got_scores.numpy(), want_scores[:, :width].numpy(), rtol=1e-6)
    allowed = masks[mask_of_row]
    for row in range(batch):
        held = got_ids[row][got_ids[row] >= 0].numpy()
        assert allowed[row, np.searchsorted(spec.vocab_ids, held) + 1].all()  # vocabulary index = position + 1
        if included[row, 0]:
            assert set((np.searchsorted(spec.vocab_ids, held) + 1).tolist()) <= set(included[row].tolist())
