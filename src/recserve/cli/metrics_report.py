"""The test split's report that ``recserve evaluate`` and ``recserve train`` (which evaluates after training)
print and save: every protocol's headline metrics beside popularity, the cold targets and the new items."""

from __future__ import annotations

from pathlib import Path

from recserve.cli.console import console


def show_and_save(run: Path, data: Path, seed: int, device: str) -> dict:
    from rich.table import Table

    from recserve.artifacts.run_metrics import merge_metrics
    from recserve.models.run_loader import model_name
    from recserve.train.run_evaluation import evaluate_test, split_of

    model, split = model_name(run), split_of(run)
    with console.status("ranking the test split"):
        result = evaluate_test(run, data, seed=seed, device=device)
    merge_metrics(run, result, replaces=("test_validated",))
    cut = result.get("split")
    described = split.description
    if isinstance(cut, dict) and cut.get("kind") == "time":
        described = f"by time: each user's first event after {cut['test_after']:.15g}"
    table = Table(title=f"test split ({described}); all metrics in metrics.json")
    table.add_column("model")
    table.add_column("protocol")
    keys = split.headline
    for key in keys:
        table.add_column(key, justify="right")
    for who in ("test", "popularity"):
        for protocol, metrics in result[who].items():
            name = model if who == "test" else "popularity"
            table.add_row(name, protocol, *(f"{metrics[k]:.4f}" for k in keys))
    console.print(table)
    console.print(split.protocols)
    validated = result.get("test_validated")
    if validated:
        refitted, chosen = result["test"]["full"]["ndcg@10"], validated["full"]["ndcg@10"]
        console.print(
            f"refit: full ndcg@10 {refitted:.4f}, against {chosen:.4f} with the weights validation chose "
            f"(x{refitted / chosen if chosen else float('nan'):.3f}; metrics.json: test_validated)"
        )
    cold = result.get("cold_targets")
    if cold and cold["users"]:
        apart = result["test_apart"]["model"]
        warm_ndcg = apart.get("warm", {}).get("full", {}).get("ndcg@10", 0.0)
        console.print(
            f"{cold['users']:,} of {result['test_users']:,} test targets are cold (no event before the test "
            f"holds them): full ndcg@10 {apart['cold']['full']['ndcg@10']:.4f} on them, {warm_ndcg:.4f} on the "
            "others (metrics.json: test_apart)"
        )
    new = result.get("new_items")
    if new:
        figures = ", ".join(
            f"{who} {new[who]['hr@10']:.4f}"
            for who in ("model", "attribute_popularity", "attribute_profile")
            if who in new
        )
        console.print(
            f"ranked among the {new['new_items']:,} new items alone, hr@10 of those targets: {figures} "
            "(metrics.json: new_items)"
        )
    return result
